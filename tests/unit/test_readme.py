"""The README stays a five-minute read, and every page it and the docs link to exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_under_12_kb() -> None:
    """README.md is under 12 KB: what it is, why, the quickstart, the two commands, a map of docs/."""
    assert len((ROOT / "README.md").read_bytes()) < 12 * 1024


def test_readme_puts_the_two_commands_and_the_quickstart_first() -> None:
    """``make demo`` and ``make test`` are on the first screen (40 lines); the quickstart comes before the map."""
    text = (ROOT / "README.md").read_text()
    first_screen = "\n".join(text.splitlines()[:40])
    assert "make demo" in first_screen
    assert "make test" in first_screen
    assert text.index("## Quickstart") < text.index("## Documentation")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_lead_somewhere(page: Path) -> None:
    """Every relative link of a page names a file that exists, and a #section of it that exists."""
    for target in re.findall(r"\]\(([^)#:]+\.(?:md|toml))(#[^)]*)?\)", page.read_text()):
        path, anchor = target
        resolved = (page.parent / path).resolve()
        assert resolved.is_file(), f"{page.name} links to {path}"
        if anchor:
            headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                        for h in re.findall(r"^#+ (.+)$", resolved.read_text(), re.MULTILINE)}
            assert anchor[1:] in headings, f"{page.name} links to {path}{anchor}"
