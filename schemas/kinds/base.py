"""The one small interface every CRDT kind implements, and the stored-bytes header they share.

Stored state is ``<<TAG:8, VERSION:8, body>>`` (riak_dt's habit). A reader that sees a tag it did not
expect raises :class:`UnknownStateTagError`; a known tag with a version it cannot read raises
:class:`UnsupportedStateVersionError`. A format is never changed in place: a new layout gets a new version
number, the old version stays readable, and golden vectors of every version live under ``tests/golden``.

States are mutable because the consumer's hot path applies millions of values in place. ``apply`` trusts
its argument: :class:`schemas.events.EventRouter` has already checked the type and range, so the kinds do
not pay for a second check per value.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Self

from schemas.errors import CorruptStateError, UnknownStateTagError, UnsupportedStateVersionError

if TYPE_CHECKING:
    from schemas.kinds._codec import Reader

NumberMode = Literal["integer", "decimal", "float"]

# The number mode's byte in stored bodies (sum, min, max, mean, variance): part of every such format, so
# defined once. Adding a mode means adding a byte here, never renumbering one.
NUMBER_MODE_BYTES: dict[NumberMode, int] = {"integer": 0, "decimal": 1, "float": 2}
_NUMBER_MODES: dict[int, NumberMode] = {byte: mode for mode, byte in NUMBER_MODE_BYTES.items()}


def read_number_mode(reader: Reader, kind: str) -> NumberMode:
    """Read a body's number-mode byte; an unknown byte is corrupt state."""
    byte = reader.byte()
    mode = _NUMBER_MODES.get(byte)
    if mode is None:
        raise CorruptStateError(f"unknown {kind} number mode {byte}")
    return mode

# Larger than any body a supported configuration writes (an HLL_8 sketch at lg_k 21 is 2 MiB, a KLL
# sketch at k 65535 a few MiB), small enough that a corrupt blob cannot make a reader allocate without bound.
MAX_STATE_BYTES = 16 * 1024 * 1024
# The tag and version bytes in front of every body.
HEADER_SIZE = 2


@dataclass(frozen=True, slots=True)
class KindSpec:
    """What a kind needs from a counter definition to create an empty state."""

    kind: str
    number: NumberMode = "integer"
    lg_k: int = 12
    k: int = 200
    lg_max_map_size: int = 8
    top: int = 10


class State(abc.ABC):
    """One instance's CRDT state: apply values, merge other replicas, read the value, store as bytes."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # mutable: never a dict key

    kind: ClassVar[str]
    tag: ClassVar[int]
    version: ClassVar[int] = 1

    @abc.abstractmethod
    def apply(self, value: object) -> None:
        """Fold one event's value (already checked by the router) into this state."""

    @abc.abstractmethod
    def merge(self, other: Self) -> None:
        """Fold another replica of the same instance into this one; ``other``'s value is left unchanged.

        For count, sum, mean, variance, quantiles and top_k this is addition of disjoint replicas (one
        shard per mutator), so merging a state into itself counts it twice: idempotence comes from the
        storage layout (each mutator overwrites only its own shard with whole state), not from merge.
        min, max and distinct are semilattices and merge idempotently. The KLL library may sort
        ``other``'s buffer while merging, which can change a flag in its bytes but never its value.
        """

    @abc.abstractmethod
    def copy(self) -> Self:
        """Return an independent state equal to this one."""

    @classmethod
    def merged(cls, states: Sequence[Self]) -> Self:
        """One state merging every state of ``states`` (not empty), which are left unchanged. A kind whose
        library merges many at once cheaper than pair by pair overrides it."""
        result = states[0].copy()
        for other in states[1:]:
            result.merge(other)
        return result

    def check(self) -> None:
        """Raise :class:`CorruptStateError` when the library could not list what this state holds. A kind
        whose decoding checks every item a sketch holds (quantiles, top_k) makes that check here, and skips it
        when it decodes the states of a merge (``state_to_merge``): the merge is checked once instead."""
        return  # the other kinds' decoding checks everything it reads

    @abc.abstractmethod
    def value(self) -> object:
        """Return what a reader sees: a number, ``None`` for "no value yet", or an estimate object."""

    @abc.abstractmethod
    def size_bytes(self) -> int:
        """Return an estimate of the memory this state holds, for the mutator's memory budget."""

    @abc.abstractmethod
    def _body(self) -> bytes:
        """Return the stored body that follows the tag and version bytes."""

    def to_bytes(self) -> bytes:
        """Return ``<<tag, version, body>>``; equal exact states give equal bytes."""
        return bytes((self.tag, self.version)) + self._body()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.value()!r}>"


def split_header(data: bytes, tag: int, versions: frozenset[int]) -> tuple[int, memoryview]:
    """Check the tag, version and overall size of stored bytes; return the version and the body."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CorruptStateError(f"state must be bytes, not {type(data).__name__}")
    if len(data) < 2:
        raise CorruptStateError(f"state of {len(data)} bytes has no header")
    if len(data) > MAX_STATE_BYTES:
        raise CorruptStateError(f"state of {len(data)} bytes exceeds the {MAX_STATE_BYTES}-byte limit")
    if data[0] != tag:
        raise UnknownStateTagError(f"state tag {data[0]} is not the expected tag {tag}")
    if data[1] not in versions:
        raise UnsupportedStateVersionError(
            f"state tag {tag} has format version {data[1]}; this build reads {sorted(versions)}"
        )
    return data[1], memoryview(data)[2:]
