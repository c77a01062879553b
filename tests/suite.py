"""Every test, as ``make test`` runs them: in two pytest sessions side by side. In the foreground, the tests
needing the session's shared servers (Kafka and Cassandra, or the three-node cluster); beside them, the rest (the
unit and property tests, and the integration tests that start servers of their own, such as the secured stack),
whose report is printed when the first session ends.

Why two sessions at once: the unit tests are CPU-bound and need no server (about four minutes of one core), and
the tests on servers of their own spend minutes booting them, while the tests on the shared servers mostly wait on
those servers and on the processes they start (about half of the machine's two cores idle while they run). One
after the other, those minutes were spent before or between the tests on the shared servers.

    python -m tests.suite [PYTEST ARGS...]     # the arguments go to both sessions

Exits with the shared servers' session's status when it failed, else the other's (0 when one session had no test
to run, the arguments selecting tests of the other alone). A signal that stops this stops both sessions (each stops
the servers it started, or they die with it).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

from stack.servers import _die_with_parent

REPO = Path(__file__).resolve().parent.parent
NO_TESTS = 5  # pytest's status when no test was collected or selected


def _session(args: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """A pytest session in its own process group, so a terminal's Ctrl-C reaches it once (forwarded by
    :func:`main`), not twice; and told to stop when this process dies."""
    return subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=REPO, start_new_session=True,
                            preexec_fn=_die_with_parent, **options)


def _rule(title: str) -> str:
    return f"\n{'=' * 30} {title} {'=' * 30}\n"


def main(argv: list[str]) -> int:
    with tempfile.TemporaryFile(mode="w+", prefix="rest-of-the-tests-") as log:
        # Its own cache off: two sessions writing .pytest_cache at once could leave it torn.
        rest = _session(["tests/unit", "tests/integration", "--part=rest", "-p", "no:cacheprovider", *argv],
                        stdout=log, stderr=subprocess.STDOUT)
        shared: subprocess.Popen[bytes] | None = None

        def running() -> list[subprocess.Popen[bytes]]:
            return [child for child in (rest, shared) if child is not None and child.poll() is None]

        def forward(signum: int, _frame: FrameType | None) -> None:
            for child in running():
                child.send_signal(signum)

        previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            print(f"tests: the unit and property tests, and the integration tests on servers of their own, run "
                  f"beside these (pid {rest.pid}); their report follows", flush=True)
            shared = _session(["tests/integration", "--part=shared", *argv])
            shared_status = shared.wait()
            rest_status = rest.wait()
        finally:
            for child in running():
                child.terminate()
                child.wait()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        log.seek(0)
        print(_rule("unit and property tests, integration tests on servers of their own (run beside)"), flush=True)
        sys.stdout.write(log.read())
    print(f"tests: those on the shared servers exited {shared_status}, the rest {rest_status}", flush=True)
    if {shared_status, rest_status} == {NO_TESTS, 0}:  # arguments that select tests of one session alone
        return 0
    return shared_status or rest_status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
