"""``countersink``: one command line for every process. Each subcommand lives with its package.

Exit codes, the same for every subcommand: 0 done; 1 failed (a server unreachable, with the address tried,
or a request refused); 2 usage or settings error (a bad argument, variable or definitions file, or an unknown
counter); 3 ``gc --once`` deferred some instances; 130 interrupted. Every error is one line on stderr; the
traceback only with ``--debug`` or ``COUNTERSINK_LOG_LEVEL=DEBUG``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from pathlib import Path

    from countersink.settings import Settings
    from schemas.definitions import CounterSet

EXIT_FAILED = 1
EXIT_USAGE = 2

# subcommand -> (module, help). A module provides ``add_arguments(parser)`` and ``run(args, settings) -> int``,
# or, when it serves several subcommands, ``add_<name>_arguments`` and ``run_<name>``.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "schema": ("countersink.schema_cli", "create the keyspace and tables (idempotent)"),
    "topics": ("countersink.topics_cli", "create the Kafka topics a definitions file names (idempotent)"),
    "publish": ("countersink.publish_cli", "publish JSON lines from a file or stdin to a Kafka topic"),
    "consume": ("consumer.cli", "consume events and keep the counters"),
    "gc": ("gc_worker.cli", "fold shards of retired mutators into tallies"),
    "retire-orphans": ("gc_worker.cli", "retire mutators of partitions that no longer exist, so GC can fold them"),
    "get": ("countersink.read_cli", "print the value of one counter instance"),
    "explain": ("countersink.read_cli", "show why an instance's value is what it is: tally, shards, mutators"),
    "list": ("countersink.read_cli", "list the instances of a counter, a page at a time"),
    "serve": ("countersink.serve", "serve counters over HTTP as JSON (with an OpenAPI description)"),
    "reset": ("countersink.reset_cli", "count a counter (or some of its keys) again from now on"),
    "dead-letters": ("countersink.dead_letters_cli",
                     "re-publish a dead letter to its topic, for the counters that refused it only"),
    "drop": ("countersink.commands.drop", "drop a counter: its registry entry and every row of it"),
    "trace": ("countersink.commands.trace", "show what one record did in each counter on its topic"),
    "backfill": ("countersink.commands.backfill",
                 "count a counter with since over the retained log, up to where the live consumers count it from"),
    "reprocess": ("countersink.commands.backfill", "reset a counter, then count it again from a time"),
}

# Commands whose output is for a person: on a terminal they log only warnings and errors, one plain line each.
PERSON_COMMANDS = frozenset({"get", "explain", "list", "trace"})

DESCRIPTION = """\
Exact counters from a Kafka event stream, kept as CRDT shards in Cassandra.

Settings come from COUNTERSINK_* environment variables (or a .env file); `countersink COMMAND --help`
describes each command."""

EPILOG = """\
exit codes:
  0    done
  1    failed: a server unreachable (the address tried is named) or a request refused
  2    usage or settings error: a bad argument, variable or definitions file, an unknown counter
  3    gc --once: some instances were deferred; run again later
  130  interrupted (Ctrl-C)"""


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error said in one line (and exit code 2) instead of the whole usage."""

    def error(self, message: str) -> NoReturn:
        if message.endswith("expected one argument"):
            # argparse takes a value starting with '-' (--every -5m, --grace -1s) for an option, and says only
            # that the option has none: say how such a value is given.
            option = message.removeprefix("argument ").partition(":")[0].split("/")[-1]
            message += f" (for a value starting with '-', write {option}=VALUE)"
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default shown as its value (unless it has none)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default:" in text or default in (None, False, [], argparse.SUPPRESS)
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


def setting_default(dotted: str) -> str:
    """``(default: VALUE, from COUNTERSINK_SECTION__NAME)`` for an option that overrides a setting."""
    from countersink.settings import Settings

    section, _, name = dotted.rpartition(".")
    # The section classes are plain models: built with no arguments, they hold the defaults (no environment).
    section_class: Any = Settings.model_fields[section].annotation if section else None
    value = getattr(section_class(), name) if section_class is not None else Settings.model_fields[name].default
    variable = "COUNTERSINK_" + "__".join(part.upper() for part in dotted.split("."))
    shown = f"{value:g}s" if name.endswith("_s") and isinstance(value, float) else value
    if variable in os.environ:  # the help must not show a default the environment overrides (nor its value)
        return f"(default: {variable}, set in this environment; {shown} where it is not)"
    return f"(default: {shown}, from {variable})"


# The largest count an option takes: Kafka's and Cassandra's counts and offsets in requests are 32-bit.
MAX_OPTION_INT = 2**31 - 1


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 and at most :data:`MAX_OPTION_INT`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    if value > MAX_OPTION_INT:
        raise argparse.ArgumentTypeError(f"{text} is more than {MAX_OPTION_INT:,}")
    return value


