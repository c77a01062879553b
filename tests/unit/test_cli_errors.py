"""The command line explains itself: one line per error, documented exit codes, arguments checked before any
connection, enum values in any case, help for every argument with its default.

Commands that must fail to connect are pointed at ports where nothing listens; each runs as a child process,
as a user would run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from countersink import cli, reset_cli
from countersink.cli import SUBCOMMANDS, build_parser
from countersink.publish_cli import BadLineError, LineFormat, parse_line, parse_record
from countersink.settings import Settings
from schemas.definitions import parse_definitions
from schemas.errors import DefinitionError
from tests.servers_down import CASSANDRA_DOWN, KAFKA_DOWN

REPO = Path(__file__).resolve().parents[2]
# Nothing listens on these ports (below 1024, and never a client's own port).


def countersink(*args: str, env: dict[str, str] | None = None,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSINK_")}
    return subprocess.run([sys.executable, "-m", "countersink.cli", *args], cwd=REPO, input=stdin,
                          env={**clean, "COUNTERSINK_LOG_FORMAT": "json", **(env or {})},
                          capture_output=True, text=True, timeout=120)


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


def test_version_is_printed() -> None:
    """``--version`` prints the installed version and exits 0."""
    done = countersink("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"countersink {version('countersink')}")


@pytest.mark.parametrize("command", [["get", "shares", "IBM"], ["explain", "shares", "IBM"], ["list", "shares"],
                                     ["get", "shares", "IBM", "--consistency", "one"]])
def test_an_unreachable_cassandra_is_one_line_naming_the_address_and_exit_1(command: list[str]) -> None:
    """A read with Cassandra down exits 1 with one error line that names the address tried, no traceback."""
    done = countersink(*command, env=CASSANDRA_DOWN)
    assert done.returncode == 1, done.stderr
    lines = error_lines(done)
    assert len(lines) == 1, done.stderr
    failure = json.loads(lines[0])
    assert failure["event"] == "command_failed"
    assert "127.0.0.1:2" in failure["error"]


@pytest.mark.parametrize("command", [["topics", "create", "trades"], ["publish", "trades", "-"]])
def test_an_unreachable_kafka_is_one_line_naming_the_address_and_exit_1(command: list[str]) -> None:
    """``topics`` and ``publish`` with Kafka down exit 1 with one line naming the bootstrap servers."""
    done = countersink(*command, env=KAFKA_DOWN, stdin="")
    assert done.returncode == 1, done.stderr
    lines = error_lines(done)
    assert len(lines) == 1, done.stderr
    assert "127.0.0.1:1" in json.loads(lines[0])["error"]


@pytest.mark.parametrize(("variable", "value"), [("COUNTERSINK_CASSANDRA__PORT", "abc"),
                                                  ("COUNTERSINK_LOG_LEVEL", "loud"),
                                                  ("COUNTERSINK_GC__CONCURRENCY", "0")])
def test_a_bad_setting_is_one_line_naming_the_variable_and_exit_2(variable: str, value: str) -> None:
    """A refused variable exits 2 with one settings_refused line naming it, never a pydantic traceback."""
    done = countersink("get", "shares", "IBM", env={variable: value})
    assert done.returncode == 2, done.stderr
    lines = error_lines(done)
    assert len(lines) == 1, done.stderr
    refused = json.loads(lines[0])
    assert refused["event"] == "settings_refused"
    assert refused["error"].startswith(f"{variable}: ")
    assert value not in refused["error"]  # values are never echoed: a refused one may be a password


def test_a_refused_password_setting_is_not_echoed() -> None:
    """The value of a secret that fails validation never appears in the output."""
    done = countersink("get", "shares", "IBM", env={"COUNTERSINK_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
                                                    "COUNTERSINK_KAFKA__SASL_PASSWORD": "hunter2-secret"})
    assert done.returncode == 2, done.stderr
    assert "hunter2-secret" not in done.stdout + done.stderr


@pytest.mark.parametrize(("command", "complaint"), [
    (["list", "shares", "--limit", "-5"], "--limit: -5 is not a positive integer"),
    (["list", "shares", "--page", "%%%"], "is not a page token"),
    (["get", "Shares", "IBM"], "is not a counter name"),
    (["get", "shares", "x" * 2000], "at most 1024 bytes"),
    (["get", "shares", "IBM", "--consistency", "most"], "--consistency"),
    (["get", "shares", "IBM", "--from", "yesterday", "--to", "now"], "is not a time"),
    (["get", "shares", "IBM", "--from", "2026-11-22T10:00", "--to", "now"], "has no UTC offset"),
    (["get", "shares", "IBM", "--step", "1d"], "give --from and --to"),
    (["get", "shares", "IBM", "--from", "now-1d"], "needs both --from and --to"),
    (["get", "shares", "IBM", "SAP", "--from", "now-1d", "--to", "now"], "one key at a time"),
    (["get", "shares", "IBM", "--from", "now", "--to=-1d"], "--to must come after --from"),
    (["get", "shares", "IBM", "--from", "now-1d", "--to", "now", "--step", "fortnight"], "is not a duration"),
    (["get", "shares", "IBM", "--from", "now-1d", "--to", "now", "--step", "1h", "--rollup"], "not both"),
    (["gc", "--concurrency", "0"], "--concurrency: 0 is not a positive integer"),
    (["gc", "--every", "soon"], "is not a duration"),
    (["serve", "--port", "70000"], "not a port number"),
    (["serve", "--host", ""], "--host: String should have at least 1 character"),
    (["get", "shares", "IBM", "--consistency", "bogus"], "'bogus' is not a consistency level: ONE, TWO,"),
    (["list", "shares", "--limit", "99999999999999999999"], "is more than 2,147,483,647"),
    (["topics", "create", "t", "--partitions", "100001"], "100001 is more than 100,000 partitions"),
    (["dead-letters", "republish", "--partition", "-1", "--offset", "0"], "-1 is not a partition number"),
    (["dead-letters", "republish", "--partition", "0", "--offset", "0", "--payload", "/nonexistent/fix.json"],
     "--payload /nonexistent/fix.json: No such file or directory"),
    (["dead-letters", "republish", "--partition", "0", "--offset", "0", "--payload", "/"], "--payload /: Is a dir"),
    (["reprocess", "shares", "--from", "2999-01-01T00:00:00Z"], "is in the future: there is nothing after it"),
    (["reprocess", "shares", "--from", "1969-01-01T00:00:00Z"], "before 1970"),
    (["consume", "--group", ""], "--group: String should have at least 1 character"),
    (["consume", "--group", "g" * 201], "--group: String should have at most 200 characters"),
    (["backfill", "shares", "--group", ""], "--group: String should have at least 1 character"),
    (["gc", "--concurrency", "5000"], "--concurrency: Input should be less than or equal to 1024"),
    (["schema", "--wait", "-1"], "must be a number of seconds from 0 to 86400"),
    (["schema", "--wait", "inf"], "must be a number of seconds from 0 to 86400"),
    (["schema", "--wait", "nan"], "must be a number of seconds from 0 to 86400"),
    (["schema", "--replication", "{'class': 'x'}; DROP"], "not a plain CQL map"),
    (["topics", "create", "bad topic"], "is not a Kafka topic name"),
    (["topics", "create", "t", "--replication-factor", "32768"], "32768 is more than 32,767 replicas"),
    (["topics", "create", "."], "'.' is not a topic to create: Kafka refuses it"),
    (["topics", "create", "__consumer_offsets"], "is not a topic to create: Kafka refuses it, or it is Kafka's own"),
    (["publish", "t", "-", "--schema", "view.avsc"], "--schema, --message and --subject go with --format"),
    (["publish", "t", "-", "--format", "avro", "--schema", "v.avsc", "--message", "shop.View"],
     "--message names a Protobuf message"),
    (["nonsense"], "invalid choice"),
])
def test_bad_arguments_are_refused_before_connecting(command: list[str], complaint: str) -> None:
    """A bad argument exits 2 with one line, before anything connects (the servers here are unreachable)."""
    done = countersink(*command, env={**CASSANDRA_DOWN, **KAFKA_DOWN})
    assert done.returncode == 2, done.stderr
    lines = error_lines(done)
    assert len(lines) == 1, done.stderr
    assert complaint in lines[0]
    assert "connect" not in done.stderr


def test_enum_settings_and_options_take_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--consistency one``, ``COUNTERSINK_LOG_LEVEL=debug`` and lower-case consistency variables are accepted."""
    monkeypatch.setenv("COUNTERSINK_LOG_LEVEL", "debug")
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__READ_CONSISTENCY", "local_quorum")
    monkeypatch.setenv("COUNTERSINK_CONSUMER__ON_RECORDS_LOST", "SKIP")
    settings = Settings()
    assert (settings.log_level, settings.cassandra.read_consistency) == ("DEBUG", "LOCAL_QUORUM")
    assert settings.consumer.on_records_lost == "skip"
    parser, _ = build_parser()
    assert parser.parse_args(["get", "c", "k", "--consistency", "one"]).consistency == "ONE"


