"""Every command block of README.md and docs/*.md is run by a named test or visibly marked as not run.

The rules (docs/development.md, "Docs that run") and the parser are in ``tests/docblocks.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from countersink.settings import setting_variables
from tests.docblocks import COMMAND_LANGUAGES, DATA_LANGUAGES, REPO, Block, all_blocks, blocks

BLOCKS = all_blocks()
HOW = ("put '<!-- tested: tests/PATH.py NAME -->' on the line before its fence and run it in that test with "
       "doc_block(PAGE, \"NAME\") (tests/docblocks.py), or put a visible line '*Not run by the tests: REASON.*' "
       "before it (docs/development.md, \"Docs that run\")")


def test_the_pages_have_blocks() -> None:
    """The parser finds the blocks (so that the checks below cannot pass on nothing)."""
    assert len(BLOCKS) > 40
    assert sum(block.language in COMMAND_LANGUAGES for block in BLOCKS) > 20


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_every_block_says_what_it_is(block: Block) -> None:
    """A block's language is a command language or a data language: with none, nobody knows whether it runs."""
    assert block.language in COMMAND_LANGUAGES | DATA_LANGUAGES, (
        f"{block.where}: the block's language {block.language!r} is neither a command language "
        f"{sorted(COMMAND_LANGUAGES)} nor output/configuration {sorted(DATA_LANGUAGES)}: tag the fence "
        "(```text for output), or add the language to one set in tests/docblocks.py")


COMMANDS = [block for block in BLOCKS if block.language in COMMAND_LANGUAGES]


@pytest.mark.parametrize("block", COMMANDS, ids=[block.where for block in COMMANDS])
def test_every_command_block_is_run_or_marked(block: Block) -> None:
    """A command block is run by the test its mark names (which asks for it by name), or says why it is not."""
    if block.not_run_reason is not None:
        return
    assert block.tested is not None, f"{block.where}: a {block.language} block neither run nor marked: {HOW}"
    path, name = block.tested
    test = REPO / path
    assert test.is_file(), f"{block.where} names {path}, which does not exist"
    assert re.search(rf"""doc_block\(\s*["']{re.escape(block.page)}["'],\s*["']{re.escape(name)}["']""",
                     test.read_text()), f"{block.where}: {path} never asks for doc_block({block.page!r}, {name!r})"


def test_data_blocks_carry_no_marks() -> None:
    """A mark before a block of output or configuration would claim a run that does not happen."""
    for block in BLOCKS:
        if block.language in DATA_LANGUAGES:
            assert block.tested is None, f"{block.where}: a {block.language} block is not a command; drop its mark"
            assert block.not_run_reason is None, f"{block.where}: a {block.language} block is not a command"


def test_an_unmarked_block_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's own check: a page gaining an unmarked sh block, or an untagged one, fails with what to do."""
    page = tmp_path / "new.md"
    page.write_text("# New\n\n```sh\ncountersink get x y\n```\n\n*Not run by the tests: an example.*\n\n"
                    "```sh\nmake thing\n```\n\n<!-- tested: tests/unit/test_doc_blocks.py new -->\n```python\n"
                    "print(1)\n```\n\n```\noutput\n```\n\n- a list\n\n    ```bash\n    rm x\n    ```\n")
    monkeypatch.setattr("tests.docblocks.REPO", tmp_path)
    found = blocks(page)
    assert [(b.language, b.tested, b.not_run_reason) for b in found] == [
        ("sh", None, None), ("sh", None, "an example."), ("python", ("tests/unit/test_doc_blocks.py", "new"), None),
        ("", None, None), ("bash", None, None)]
    with pytest.raises(AssertionError, match="neither run nor marked"):
        test_every_command_block_is_run_or_marked(found[0])
    test_every_command_block_is_run_or_marked(found[1])
    with pytest.raises(AssertionError, match="never asks for"):
        test_every_command_block_is_run_or_marked(found[2])
    with pytest.raises(AssertionError, match="tag the fence"):
        test_every_block_says_what_it_is(found[3])
    with pytest.raises(AssertionError, match="neither run nor marked"):  # indented in a list, still found
        test_every_command_block_is_run_or_marked(found[4])


ASSIGNMENT = re.compile(r"^(?:\$ )?(?:export )?(?P<name>COUNTERSINK_[A-Z0-9_]+)=", re.MULTILINE)
SETTING_BLOCKS = [block for block in COMMANDS if ASSIGNMENT.search(block.text)]


@pytest.mark.parametrize("block", SETTING_BLOCKS, ids=[block.where for block in SETTING_BLOCKS])
def test_every_variable_a_block_sets_is_a_setting(block: Block) -> None:
    """A block that sets COUNTERSINK_* variables (even one not run, e.g. docs/security.md's) sets settings:
    a misspelled one would stop every command."""
    unknown = sorted(set(ASSIGNMENT.findall(block.text)) - setting_variables())
    assert not unknown, f"{block.where} sets {unknown}, which are not settings (docs/settings.md)"


def test_the_setting_blocks_are_found() -> None:
    assert len(SETTING_BLOCKS) >= 6
