"""SIGTERM while a process is still starting: long-running commands stop cleanly, others keep the default.

Each case runs in a child process, since signal dispositions are process-wide.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.servers_down import CASSANDRA_DOWN_PORT, KAFKA_DOWN

REPO = Path(__file__).resolve().parents[2]

# The signal is sent after the early handler is in place and before the command's own handlers exist:
# the window in which a freshly started pod can be told to stop.
SCRIPT = textwrap.dedent("""
    import asyncio, os, signal, sys
    from countersink import cli

    async def command() -> int:
        stopped = asyncio.Event()
        with cli.stop_on_signals(stopped.set):
            await asyncio.wait_for(stopped.wait(), 10)
        print("stopped cleanly", flush=True)
        return 0

    cli._remember_early_stop()
    os.kill(os.getpid(), signal.SIGTERM)
    sys.exit(cli.run_async(command(), graceful=sys.argv[1] == "graceful"))
""")


def _run(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_a_long_running_command_acts_on_a_sigterm_that_came_during_start_up() -> None:
    """A long-running command stops cleanly on a SIGTERM that came while it started."""
    done = _run("graceful")
    assert (done.returncode, done.stdout.strip()) == (0, "stopped cleanly"), done.stderr


def test_a_one_shot_command_gets_the_default_action_of_an_early_sigterm() -> None:
    """A one-shot command keeps SIGTERM's default action."""
    done = _run("one-shot")
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr
    assert "stopped cleanly" not in done.stdout


# How the command is run: the console script's import, and ``python -m countersink.cli`` (the file then loaded
# twice, as __main__ and as countersink.cli: a SIGTERM remembered in the first was lost to the second) or
# ``python -m countersink``.
RUNS = {"import": "sys.exit(__import__('countersink.cli').cli.main(['consume', '--counters', sys.argv[1]]))",
        "-m countersink.cli": "sys.argv = ['countersink', 'consume', '--counters', sys.argv[1]]; "
                              "runpy.run_module('countersink.cli', run_name='__main__', alter_sys=True)",
        "-m countersink": "sys.argv = ['countersink', 'consume', '--counters', sys.argv[1]]; "
                          "runpy.run_module('countersink', run_name='__main__', alter_sys=True)"}


