"""Every port the stack, the tests and the benchmarks fix for a server lies below Linux's ephemeral range.

A readiness probe sent to a port in that range before the server listens can be given that very port as its
own local port and connect to itself (TCP's simultaneous open); the server then fails to bind it ("Address
already in use"). It cost a CI run the whole secured stack's tests (its Cassandra was on 39042)."""

from __future__ import annotations

import ast
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack import servers

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("stack", "bench", "tests", "countersink")
# Linux's default, not this machine's: the ports must hold wherever the tests run.
EPHEMERAL = servers.LINUX_EPHEMERAL_RANGE


# A local address with its port, in a bootstrap string or a URL.
LOCAL_ADDRESS = re.compile(r"(?:127\.0\.0\.\d+|localhost):(\d+)")


def _is_port_name(name: str | None) -> bool:
    return name is not None and "port" in name.lower()


def _fixed_ports(tree: ast.AST) -> Iterator[tuple[int, str, int]]:
    """(line, name, value) of each integer literal given to a name that says "port": keyword arguments,
    assignments, annotated assignments (dataclass defaults), argparse defaults of a ``--...-port`` and string
    values of a key that says "port" (settings in an environment); and of each local address's port in a
    string."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for port in LOCAL_ADDRESS.findall(node.value):
                yield node.lineno, "address", int(port)
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (isinstance(key, ast.Constant) and isinstance(key.value, str) and _is_port_name(key.value)
                        and isinstance(value, ast.Constant) and str(value.value).isdigit()):
                    yield node.lineno, key.value, int(value.value)
        pairs: list[tuple[str | None, ast.expr | None]] = []
        if isinstance(node, ast.keyword):
            pairs.append((node.arg, node.value))
        elif isinstance(node, ast.Assign):
            pairs += [(t.id if isinstance(t, ast.Name) else getattr(t, "attr", None), node.value)
                      for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            pairs.append((node.target.id, node.value))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            flag = node.args[0].value
            if isinstance(flag, str) and flag.startswith("--") and "port" in flag:
                pairs += [(flag, kw.value) for kw in node.keywords if kw.arg == "default"]
        for name, value in pairs:
            for constant in ast.walk(value) if value is not None else ():
                if (_is_port_name(name) and isinstance(constant, ast.Constant)
                        and type(constant.value) is int and constant.value > 1023):
                    yield node.lineno, str(name), constant.value


def _every_fixed_port() -> list[tuple[str, int, str, int]]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == Path(__file__).resolve():  # its own examples of what it refuses
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            found += [(str(path.relative_to(ROOT)), line, name, value) for line, name, value in _fixed_ports(tree)]
    return found


def test_every_fixed_server_port_is_below_the_ephemeral_range() -> None:
    found = _every_fixed_port()
    # The scan sees the ports it must judge (it would pass on finding nothing at all).
    values = {value for _, _, _, value in found}
    assert {9092, 9042, 19042, 21042, 22142, 23142, 29042}.issubset(values), sorted(values)
    inside = [f"{path}:{line} {name}={value}" for path, line, name, value in found if value in EPHEMERAL]
    assert not inside, "ports in the ephemeral range 32768-60999:\n" + "\n".join(inside)


def test_the_scan_finds_a_port_in_the_ephemeral_range() -> None:
    source = ("node = Node(native_port=39042)\nCQL_PORT = 38142\n"
              "class S:\n    ssl_port: int = 39093\n"
              "parser.add_argument('--kafka-port', type=int, default=_env('X', 40000))\n"
              "DOWN = {'COUNTERSINK_CASSANDRA__PORT': '39991', 'BOOTSTRAP': '127.0.0.1:39992'}\n")
    found = sorted(value for _, _, value in _fixed_ports(ast.parse(source)))
    assert found == [38142, 39042, 39093, 39991, 39992, 40000]


def test_a_free_port_is_below_the_ephemeral_range_bindable_and_never_handed_out_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ports = [servers.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert not [port for port in ports if port in EPHEMERAL or port < 1024]
    for port in ports[:3]:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
    with socket.socket() as held:  # a port something holds is passed over
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(servers, "FREE_PORTS", range(taken, taken + 1))
        with pytest.raises(servers.StackError, match="no free port"):
            servers.free_port()
