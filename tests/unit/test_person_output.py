"""On a terminal, the commands that answer a person (get, explain, list) show values and one plain line per
error; services, pipes and files get JSON lines as before."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from countersink.cli import PERSON_COMMANDS
from countersink.logs import configure_logging, get_logger, log_style
from tests.servers_down import CASSANDRA_DOWN
from tests.terminal import TextTerminal, run_on_terminal

REPO = Path(__file__).resolve().parents[2]




@pytest.mark.parametrize(("fmt", "terminal", "person", "level", "style"), [
    ("auto", True, True, "INFO", "person"),
    ("auto", True, True, "DEBUG", "console"),  # --debug shows everything, as before
    ("auto", True, False, "INFO", "console"),  # a service on a terminal
    ("auto", False, True, "INFO", "json"),  # a read command into a pipe or a file
    ("auto", False, False, "INFO", "json"),
    ("json", True, True, "INFO", "json"),  # asked for
    ("console", True, True, "INFO", "console"),
])
def test_the_format_follows_the_command_and_the_stream(fmt: str, terminal: bool, person: bool, level: str,
                                                      style: str) -> None:
    """JSON off a terminal or when asked for; plain lines for a person's command on a terminal."""
    assert log_style(fmt, terminal=terminal, person=person, level=level) == style


def test_the_read_commands_answer_a_person() -> None:
    """get, explain and list are the commands whose output is for a person; services are not."""
    assert {"get", "explain", "list"} <= PERSON_COMMANDS
    assert not {"consume", "gc", "serve"} & PERSON_COMMANDS


@pytest.mark.usefixtures("restore_logging")
def test_a_person_sees_warnings_and_errors_as_plain_lines() -> None:
    """Info lines are not shown; an error is ``error: <its text>``, a warning keeps its details."""
    shown = TextTerminal()
    configure_logging("INFO", "auto", no_color=True, stream=shown, person=True)
    log = get_logger("t")
    log.info("cassandra_connected", contact_points=["127.0.0.1"])
    log.warning("slow_read", seconds=3)
    log.error("command_failed", command="get", error="cannot connect to Cassandra at 127.0.0.1:9042")
    assert shown.getvalue().splitlines() == ["warning: slow_read (seconds=3)",
                                             "error: cannot connect to Cassandra at 127.0.0.1:9042"]


@pytest.mark.parametrize(("env", "expected"), [
    (CASSANDRA_DOWN,
     (1, "error: cannot connect to Cassandra at 127.0.0.1:2: ")),
    ({"COUNTERSINK_" + "GC_GRACE_S": "1"},
     (2, "error: COUNTERSINK_" "GC_GRACE_S: not a setting; did you mean COUNTERSINK_GC__GRACE_S?")),
])
def test_a_failed_get_on_a_terminal_is_one_plain_line(env: dict[str, str], expected: tuple[int, str]) -> None:
    """``countersink get`` on a pseudo-terminal that fails shows exactly one line, for a person, no JSON."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("COUNTERSINK_")}
    code, shown = run_on_terminal([sys.executable, "-m", "countersink.cli", "get", "shares", "IBM"],
                                  {**clean, "PYTHONPATH": str(REPO), "NO_COLOR": "1", **env}, str(REPO))
    (line,) = shown.splitlines()
    assert (code, line[:len(expected[1])]) == expected
