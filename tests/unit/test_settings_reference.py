"""Every setting has a line in the settings reference (docs/settings.md), and every line there is a setting."""

from __future__ import annotations

import re
from pathlib import Path

from countersink.settings import setting_variables

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_every_setting_is_in_the_reference() -> None:
    """A setting without a line in docs/settings.md (name, default, meaning) is a setting nobody can find."""
    text = REFERENCE.read_text()
    # A line may name several variables of one family: `COUNTERSINK_X__A` / `__B`.
    shown = set(re.findall(r"COUNTERSINK_[A-Z_]+", text))
    for family in re.findall(r"`(COUNTERSINK_[A-Z]+__)[A-Z_]+`((?:\s*/\s*`__[A-Z_]+`)+)", text):
        prefix, rest = family
        shown |= {prefix + name.lstrip("_") for name in re.findall(r"`__([A-Z_]+)`", rest)}
    missing = sorted(setting_variables() - shown)
    assert not missing, f"not in docs/settings.md: {missing}"
