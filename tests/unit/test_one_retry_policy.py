"""Every pause between attempts in the consumer, the GC and serve goes through countersink.retry (capped
exponential backoff with jitter, cut short by a stop): no hand-written sleep loop creeps back in."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("countersink", "consumer", "gc_worker")


def sleeps_outside_the_retry_module() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "countersink" / "retry.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "sleep"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_sleep_outside_the_retry_module() -> None:
    """No module of the services sleeps on its own: pauses are countersink.retry's, with jitter."""
    assert sleeps_outside_the_retry_module() == []


def test_the_check_sees_a_sleep() -> None:
    """The scan finds the sleep the retry module itself makes, so an empty result above means something."""
    tree = ast.parse((ROOT / "countersink" / "retry.py").read_text())
    assert any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "sleep"
               for n in ast.walk(tree))