def consistency_level(text: str) -> Any:
    """An argparse type: a Cassandra consistency level, in any case; a wrong one lists them."""
    from countersink.settings import Consistency

    try:
        return Consistency(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a consistency level: {', '.join(Consistency)}") from None


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (0..65535)")
    return value


def counter_name(text: str) -> str:
    """An argparse type: a counter name as definitions allow them (checked before anything connects)."""
    from schemas.definitions import NAME_PATTERN

    if not NAME_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a counter name ({NAME_PATTERN.pattern})")
    return text


def instance_key(text: str) -> str:
    """An argparse type: an instance key of at most 1 KiB of UTF-8, escaped as instance keys are."""
    from schemas.errors import MalformedInstanceKeyError
    from schemas.events import DEFAULT_MAX_KEY_BYTES, decode_instance_key

    if len(text.encode("utf-8", "surrogatepass")) > DEFAULT_MAX_KEY_BYTES:
        raise argparse.ArgumentTypeError(f"an instance key is at most {DEFAULT_MAX_KEY_BYTES} bytes of UTF-8")
    try:
        decode_instance_key(text)  # a lone backslash, a dangling or an unknown escape
    except MalformedInstanceKeyError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a \\ in a key is written \\\\, a | inside a field \\|)") from None
    return text


def quoted_key(key: str) -> str:
    """An instance key as a command prints it: quoted so that, pasted into a POSIX shell, it gives the key back
    (``'a\\|b'`` for the key ``a\\|b``, where a repr doubled its backslash and named another instance; ``''``
    for the empty key); one holding a character that does not print (a newline, a no-break space) in bash's
    ``$'...'``, each such character escaped by its code point (``\\u00a0``: bash writes it in UTF-8, in a UTF-8
    locale), so that it stays on one line. (A NUL, which no shell argument can carry, is printed as ``\\x00``.)"""
    if key.isprintable():
        return "'" + key.replace("'", "'\\''") + "'"
    escaped = "".join(ch if ch.isprintable() and ch not in "\\'" else
                      "\\" + ch if ch in "\\'" else f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else
                      f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}" for ch in key)
    return f"$'{escaped}'"


