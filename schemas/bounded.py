"""Untrusted input, bounded: files read whole but never past a bound (a path may name a device or a pipe,
``/dev/zero``, whose size ``stat`` reports as 0), and decoded documents nested no deeper than a bound."""

from __future__ import annotations

from pathlib import Path


class FileTooLargeError(OSError):
    """A file holding more than the bytes its reader takes."""


def read_text_at_most(path: str | Path, max_bytes: int) -> str:
    """The UTF-8 text of ``path``, refused with :class:`FileTooLargeError` past ``max_bytes``; reads at most
    ``max_bytes + 1`` bytes whatever the file is. ``UnicodeDecodeError`` and ``OSError`` as ``read_text``."""
    with open(path, "rb") as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLargeError(f"{path} holds more than {max_bytes:,} bytes")
    return data.decode("utf-8")


def nested_deeper_than(value: object, max_depth: int) -> bool:
    """Whether a decoded JSON-like ``value`` (dicts and lists) nests deeper than ``max_depth`` levels (a dict or
    list is one level, each dict or list in it one more). A walk, not a recursion: the value may be that deep."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values() if isinstance(child, dict | list))
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node if isinstance(child, dict | list))
    return False
