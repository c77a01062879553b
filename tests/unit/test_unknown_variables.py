"""A ``COUNTERSINK_*`` variable that is not a setting stops every command, as a refused value does; every such
variable the project's own files set or name is a real setting, or one of the few documented non-settings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from countersink.settings import NOT_SETTINGS, Settings, setting_variables, unknown_variables, untrusted_env_files

REPO = Path(__file__).resolve().parents[2]
# Built from parts so that the scan below does not find these misspellings in this file.
MISSPELT = {"COUNTERSINK_" + "KAFAK__BOOTSTRAP_SERVERS": "COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS",
            "COUNTERSINK_" + "GC_GRACE_S": "COUNTERSINK_GC__GRACE_S"}
# Names that files show on purpose as what is not a setting (placeholders and misspellings their tests use).
PLACEHOLDERS = {"countersink/cli.py": {"COUNTERSINK_SECTION__NAME"},
                "countersink/settings.py": {"COUNTERSINK_SECTION__NAME", "COUNTERSINK_NAME"},
                "docs/settings.md": {"COUNTERSINK_GC_GRACE_S"},  # the example of a refused name
                "tests/unit/test_settings_reference.py": {"COUNTERSINK_X__A"},
                "tests/unit/test_deploy_files.py": {"COUNTERSINK_CONSUMER__GROUPID", "COUNTERSINK_NOSUCH__GROUP_ID"}}


def run(*args: str, env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("COUNTERSINK_")}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**clean, "PYTHONPATH": str(REPO), "COUNTERSINK_LOG_FORMAT": "json", **env})


@pytest.mark.parametrize("command", [["countersink.cli", "get", "shares", "IBM"], ["consumer"], ["gc_worker"],
                                     ["countersink.cli", "serve"], ["countersink.cli", "topics", "create", "t"],
                                     ["countersink.cli", "schema"]])
@pytest.mark.parametrize("variable", sorted(MISSPELT))
def test_a_misspelt_variable_stops_every_command(command: list[str], variable: str) -> None:
    """A misspelt variable exits 2 before any connection, with one settings_refused line naming it and the
    nearest real name, never its value."""
    done = run(*command, env={variable: "value-never-shown"})
    assert done.returncode == 2, done.stderr
    (line,) = [json.loads(x) for x in done.stderr.splitlines()]
    assert line["event"] == "settings_refused"
    assert line["error"] == f"{variable}: not a setting; did you mean {MISSPELT[variable]}?"
    assert "value-never-shown" not in done.stdout + done.stderr


def test_a_whole_section_in_one_variable_is_refused_saying_how_to_set_it() -> None:
    """pydantic-settings reads a section as JSON from ``COUNTERSINK_KAFKA``; here it is refused as any variable
    that is not a setting, saying that a section is set one variable per setting (it suggested
    COUNTERSINK_KAFKA__CLIENT_ID, the nearest name)."""
    (problem,) = unknown_variables({"COUNTERSINK_" + "KAFKA": '{"bootstrap_servers": "x:1"}'})
    assert problem == ("COUNTERSINK_" + "KAFKA", "not a setting: a section is set one variable per setting "
                       "(COUNTERSINK_" + "KAFKA__NAME, COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS for one), not as a whole")


def test_a_misspelt_dotenv_entry_stops_a_command(tmp_path: Path) -> None:
    """An entry of ``.env`` that is not a setting is refused too, naming the file."""
    (tmp_path / ".env").write_text("COUNTERSINK_CASSANDRA__PORT=9042\nCOUNTERSINK_CASANDRA__KEYSPACE=s3cr3t\n"
                                   "OTHER_TOOL=1\n")
    done = run("countersink.cli", "get", "shares", "IBM", env={}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = [json.loads(x) for x in done.stderr.splitlines()]
    assert line["error"] == ("COUNTERSINK_CASANDRA__KEYSPACE: not a setting (in .env); "
                             "did you mean COUNTERSINK_CASSANDRA__KEYSPACE?")
    assert "s3cr3t" not in done.stderr


def test_a_dotenv_others_may_write_stops_a_command(tmp_path: Path) -> None:
    """A ``.env`` that group or others may write is refused before it is read: it could turn certificate checks
    off or point the process, and its password, at another server."""
    env_file = tmp_path / ".env"
    env_file.write_text("COUNTERSINK_CASSANDRA__SSL_VERIFY=false\n")
    env_file.chmod(0o666)
    done = run("countersink.cli", "get", "shares", "IBM", env={}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = [json.loads(x) for x in done.stderr.splitlines()]
    assert line["event"] == "settings_refused"
    assert line["error"] == ".env: may be written by other users (mode 666); chmod go-w .env"
    env_file.chmod(0o600)
    assert untrusted_env_files([env_file]) == []


def test_a_dotenv_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``.env`` owned by another user than the one running the process is refused, whatever its mode."""
    env_file = tmp_path / ".env"
    env_file.write_text("COUNTERSINK_CASSANDRA__PORT=9042\n")
    env_file.chmod(0o600)
    monkeypatch.setattr(os, "geteuid", lambda: env_file.stat().st_uid + 1)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError, match="is owned by another user"):
        Settings()


def test_settings_refuse_unknown_names_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constructing Settings refuses an unknown variable (in any case); real ones and non-settings pass."""
    monkeypatch.setenv("COUNTERSINK_TEST_KAFKA", "127.0.0.1:1")
    monkeypatch.setenv("countersink_log_level", "debug")
    assert Settings(_env_file=None).log_level == "DEBUG"
    monkeypatch.setenv("countersink_log_levle", "debug")
    with pytest.raises(ValueError, match="did you mean COUNTERSINK_LOG_LEVEL"):
        Settings(_env_file=None)


def test_only_prefixed_unknown_names_are_refused() -> None:
    """Other tools' variables, settings, and the documented non-settings pass; the rest is named."""
    environ = {"PATH": "/bin", "COUNTERSINK_GC__GRACE_S": "1", "COUNTERSINK_TEST_SERVERS": "stack",
               "COUNTERSINK_WHATEVER": "1"}
    assert [name for name, _ in unknown_variables(environ)] == ["COUNTERSINK_WHATEVER"]


def test_non_settings_are_documented() -> None:
    """Each allowed non-setting has a line in docs/settings.md, and none of them is a setting."""
    text = (REPO / "docs" / "settings.md").read_text()
    assert {name for name in NOT_SETTINGS if f"`{name}`" not in text} == set()
    assert not NOT_SETTINGS & setting_variables()


def _project_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    this = str(Path(__file__).relative_to(REPO))  # it names the exceptions
    return [name for name in listed.splitlines()
            if name not in ("CHANGELOG.md", this) and (REPO / name).is_file()]


def test_every_variable_the_project_names_is_a_setting() -> None:
    """Every COUNTERSINK_ name in the project's files (code, tests, stack, Dockerfile, deploy/, compose.yaml,
    docs) is a real setting or a documented non-setting: a misspelt one there would now stop a command."""
    known = setting_variables() | NOT_SETTINGS
    seen, wrong = set(), []
    for name in _project_files():
        try:
            text = (REPO / name).read_text()
        except UnicodeDecodeError:
            continue
        # `COUNTERSINK_KAFKA__…`, `COUNTERSINK_STACK_*`, `COUNTERSINK_{section}`: a family, not one variable.
        for variable in re.findall(r"COUNTERSINK_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_*{])", text):
            seen.add(variable)
            if variable not in known and variable not in PLACEHOLDERS.get(name, set()):
                wrong.append((name, variable))
    assert len(seen) > 50
    assert wrong == []