def load_definitions_or_refuse(path: Path | str, max_row_bytes: int | None = None) -> CounterSet | None:
    """The definitions file, or None after one ``definitions_refused`` log line per problem, each naming the
    file, counter and field (the caller exits 2, as for any usage error). Counters whose shared shard rows
    could outgrow ``max_row_bytes`` (``COUNTERSINK_CASSANDRA__MAX_ROW_BYTES``) are refused too."""
    from countersink.logs import get_logger
    from schemas.definitions import load_definitions
    from schemas.errors import DefinitionError

    try:
        return load_definitions(path, max_row_bytes=max_row_bytes)
    except DefinitionError as exc:
        for problem in exc.problems:
            get_logger(__name__).error("definitions_refused", error=problem.line)
        return None


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace, Settings], int]]]:
    """The command line, and each subcommand's runner."""
    from importlib.metadata import version

    parser = Parser(prog="countersink", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('countersink')}")
    parser.add_argument("--debug", action="store_true",
                        help="log at DEBUG and show the traceback of an error (as COUNTERSINK_LOG_LEVEL=DEBUG)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    runners: dict[str, Callable[[argparse.Namespace, Settings], int]] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # a part not built yet is simply not offered
        command = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        ident = name.replace("-", "_")
        add_arguments = getattr(module, f"add_{ident}_arguments", None) or module.add_arguments
        add_arguments(command)
        runners[name] = getattr(module, f"run_{ident}", None) or module.run
    return parser, runners


def main(argv: list[str] | None = None) -> int:
    _remember_early_stop()
    # Imported here, after the handler above, because these imports are most of a process's start-up time.
    from pydantic import ValidationError

    from countersink.logs import configure_logging, get_logger
    from countersink.settings import Settings

    parser, runners = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        args = _late_positionals(parser, args, extra)
    for given in sys.argv[1:] if argv is None else argv:
        try:
            given.encode()
        except UnicodeEncodeError:  # bytes that are no UTF-8, kept by Python as lone surrogates
            parser.error("an argument is not UTF-8 text: counter names, keys and paths are read as UTF-8")
    debug = args.debug or os.environ.get("COUNTERSINK_LOG_LEVEL", "").upper() == "DEBUG"
    try:
        settings = Settings()
    except ValidationError as exc:
        configure_logging("DEBUG" if debug else "INFO", os.environ.get("COUNTERSINK_LOG_FORMAT", "auto").lower(),
                          no_color=bool(os.environ.get("NO_COLOR")), person=args.command in PERSON_COMMANDS)
        for line in settings_problems(exc):
            get_logger(__name__).error("settings_refused", error=line)
        return EXIT_USAGE
    if args.debug:
        settings = settings.model_copy(update={"log_level": "DEBUG"})
    debug = settings.log_level == "DEBUG"  # from the environment or .env, in any case, as --debug
    configure_logging(settings.log_level, settings.log_format, no_color=settings.no_color,
                      person=args.command in PERSON_COMMANDS)
    warn_insecure(settings)
    try:
        return runners[args.command](args, settings)
    except BrokenPipeError:
        # The reader of the output went away (| head): as a command killed by SIGPIPE, without a word.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        if debug:
            raise
        code, line = describe_failure(exc, settings)
        get_logger(__name__).error("command_failed", command=args.command, error=line)
        return code


def _late_positionals(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]
                      ) -> argparse.Namespace:
    """Positionals given after an option, for a command whose last positional takes any number (``reset C
    --json K``, ``reset C --idempotency-key X -- -K``): argparse gives such a positional the ones before the
    first option only (none: then it is taken as given empty) and refuses the rest. Added to it, checked by its
    type; anything else left over (an unknown option) is refused as argparse refuses it."""
    late = getattr(args, "late_positionals", None)
    after_dashes = extra[0] == "--"
    given = extra[1:] if after_dashes else extra
    if late is None or (not after_dashes and any(text.startswith("-") for text in given)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    name, convert, metavar = late
    try:
        values = [convert(text) for text in given]
    except argparse.ArgumentTypeError as exc:
        parser.error(f"argument {metavar}: {exc}")
    setattr(args, name, [*getattr(args, name), *values])
    return args


def warn_insecure(settings: Settings) -> None:
    """One WARNING line for each protection the settings give up: credentials sent without TLS (which
    ``allow_insecure`` must allow), a server certificate or host name left unchecked."""
    from countersink.logs import get_logger

    for event, fields in settings.insecure_choices():
        get_logger(__name__).warning(event, **fields)


def settings_problems(exc: Any) -> list[str]:
    """One line per refused setting, naming its variable; never its value (it may be a secret)."""
    lines = []
    for err in exc.errors():
        if err["type"] == "untrusted_settings_file":  # a file, not a variable
            lines.append(f"{err['loc'][0]}: {err['msg']}")
            continue
        # NO_COLOR is the cross-tool variable (no-color.org), read without the prefix
        variable = "NO_COLOR" if tuple(err["loc"]) == ("NO_COLOR",) else "COUNTERSINK_" + "__".join(
            str(part).upper() for part in err["loc"])
        lines.append(f"{variable}: {err['msg'].removeprefix('Value error, ')}")
    return lines


def describe_failure(exc: BaseException, settings: Settings) -> tuple[int, str]:
    """The exit code and the one line an error ends a command with."""
    from countersink.cassandra import CassandraError
    from countersink.consistency import ConsistencyError
    from countersink.reader import PageTokenError
    from countersink.settings import OptionRefusedError
    from schemas.errors import DefinitionError, MalformedInstanceKeyError
    from schemas.timeseries import TimeRangeError

    if isinstance(exc, DefinitionError | ConsistencyError | TimeRangeError | OptionRefusedError | PageTokenError
                  | MalformedInstanceKeyError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, CassandraError):
        return EXIT_FAILED, str(exc)
    from aiokafka.errors import KafkaError

    if isinstance(exc, KafkaError):
        servers = ",".join(settings.kafka.bootstrap_servers)
        text = str(exc) if str(exc).startswith(type(exc).__name__) else f"{type(exc).__name__}: {exc}"
        return EXIT_FAILED, f"Kafka at {servers}: {text}".rstrip(": ")
    if isinstance(exc, OSError):
        return EXIT_FAILED, f"{type(exc).__name__}: {exc}"
    from schemas.errors import CountersinkError

    if isinstance(exc, CountersinkError):
        # A refused login, an untrusted certificate, an unreadable key: one line that says what to check.
        return EXIT_FAILED, str(exc)
    return EXIT_FAILED, f"{type(exc).__name__}: {exc} (--debug shows the traceback)"


def run_async(coroutine: Coroutine[Any, Any, int | None], *, graceful: bool = False) -> int:
    """Run a subcommand's coroutine; Ctrl-C ends it with the conventional exit code 130.

    ``graceful`` commands stop cleanly on SIGTERM through :func:`stop_on_signals`, including a SIGTERM
    that came while the process was starting; any other command gets the default action back first.
    """
    if not graceful:
        _forget_early_stop()
    try:
        result = asyncio.run(coroutine)
    except KeyboardInterrupt:
        return 130
    finally:
        _forget_early_stop()
    return int(result or 0)


# A SIGTERM that arrives while a process is still importing, connecting or joining its group (an orchestrator
# scaling down a pod that has just started) is remembered rather than fatal, so that a long-running command
# still releases what it holds and exits 0.
_early_stop: list[int] = []


def _remember_early_stop() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: _early_stop.append(signum))


def _forget_early_stop() -> None:
    """Give SIGTERM its default action back; deliver one that was remembered and not acted upon."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _early_stop:
            signal.raise_signal(_early_stop.pop())


@contextlib.contextmanager
def stop_on_signals(callback: Callable[[], object]) -> Iterator[None]:
    """Call ``callback`` on SIGTERM or SIGINT while the block runs, and at once if a SIGTERM came earlier."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, callback)
    if _early_stop:
        _early_stop.clear()
        callback()
    try:
        yield
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)


if __name__ == "__main__":
    # Run as ``python -m countersink.cli``, this file is module __main__, and the modules the commands import
    # load it again as countersink.cli: the command must run in that one, whose state (a SIGTERM remembered
    # while starting) they share.
    from countersink.cli import main as main_of_the_package

    sys.exit(main_of_the_package())