@pytest.mark.parametrize("debug", [["--debug"], [], ["lower-case name"]])
def test_the_traceback_only_with_debug(debug: list[str]) -> None:
    """An error shows its traceback with ``--debug`` or COUNTERSINK_LOG_LEVEL=DEBUG (its name in any case, as
    every variable's), and only then."""
    env = CASSANDRA_DOWN if debug == ["--debug"] else {
        **CASSANDRA_DOWN, ("countersink_log_level" if debug else "COUNTERSINK_LOG_LEVEL"): "debug"}
    shown = countersink(*debug[:1] if debug == ["--debug"] else (), "get", "shares", "IBM", env=env)
    hidden = countersink("get", "shares", "IBM", env=CASSANDRA_DOWN)
    assert shown.returncode != 0
    assert "Traceback" in shown.stderr
    assert "Traceback" not in hidden.stderr


@pytest.mark.parametrize(("argv", "keys"), [
    (["reset", "c", "--json", "--", "-dash"], ["-dash"]),
    (["reset", "c", "--idempotency-key", "abcdefgh", "--", "-dash", "--json"], ["-dash", "--json"]),
    (["reset", "c", "k1", "--json", "k2", "k3"], ["k1", "k2", "k3"]),
    (["reset", "c", "--", "-a", "b"], ["-a", "b"]),
    (["reset", "c", "--json"], []),
])
def test_reset_keys_may_follow_its_options(argv: list[str], keys: list[str]) -> None:
    """A reset's keys after an option, and after --, are keys (argparse took only those before the first
    option, and refused the rest: ``reset C --idempotency-key K -- -KEY`` could not be written)."""
    from countersink.cli import _late_positionals

    parser, _ = build_parser()
    args, extra = parser.parse_known_args(argv)
    assert (_late_positionals(parser, args, extra) if extra else args).keys == keys


