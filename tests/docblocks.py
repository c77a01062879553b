"""The fenced blocks of README.md and docs/*.md, and the two marks a command block carries.

A block whose language is a command language (``COMMAND_LANGUAGES``) is either

- run by a test: the line before its fence is ``<!-- tested: tests/PATH.py NAME -->``, and that test finds
  the block with ``doc_block(PAGE, "NAME")`` and runs it; or
- visibly not run: the line before its fence (blank lines allowed between) is
  ``*Not run by the tests: REASON.*``, which a reader sees.

Blocks of other languages (``DATA_LANGUAGES``: output, configuration, schemas) are shown, not run. A block
with no language, or one in neither set, is refused by ``tests/unit/test_doc_blocks.py``: the language says
which of the two it is. The rules are in docs/development.md ("Docs that run").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND_LANGUAGES = frozenset({"sh", "bash", "shell", "console", "python", "py", "sql", "cql"})
DATA_LANGUAGES = frozenset({"text", "toml", "yaml", "json", "jsonl", "avsc", "proto", "cron", "promql", "http"})
TESTED = re.compile(r"^<!-- tested: (?P<path>tests/\S+\.py) (?P<name>[a-z0-9][a-z0-9-]*) -->$")
NOT_RUN = re.compile(r"^\*Not run by the tests: (?P<reason>\S.*\S)\*$")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")  # any indent: in lists too


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: README.md, docs/running.md
    line: int  # of the opening fence, from 1
    language: str  # the first word of the info string, "" when none
    text: str  # the lines between the fences
    mark: str  # the nearest non-blank line before the fence ("" at the top of the page)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def tested(self) -> tuple[str, str] | None:
        """(test file, block name) when the block is marked as run by a test."""
        found = TESTED.match(self.mark)
        return (found["path"], found["name"]) if found else None

    @property
    def not_run_reason(self) -> str | None:
        found = NOT_RUN.match(self.mark)
        return found["reason"] if found else None


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a page, in order (CommonMark fences: ``` or ~~~, closed by a fence as long)."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        fence = opening["fence"]
        end = index + 1
        while end < len(lines) and not re.match(rf"^ *{fence[0]}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        before = [line for line in lines[:index] if line.strip()]
        found.append(Block(str(page.relative_to(REPO)), index + 1, (opening["info"].split() or [""])[0],
                           "\n".join(lines[index + 1:end]) + "\n", before[-1].strip() if before else ""))
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def doc_block(page: str, name: str) -> str:
    """The text of the block marked ``<!-- tested: ... NAME -->`` in ``page`` (e.g. "docs/reading.md")."""
    named = [block for block in blocks(REPO / page) if block.tested and block.tested[1] == name]
    assert len(named) == 1, f"{page} has {len(named)} blocks marked '<!-- tested: ... {name} -->', not 1"
    return named[0].text
