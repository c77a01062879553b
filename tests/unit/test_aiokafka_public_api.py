"""countersink uses aiokafka's public API only, so its pin can follow aiokafka's releases: no module reads or
writes a private attribute of aiokafka's clients (``consumer._subscription``, ``admin._client``, ...)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import aiokafka
import aiokafka.admin
import aiokafka.client
import aiokafka.consumer.consumer
import aiokafka.producer.producer

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("countersink", "consumer", "gc_worker", "schemas", "stack", "bench", "demo", "examples")


def aiokafka_private_attributes() -> set[str]:
    """Every ``self._name`` aiokafka's consumer, producer, admin client and client assign (read from their
    source), so that a new private attribute in a newer aiokafka is covered too."""
    names: set[str] = set()
    for module in (aiokafka.consumer.consumer, aiokafka.producer.producer, aiokafka.admin.client, aiokafka.client):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                names.add(node.attr)
    return names


def private_uses(source: str, private: set[str]) -> list[tuple[int, str]]:
    """``(line, text)`` of each ``something._name`` with ``_name`` in ``private``, ``something`` not self or
    cls (a module's own objects keep their own private state)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in private and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_touches_aiokafka_private_attributes() -> None:
    """No module of the project reads an attribute aiokafka keeps private on its clients (tests are left out:
    they set the project's own objects' private state, whose names may match aiokafka's)."""
    private = aiokafka_private_attributes()
    assert {"_subscription", "_client", "_coordinator", "_fetcher"} <= private  # the scan reads aiokafka
    offenders = [f"{path.relative_to(ROOT)}:{line}: {text}"
                 for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
                 for line, text in private_uses(path.read_text(), private)]
    assert not offenders, "\n".join(offenders)


def test_the_scan_finds_what_it_looks_for() -> None:
    """The two reads countersink.kafka used to make are found; the same names on self are not."""
    private = aiokafka_private_attributes()
    planted = ("def f(consumer, admin):\n    consumer._subscription.subscription\n"
               "    admin._client.cluster.brokers()\n    self._client = None\n")
    assert private_uses(planted, private) == [(2, "consumer._subscription"), (3, "admin._client")]