@pytest.mark.parametrize(("argv", "complaint"), [
    (["reset", "c", "--jsno"], "unrecognized arguments: --jsno"),
    (["reset", "c", "--json", "k", "--jsno"], "unrecognized arguments: k --jsno"),
    (["reset", "c", "--json", "--", "a\\"], "argument KEY: bad escape in instance key"),
    (["get", "c", "k", "--json", "k2"], "unrecognized arguments: k2"),  # get takes its keys together
])
def test_what_follows_options_is_refused_unless_it_is_a_resets_keys(argv: list[str], complaint: str) -> None:
    """An unknown option is refused as before, a key after -- is checked as any key, and commands other than
    reset take no positionals after their options."""
    done = countersink(*argv)
    assert done.returncode == 2
    assert complaint in done.stderr, done.stderr


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[f"{parser.prog} {name}"] = sub
                found.update(_subparsers(sub))
    return found


def test_every_argument_has_help_and_options_show_their_default() -> None:
    """Each argument of each command is described; an option overriding a setting names it and its default."""
    parser, _ = build_parser()
    commands = _subparsers(parser)
    assert {name.split(" ", 1)[1] for name in commands} >= set(SUBCOMMANDS)
    for name, command in commands.items():
        text = command.format_help()
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{name}: {action.dest} has no help"
            if action.help and "COUNTERSINK_" in action.help:
                assert "(default: " in action.help, f"{name}: {action.dest}"
        assert "(default: 100)" in commands["countersink list"].format_help()
        assert "``" not in text


