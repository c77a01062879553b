"""Every exception countersink raises on purpose derives from :class:`CountersinkError`.

Pure code raises these; the I/O layers decide whether to retry, dead-letter or stop. ``retriable`` says
whether trying the same operation again can succeed.
"""

from __future__ import annotations


class CountersinkError(Exception):
    """Root of every error countersink raises on purpose."""

    retriable = False


class DefinitionError(CountersinkError):
    """Raised when a counter definitions file is refused; the message names the file, counter and field.

    Its attributes describe the first problem; ``problems`` holds every problem found in the file (this one
    first), so that one run shows them all."""

    def __init__(self, source: str, counter: str, field: str, reason: str,
                 more: tuple[DefinitionError, ...] = ()) -> None:
        self.source = source
        self.counter = counter
        self.field = field
        self.reason = reason
        self.problems: tuple[DefinitionError, ...] = (self, *more)
        # A [[topic]] table's problems name the table ("[[topic]] 't' (#1)"), a [[counter]]'s the counter.
        where = source
        if counter:
            where += f": {counter}" if counter.startswith("[[") else f": counter {counter}"
        if field:
            where += f", field {field!r}"
        self.line = f"{where}: {reason}"
        super().__init__(self.line + (f" (and {len(more)} more problems)" if more else ""))


class DefinitionChangedError(DefinitionError):
    """Raised when a consumer starts with a counter whose meaning differs from the definition recorded in the
    counter registry under the same name; every changed counter is one of ``problems``."""


class GroupMismatchError(DefinitionError):
    """Raised when a consumer starts in a consumer group other than the one the counter registry records for
    its counters: a second group would count the retained log again into the same values. ``groups`` maps
    each recorded group to the counters it holds."""

    def __init__(self, source: str, reason: str, groups: dict[str, tuple[str, ...]]) -> None:
        super().__init__(source, "", "", reason)
        self.groups = groups


class CounterDroppedError(DefinitionError):
    """Raised when a consumer starts with, or is still counting, a counter that ``countersink drop`` removed:
    its name stays refused until the drop is released (``countersink drop NAME --forget``)."""


class RowTooLargeError(DefinitionError):
    """Raised when a definitions file is loaded whose counters, sharing a shard row, could together write a
    row larger than ``max_row_bytes`` (or one counter's state could outgrow what a state may be): ``counters``
    names them, ``bound`` is the largest size in bytes."""

    def __init__(self, source: str, counter: str, field: str, reason: str,
                 more: tuple[DefinitionError, ...] = (), *, counters: tuple[str, ...] = (), bound: int = 0) -> None:
        super().__init__(source, counter, field, reason, more)
        self.counters = counters
        self.bound = bound


class CompactedTopicError(CountersinkError):
    """Raised when a counter that drops publisher retries by event id would count a topic whose
    ``cleanup.policy`` includes ``compact``: the log cleaner may remove an original that its retry (same
    message key) superseded, and an owner rebuilding its retry window from the log would then count the
    retry again. ``topics`` maps each such topic to the counters refused on it."""

    def __init__(self, topics: dict[str, tuple[str, ...]], policies: dict[str, str]) -> None:
        self.topics = topics
        self.policies = policies
        self.lines = tuple(
            f"topic {topic!r} has cleanup.policy={policies[topic]}, and counter{'s' if len(names) > 1 else ''} "
            f"{', '.join(repr(n) for n in names)} drop{'' if len(names) > 1 else 's'} publisher retries by "
            "event_id: compaction can remove an original whose retry superseded it, and the retry would be "
            "counted again after a takeover. Set the topic's cleanup.policy to delete, or count it with "
            "counters without event_id"
            for topic, names in sorted(topics.items()))
        super().__init__("; ".join(self.lines))


class InvalidEventError(CountersinkError):
    """Raised when an event cannot be turned into updates for a counter (``counter`` names it), or at all
    (``counter`` is ``None``: unparseable, oversized, too deep); the event goes to the dead-letter topic.

    ``path`` is the dotted field path ("" for the whole event), ``reason`` says what is wrong.
    """

    counter: str | None = None

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path or '<event>'}: {reason}")

    def as_refusal_of(self, counter: str) -> InvalidEventError:
        """This refusal as ``counter``'s, without a traceback: itself, or a copy when another counter's already
        (one error read from a record's key, kept and raised to every counter that reads it, named each
        counter in turn: every refusal then named the last)."""
        error = self
        if self.counter not in (None, counter):
            error = type(self).__new__(type(self), *self.args)  # its path, reason and the rest, as attributes
            error.__dict__.update(self.__dict__)
        error.counter = counter
        return error.with_traceback(None)