@pytest.mark.parametrize("run", list(RUNS))
def test_the_consumer_told_to_stop_while_starting_exits_0_without_joining(tmp_path: Path, run: str) -> None:
    """The real ``consume`` path, with the signal sent while the service is being built (no servers needed:
    it must not even try to reach them), however the command is run."""
    counters = tmp_path / "counters.toml"
    counters.write_text('[[counter]]\nname = "likes"\ntopics = ["likes"]\nkind = "count"\nkey = "post_id"\n')
    script = textwrap.dedent("""
        import os, runpy, signal, sys
        import consumer.cli

        class SignalledWhileBuilt(consumer.cli.ConsumerService):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                os.kill(os.getpid(), signal.SIGTERM)

        consumer.cli.ConsumerService = SignalledWhileBuilt
    """) + RUNS[run] + "\n"
    env = {"PATH": "/usr/bin:/bin", **KAFKA_DOWN,
           "COUNTERSINK_CASSANDRA__CONTACT_POINTS": "127.0.0.1", "COUNTERSINK_CASSANDRA__PORT": "1",
           "COUNTERSINK_CONSUMER__HEALTH_PORT": "0", "COUNTERSINK_LOG_FORMAT": "json"}
    done = subprocess.run([sys.executable, "-c", script, str(counters)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "consumer_stopped_before_start" in done.stdout + done.stderr
    assert "consumer_started" not in done.stdout + done.stderr


# The `countersink` command, as its console script runs it.
RUN_CLI = "import sys; from countersink.cli import main; sys.argv[0] = 'countersink'; sys.exit(main())"

# Servers that do not answer (tests.servers_down), the health ports any free one, logs in JSON.
DOWN = {**KAFKA_DOWN, "COUNTERSINK_CASSANDRA__PORT": CASSANDRA_DOWN_PORT,
        "COUNTERSINK_CONSUMER__HEALTH_PORT": "0", "COUNTERSINK_GC__HEALTH_PORT": "0", "COUNTERSINK_LOG_FORMAT": "json"}


def _stopped_while_waiting(args: list[str], log: Path, waiting_for: str) -> str:
    """Run ``countersink ARGS`` against servers that are down, SIGTERM it once its log shows
    ``waiting_for``; assert it exits 0 within seconds, and return what it printed."""
    import os
    import time

    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", RUN_CLI, *args], cwd=REPO,
                                   env={**os.environ, **DOWN}, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while waiting_for not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"never logged {waiting_for}"
            time.sleep(0.1)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()
        assert time.monotonic() - signalled < 5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert "Unclosed" not in output
    assert "Traceback" not in output
    return output


def _counters(tmp_path: Path) -> Path:
    counters = tmp_path / "counters.toml"
    counters.write_text('[[counter]]\nname = "likes"\ntopics = ["likes"]\nkind = "count"\nkey = ["post_id"]\n')
    return counters


def test_a_consumer_waiting_for_servers_that_are_down_stops_at_once_on_sigterm(tmp_path: Path) -> None:
    """A consumer waiting at start-up for a Cassandra and a Kafka that do not answer exits 0 within seconds
    of a SIGTERM, not after startup_timeout_s, and closes every client it made: no "Unclosed" warning, no
    traceback."""
    output = _stopped_while_waiting(["consume", "--counters", str(_counters(tmp_path))], tmp_path / "log",
                                    "waiting_for_server")
    assert "consumer_stopped_before_start" in output


def test_a_consumer_waiting_for_its_servers_answers_readyz_saying_so(tmp_path: Path) -> None:
    """While the start waits for Cassandra (up to startup_timeout_s), the health port is open and /readyz answers
    503 naming what it waits for (a closed port looked like a process that is gone); a SIGTERM still ends the
    wait with exit 0."""
    import os
    import time
    import urllib.error
    import urllib.request

    from stack.servers import free_port

    port = free_port()
    log = tmp_path / "log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", RUN_CLI, "consume", "--counters", str(_counters(tmp_path))],
                                   cwd=REPO, env={**os.environ, **DOWN, "COUNTERSINK_CONSUMER__HEALTH_PORT": str(port)},
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline, answer = time.monotonic() + 60, None
        while answer != (503, "not ready: waiting for Cassandra to answer\n"):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, (answer, log.read_text())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
                    answer = (response.status, response.read().decode())
            except urllib.error.HTTPError as refused:
                answer = (refused.code, refused.read().decode())
            except OSError:
                time.sleep(0.1)  # not listening yet
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_waiting_for_cassandra_stops_at_once_on_sigterm(tmp_path: Path) -> None:
    """``serve`` started while Cassandra is down waits for it (no traceback, no exit 1) and stops at once on a
    SIGTERM."""
    output = _stopped_while_waiting(["serve", "--port", "0", "--counters", str(_counters(tmp_path))],
                                    tmp_path / "log", "waiting_for_server")
    assert "serve_stopped_before_start" in output


def test_a_gc_loop_with_cassandra_down_stops_at_once_on_sigterm(tmp_path: Path) -> None:
    """``gc --every`` with Cassandra down logs each failed run and stops at once on a SIGTERM."""
    output = _stopped_while_waiting(["gc", "--every", "30"], tmp_path / "log", "gc_failed")
    assert "gc_loop_stopped" in output


def test_schema_gives_up_on_an_absent_cassandra_with_one_line() -> None:
    """``schema`` waits up to --wait for Cassandra, then exits 1 with one error line and no traceback."""
    import os

    done = subprocess.run([sys.executable, "-c", RUN_CLI, "schema", "--wait", "1"], cwd=REPO,
                          env={**os.environ, **DOWN}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "schema_failed" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