def test_the_top_level_help_lists_exit_codes_without_markup() -> None:
    """``countersink --help`` reads as prose: no reStructuredText markup, the exit codes listed."""
    text = countersink("--help").stdout
    assert "``" not in text
    assert ":class:" not in text
    assert "exit codes:" in text
    assert "publish" in text


def test_every_problem_of_a_definitions_file_is_listed_at_once(tmp_path: Path) -> None:
    """A definitions file with three problems in two counters is refused with all three named, exit 2."""
    bad = tmp_path / "counters.toml"
    bad.write_text('[[counter]]\nname = "a"\ntopics = ["t"]\nkind = "sum"\nvalue = "v"\nlg_k = 3\nk = 1\n'
                   '[[counter]]\nname = "B"\ntopics = ["t"]\nkind = "count"\n')
    done = countersink("consume", "--counters", str(bad), env={**CASSANDRA_DOWN, **KAFKA_DOWN})
    assert done.returncode == 2, done.stderr
    refused = [json.loads(line)["error"] for line in error_lines(done)]
    assert len(refused) == 3, refused
    assert any("'a' (#1), field 'lg_k'" in line for line in refused)
    assert any("'a' (#1), field 'k'" in line for line in refused)
    assert any("'B' (#2), field 'name'" in line for line in refused)


def test_counters_whose_shared_row_could_outgrow_the_limit_are_refused_before_any_connection(tmp_path: Path) -> None:
    """A top-k of 8192 and a distinct of lg_k 21 that can share rows: ``consume`` exits 2 with one line naming
    both and the setting, without reaching a server; with the limit raised, the same file gets past loading."""
    big = tmp_path / "counters.toml"
    big.write_text('[[counter]]\nname = "top_users"\ntopics = ["t"]\nkind = "top_k"\nkey = "s"\nvalue = "u"\n'
                   'max_map_size = 8192\n[[counter]]\nname = "traders"\ntopics = ["t"]\nkind = "distinct"\n'
                   'key = "site"\nvalue = "u"\nlg_k = 21\n')
    done = countersink("consume", "--counters", str(big), env={**CASSANDRA_DOWN, **KAFKA_DOWN})
    assert done.returncode == 2, done.stderr
    (line,) = [json.loads(line) for line in error_lines(done)]
    assert line["event"] == "definitions_refused"
    assert "counter 'top_users': with 'traders', sharing rows of topic 't'" in line["error"]
    assert "COUNTERSINK_CASSANDRA__MAX_ROW_BYTES" in line["error"]
    raised = countersink("consume", "--counters", str(big),
                         env={**CASSANDRA_DOWN, **KAFKA_DOWN, "COUNTERSINK_CASSANDRA__MAX_ROW_BYTES": "16777216",
                              "COUNTERSINK_CONSUMER__STARTUP_TIMEOUT_S": "1"})
    assert "definitions_refused" not in raised.stderr


def test_a_counter_reading_the_dead_letter_topic_is_refused_before_any_connection(tmp_path: Path) -> None:
    """A counter over the dead-letter topic would read back every record refused into it and refuse it again,
    without end: ``consume`` exits 2 naming the counter, the topic and the setting, reaching no server; with
    another dead-letter topic the same file gets past the check."""
    looping = tmp_path / "counters.toml"
    looping.write_text('[[counter]]\nname = "refusals"\ntopics = ["orders", "rejects"]\nkind = "count"\n'
                       'key = "k"\n')
    env = {**CASSANDRA_DOWN, **KAFKA_DOWN, "COUNTERSINK_CONSUMER__DEAD_LETTER_TOPIC": "rejects"}
    done = countersink("consume", "--counters", str(looping), env=env)
    assert done.returncode == 2, done.stderr
    (line,) = [json.loads(line) for line in error_lines(done)]
    assert line["event"] == "settings_refused"
    assert line["error"].startswith("refusals reads rejects, the consumer's dead-letter topic "
                                    "(COUNTERSINK_CONSUMER__DEAD_LETTER_TOPIC)")
    elsewhere = countersink("consume", "--counters", str(looping),
                            env={**env, "COUNTERSINK_CONSUMER__DEAD_LETTER_TOPIC": "orders-dead",
                                 "COUNTERSINK_CONSUMER__STARTUP_TIMEOUT_S": "1"})
    assert "settings_refused" not in elsewhere.stderr