class UnparseableEventError(InvalidEventError):
    """Raised when an event is not JSON, not UTF-8, too deeply nested, or not a JSON object."""


class OversizedEventError(InvalidEventError):
    """Raised when an event is larger than the router's ``max_event_bytes``."""


class UndecidableRecordError(InvalidEventError):
    """Raised (for the dead-letter topic) when deciding a record raised what no refusal should: a defect of
    countersink's, met on this record's bytes. Deciding a record is pure, so it would raise again at every
    restart and stop its partition for good; the record is a dead letter instead, to re-publish once fixed."""


class UnaddressedEventError(InvalidEventError):
    """Raised when a record's ``countersink.apply-to`` header names no counter at all (empty, or no name a
    counter can have): no consumer would count it, so it is refused as a whole rather than filtered by every
    counter and lost without a word."""


class MissingFieldError(InvalidEventError):
    """Raised when a key, value, event-id or bucket field is absent or null. The event then does not apply
    to the counter (it is skipped for it), unless the counter is ``required`` or the field is its event id:
    then the counter refuses it. ``code`` names the case for metrics: ``key_missing``, ``value_null``, ..."""

    def __init__(self, path: str, reason: str, code: str = "missing") -> None:
        super().__init__(path, reason)
        self.code = code


class WrongTypeError(InvalidEventError):
    """Raised when a field holds a JSON type the counter does not accept (``"500"`` where a number is due)."""


class ValueOutOfRangeError(InvalidEventError):
    """Raised when a field has the right type but an unusable value (non-finite, too large, bad Unicode)."""


class FutureEventTimeError(ValueOutOfRangeError):
    """Raised when a bucketed counter's event time is later than its record's Kafka timestamp by more than the
    router's ``max_future_skew_s``: a clock or a field gone wrong, not an event of a bucket yet to come."""


class UnstorableTimeError(ValueOutOfRangeError):
    """Raised when the bucket of a counter with ``retain`` would end after the last expiry Cassandra stores
    (``schemas.cql.LAST_EXPIRY_S``, 2038-01-18T03:14:07Z): no row of it could be kept until it is over."""


class KeyTooLongError(InvalidEventError):
    """Raised when an encoded instance key is longer than the router's key limit."""


class CountersRefusedError(InvalidEventError):
    """Returned (not raised) by the applier for an event that one or more counters refused while the others
    decided for themselves: ``refusals`` holds each refusing counter's own error (``counter`` set), in the
    order of the definitions file. ``path``, ``reason`` and ``counter`` are the first refusal's."""

    def __init__(self, refusals: tuple[InvalidEventError, ...]) -> None:
        first = refusals[0]
        super().__init__(first.path, first.reason)
        self.counter = first.counter
        self.refusals = refusals

    @property
    def refused_by(self) -> tuple[str, ...]:
        """The names of the counters that refused the event."""
        return tuple(r.counter for r in self.refusals if r.counter is not None)


class NotRepublishableError(CountersinkError):
    """Raised when a dead letter cannot be re-published as it is (not one countersink wrote, or cut short
    and no fixed payload given)."""


class UnknownStateTagError(CountersinkError):
    """Raised when stored state bytes carry a kind tag this build does not know, or not the expected one."""


class UnsupportedStateVersionError(CountersinkError):
    """Raised when stored state bytes carry a known kind tag but a format version this build cannot read."""


class CorruptStateError(CountersinkError):
    """Raised when stored state bytes are truncated, oversized or otherwise not a valid body."""


class IncompatibleStateError(CountersinkError):
    """Raised when merging two states of one kind whose parameters cannot combine (integer vs decimal sum)."""


class MalformedInstanceKeyError(CountersinkError):
    """Raised by ``decode_instance_key`` for text that no ``encode_instance_key`` call can produce."""
