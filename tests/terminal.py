"""Run a command on a pseudo-terminal, as a person at a shell runs it, and read what the terminal shows."""

from __future__ import annotations

import io
import os
import pty
import subprocess


class TextTerminal(io.StringIO):
    """A text stream that says it is a terminal, for code that decides what to print by ``isatty()``."""

    def isatty(self) -> bool:
        return True


def run_on_terminal(command: list[str], env: dict[str, str], cwd: str, timeout: float = 120) -> tuple[int, str]:
    """(exit code, everything written to the terminal) of ``command``, its stdin, stdout and stderr a pty."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower, env=env, cwd=cwd,
                               close_fds=True)
    os.close(follower)
    shown = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the pty's last writer closed it (EIO)
                break
            if not chunk:
                break
            shown += chunk
        code = process.wait(timeout)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
            process.wait()
    return code, shown.decode().replace("\r\n", "\n")