def test_a_row_size_problem_is_listed_with_a_field_problem_of_another_counter() -> None:
    """The counters that pass their own checks are checked for row sizes too, whatever another counter's
    problems: one round of mending, not two."""
    with pytest.raises(DefinitionError) as info:
        parse_definitions('[[counter]]\nname = "top_users"\ntopics = ["t"]\nkind = "top_k"\nkey = "s"\n'
                          'value = "u"\nmax_map_size = 8192\n[[counter]]\nname = "traders"\ntopics = ["t"]\n'
                          'kind = "distinct"\nkey = "site"\nvalue = "u"\nlg_k = 21\n'
                          '[[counter]]\nname = "B"\ntopics = ["t"]\nkind = "count"\n', "f.toml")
    problems = info.value.problems
    assert [(p.counter, p.field) for p in problems] == [("'B' (#3)", "name"), ("'top_users'", "")]
    assert "with 'traders', sharing rows of topic 't'" in problems[1].reason


def test_definition_error_carries_every_problem() -> None:
    """``DefinitionError.problems`` holds one entry per problem; the error itself is the first."""
    with pytest.raises(DefinitionError) as info:
        parse_definitions('[[counter]]\nname = "a"\ntopics = ["t"]\nkind = "count"\n'
                          '[[counter]]\nname = "a"\ntopics = ["bad topic"]\nkind = "count"\n'
                          '[[counter]]\nname = "a"\ntopics = ["t"]\nkind = "count"\n', "f.toml")
    problems = info.value.problems
    assert [(p.counter, p.field) for p in problems] == [("'a' (#2)", "topics"), ("'a' (#3)", "name")]
    assert str(info.value).endswith("(and 1 more problems)")


@pytest.mark.parametrize(("line", "keys", "expected"), [
    (b'{"symbol": "IBM", "qty": 1.10}\n', ["symbol"], (b'{"symbol": "IBM", "qty": 1.10}', b"IBM")),
    (b'{"s": "a|b", "u": {"id": 5}}\n', ["s", "u.id"], (b'{"s": "a|b", "u": {"id": 5}}', b"a\\|b|5")),
    (b'{"ok": true}', [], (b'{"ok": true}', None)),
])
def test_publish_sends_each_line_as_written_keyed_by_its_fields(
        line: bytes, keys: list[str], expected: tuple[bytes, bytes | None]) -> None:
    """A line goes as written (its decimals untouched); its key is the fields' values joined by ``|``."""
    assert parse_line(line, keys, 1024) == expected


@pytest.mark.parametrize(("line", "reason"), [
    (b"[1, 2]", "not a JSON object"), (b"{oops", "not JSON"), (b'{"a": 1}', "no field 'symbol'"),
    (b'{"symbol": 1.5}', "not a string, integer or boolean"), (b'{"symbol": "' + b"x" * 2000 + b'"}', "longer"),
    # What the consumer's parser refuses whole (a lone surrogate's escape in any field: in the key, it raised
    # UnicodeEncodeError out of the command, exit 1 with no line number): published, then dead-lettered.
    (b'{"symbol": "a", "note": "\\ud800"}', "not JSON"), (b'{"symbol": "\xff"}', "not JSON"),
    # Nested deeper than the consumer reads (32 levels): it refuses the record whole.
    (b'{"symbol": "a", "n": ' + b'{"x": ' * 32 + b"1" + b"}" * 32 + b"}", "nested deeper than 32 levels"),
])
def test_publish_refuses_a_line_it_cannot_send(line: bytes, reason: str) -> None:
    """A line that is not a JSON object, too long, or without its key field is refused with the reason."""
    with pytest.raises(BadLineError, match=reason):
        parse_line(line, ["symbol"], 1024)


