"""Files read whole, but never more than a bound: a path may name a device or a pipe (``/dev/zero``), whose
size ``stat`` reports as 0."""

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