def test_publish_sends_a_first_line_saved_with_a_byte_order_mark_without_it() -> None:
    """A Windows editor saves a file's first line with a byte-order mark, which the consumer's parser refuses:
    the line goes without it (with --key-separator too: the key was sent with it); NaN, which the consumer
    reads in a field no counter reads, goes."""
    assert parse_line(b'\xef\xbb\xbf{"symbol": "a"}\n', ["symbol"], 1024) == (b'{"symbol": "a"}', b"a")
    assert parse_record(b'\xef\xbb\xbfk\t{"a": 1}', LineFormat(key_separator=b"\t"), 1024) == (b'{"a": 1}', b"k", None)
    assert parse_line(b'{"symbol": "a", "v": NaN}', ["symbol"], 1024)[1] == b"a"


def test_publish_takes_the_key_before_a_separator_and_the_time_from_a_field() -> None:
    """``--key-separator``: the text before the first separator is the key, as it is, and not in the value;
    ``--timestamp``: the record's time is the line's integer field (ms), which stays in the value."""
    form = LineFormat(key_separator=b"\t", timestamp_field="at")
    assert parse_record(b'ana|x\t{"at": 1795669200000,\t"k": "a"}\n', form, 1024) == (
        b'{"at": 1795669200000,\t"k": "a"}', b"ana|x", 1795669200000)
    assert parse_record(b'{"a": 1}', LineFormat(), 1024) == (b'{"a": 1}', None, None)
    for line, reason in [(b'{"at": 1}', "no key separator"), (b'k\t{"a": 1}', "timestamp field 'at'"),
                         (b'k\t{"at": 1.5}', "timestamp field"), (b'k\t{"at": -1}', "timestamp field"),
                         (b'k\t{"at": "2026-01-01"}', "timestamp field"), (b"k" * 2000 + b'\t{"at": 1}', "key longer")]:
        with pytest.raises(BadLineError, match=reason):
            parse_record(line, form, 1024)


def test_publish_refuses_a_key_separator_beside_key_fields() -> None:
    """``--key-separator`` takes the place of ``--key``: both, or an empty separator, is a usage error (exit 2)
    before Kafka is asked."""
    for extra in (["--key", "user", "--key-separator", ":"], ["--key-separator", ""]):
        done = countersink("publish", "t", "-", *extra, env=KAFKA_DOWN, stdin='a:{"b": 1}\n')
        assert done.returncode == 2, done.stderr
        assert "takes the place of --key" in done.stderr


@pytest.mark.parametrize(("command", "complaint"), [
    (["get", "shares", "\\"], "bad escape in instance key"),
    (["get", "shares", "a\\"], "bad escape in instance key 'a\\\\' (a \\ in a key is written \\\\"),
    (["get", "shares", "caf\udce9"], "an argument is not UTF-8 text"),
])
def test_keys_no_event_can_have_are_usage_errors(command: list[str], complaint: str) -> None:
    """A lone backslash (no instance key) and bytes that are no UTF-8 are refused as arguments, exit 2,
    before anything connects, where they ended the command as a failure (exit 1) after connecting."""
    done = subprocess.run([sys.executable, "-m", "countersink.cli", *command], cwd=REPO, capture_output=True,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("COUNTERSINK_")},
                               **CASSANDRA_DOWN, **KAFKA_DOWN}, timeout=120)
    assert done.returncode == 2, done.stderr
    assert complaint in done.stderr.decode(errors="replace")


def test_a_page_token_no_listing_printed_is_a_usage_error() -> None:
    """A well-formed base64 token that holds no listing's position is refused as a usage error (exit 2)."""
    from countersink.cli import describe_failure
    from countersink.reader import PageTokenError, _split_token

    with pytest.raises(PageTokenError) as refused:
        _split_token(b"\x00\x00\x00")
    assert describe_failure(refused.value, Settings())[0] == 2
    with pytest.raises(PageTokenError):
        _split_token(b"\x00\x00\x00\x02\x01\xff\xfe")


def test_a_reader_gone_from_the_output_ends_the_command_quietly() -> None:
    """Output piped into `head` that stops reading: exit 141 (as SIGPIPE would), no command_failed line. (In
    a child process: the command configures logging for its own streams.)"""
    script = ("import countersink.cli as cli\n"
              "parser, runners = cli.build_parser()\n"
              "def reader_gone(args, settings):\n"
              "    raise BrokenPipeError(32, 'Broken pipe')\n"
              "cli.build_parser = lambda: (parser, {**runners, 'get': reader_gone})\n"
              "raise SystemExit(cli.main(['get', 'shares', 'IBM']))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("COUNTERSINK_")},
                               "COUNTERSINK_LOG_FORMAT": "json"})
    assert done.returncode == 141, done.stderr
    assert "command_failed" not in done.stderr


@pytest.mark.parametrize("key", ["IBM", "a\\|b", "", "it's", "C:\\path|2026-11-27T10:00Z", "line\nbreak", "tab\tx",
                                 "a\u2028b", "日本|x", "no\u00a0break", "soft\u00adhyphen", "c1\x85"])
def test_a_printed_key_pasted_into_a_shell_is_the_key(key: str) -> None:
    """get, explain and reset print a key so that a shell gives it back: a repr doubled its backslashes
    (``'a\\\\|b'`` read another instance) and printed the empty key as nothing in reset's line."""
    from countersink.cli import quoted_key

    printed = quoted_key(key)
    assert "\n" not in printed
    back = subprocess.run(["bash", "-c", f"printf %s {printed}"], capture_output=True, check=True, timeout=10,
                          env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})  # a UTF-8 terminal's
    assert back.stdout.decode() == key


def test_list_prints_a_key_a_line_and_quotes_the_ones_no_one_could_tell_apart() -> None:
    """``list`` prints keys as they are, for pipes, but quotes one that would print as a blank line, or whose
    leading or trailing spaces no one sees (`` lead`` and ``lead`` read alike), and one that does not print."""
    from countersink.cli import quoted_key
    from countersink.read_cli import listed_key

    for looks_quoted in ("''", "$'x'", "'a b'"):
        assert listed_key(looks_quoted) == quoted_key(looks_quoted) != looks_quoted

    assert [listed_key(key) for key in ("IBM", "a\\|b", "two words")] == ["IBM", "a\\|b", "two words"]
    assert [listed_key(key) for key in ("", " ", " lead", "trail ", "line\nbreak")] == [
        "''", "' '", "' lead'", "'trail '", "$'line\\x0abreak'"]


@pytest.mark.parametrize(("args", "said"), [
    (["gc", "--every", "-5m"], "expected one argument (for a value starting with '-', write --every=VALUE)"),
    (["gc", "--every=-5m"], "'-5m' is not a duration"),
])
def test_a_value_starting_with_a_dash_is_said_how_to_give(args: list[str], said: str) -> None:
    """argparse takes ``-5m`` for an option and said only "expected one argument"; the error says how such a
    value is given, and given so, the value's own refusal is said."""
    done = countersink(*args)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr


@pytest.mark.parametrize("keys", [["-x", "S1", "a b"], ["--", "-"], []])
def test_the_command_that_completes_a_reset_parses_back_to_its_keys(keys: list[str]) -> None:
    """A reset cut short prints the command that completes it: keys starting with "-" were read back as options
    (argparse refused the command it had printed)."""
    line = reset_cli._again("shares", keys, "K1")
    parser, _ = cli.build_parser()
    args, extra = parser.parse_known_args(shlex.split(line)[1:])
    if extra:
        args = cli._late_positionals(parser, args, extra)
    assert (args.counter, args.keys, args.idempotency_key) == ("shares", keys, "K1")
