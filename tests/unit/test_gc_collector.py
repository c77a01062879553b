"""The GC's decisions, one at a time, on the in-memory store (the model test runs it under faults)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import uuid
from collections.abc import Mapping

import pytest

from consumer.storage import MutatorEntry, PartitionId, PartitionRow, ShardWrite
from gc_worker.cli import parse_duration
from gc_worker.collector import Collector, GcReport, KeyView, RegistryEntry, ShardView
from gc_worker.orphans import find_orphans
from schemas.definitions import parse_definitions
from schemas.kinds import new_state, state_from_bytes
from tests.unit import memory_store
from tests.unit.memory_store import MemoryStore, Op, StoreTimeoutError, Task, run

COUNTERS = parse_definitions("""
[[counter]]
name = "likes"
topics = ["likes"]
kind = "count"
key = ["post"]

[[counter]]
name = "top_qty"
topics = ["likes"]
kind = "max"
key = ["post"]
value = "n"
""")
GRACE_US = 1_000
NOW_US = 10_000_000


def count_state(n: int) -> bytes:
    state = new_state(COUNTERS["likes"])
    for _ in range(n):
        state.apply(1)
    return state.to_bytes()


def add_mutator(store: MemoryStore, *, born_us: int, retired_us: int | None, shards: dict[str, int],
                seq: int = 1) -> uuid.UUID:
    """A mutator that wrote count shards (key -> count) at born_us + seq and was retired at ``retired_us``."""
    mutator = uuid.uuid4()
    store.mutators[mutator] = MutatorEntry(mutator, "g", "likes", 0, "h", born_us, born_us + 3_600_000_000,
                                            retired_us)
    for key, n in shards.items():
        store.land(mutator, born_us, born_us + seq, ShardWrite("likes", key, count_state(n), 10, True))
        store.work.add((mutator, "likes", key))
    return mutator


def count_of(data: bytes) -> int:
    counted = state_from_bytes(data).value()
    assert isinstance(counted, int)
    return counted


def value(store: MemoryStore, key: str) -> int:
    """What a reader sees: the tally plus every visible shard."""
    view = store.snapshot("likes", key)
    return (count_of(view.tally) if view.tally else 0) + sum(count_of(s.state) for s in view.shards)


def collect(store: MemoryStore, **options: object) -> GcReport:
    collector = Collector(store, GRACE_US, concurrency=1, **options)  # type: ignore[arg-type]
    report: GcReport = run(collector.run(NOW_US))
    return report


def test_folds_final_shards_and_leaves_live_ones() -> None:
    """Shards of mutators retired past the grace are folded; live and recent ones stay, values unchanged."""
    store = MemoryStore()
    old = add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 3, "b": 1})
    live = add_mutator(store, born_us=5_000_000, retired_us=None, shards={"a": 2})
    recent = add_mutator(store, born_us=6_000_000, retired_us=NOW_US - GRACE_US // 2, shards={"a": 4})
    before = {k: value(store, k) for k in ("a", "b")}

    report = collect(store)

    assert {k: value(store, k) for k in ("a", "b")} == before == {"a": 9, "b": 1}
    assert {s.mutator for s in store.snapshot("likes", "a").shards} == {live, recent}
    assert store.snapshot("likes", "b").shards == ()
    assert store.collected == {old: NOW_US}
    assert (report.mutators_final, report.mutators_waiting, report.mutators_collected) == (1, 1, 1)
    assert (report.instances_folded, report.shards_deleted, report.instances_deferred) == (2, 2, 0)
    # The tally carries the latest retire time among what it folded.
    assert store.tallies[("likes", "a")].ts == 2_000_000

    again = collect(store)
    assert (again.mutators_final, again.instances_folded) == (0, 0)
    assert {k: value(store, k) for k in ("a", "b")} == before


def test_one_batch_folds_every_final_shard_of_an_instance() -> None:
    """All final shards of an instance go into the tally in one batch, at the latest retire time."""
    store = MemoryStore()
    add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 3})
    add_mutator(store, born_us=3_000_000, retired_us=4_000_000, shards={"a": 5})
    report = collect(store)
    assert (report.mutators_collected, report.instances_folded, report.shards_deleted) == (2, 1, 2)
    assert store.tallies[("likes", "a")].ts == 4_000_000
    assert value(store, "a") == 8


def test_the_gc_deletes_by_ranges_of_birth_between_live_mutators() -> None:
    """Folded rows go by range tombstones over birth times, cut at the births of mutators still live (and
    at the cutoff); once the live one retires, the next run's single range covers all of them."""
    store = MemoryStore()
    add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 3})
    live = add_mutator(store, born_us=2_000, retired_us=None, shards={"a": 2})
    add_mutator(store, born_us=3_000, retired_us=2_000_000, shards={"a": 4})
    cutoff = NOW_US - GRACE_US
    report = collect(store)
    assert (report.mutators_collected, report.shards_deleted) == (2, 2)
    assert [s.mutator for s in store.snapshot("likes", "a").shards] == [live]
    assert [(t.after, t.before) for t in store.ranges["a"]] == [(None, 2_000), (2_000, cutoff)]
    assert value(store, "a") == 9

    store.mutators[live] = dataclasses.replace(store.mutators[live], retired_us=NOW_US)
    later = Collector(store, GRACE_US, concurrency=1)
    run(later.run(NOW_US + 2 * GRACE_US))
    assert store.snapshot("likes", "a").shards == ()
    assert [(t.after, t.before, t.ts) for t in store.ranges["a"][2:]] == [(None, NOW_US + GRACE_US, NOW_US)]
    assert value(store, "a") == 9


def test_a_final_mutator_born_with_a_live_one_is_folded_row_by_row() -> None:
    """A final mutator born at the very microsecond of a live one sits on a range bound: its row is folded and
    deleted on its own, and the live one's stays."""
    store = MemoryStore()
    live = add_mutator(store, born_us=2_000, retired_us=None, shards={"a": 2})
    final = add_mutator(store, born_us=2_000, retired_us=2_000_000, shards={"a": 5})
    report = collect(store)
    assert (report.mutators_collected, report.shards_deleted) == (1, 1)
    assert [s.mutator for s in store.snapshot("likes", "a").shards] == [live]
    assert store.row_tombstones == {("a", final): 2_000_000}
    assert value(store, "a") == 7


def test_a_row_inside_a_gap_of_no_final_mutator_is_never_deleted() -> None:
    """A row inside a gap whose mutator the registry does not know (a shard brought back after its
    tombstone was purged, say) defers the key: a range over it would delete it unfolded."""
    store = MemoryStore()
    mutator = add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 3})
    store.land(uuid.uuid4(), 500, 501, ShardWrite("likes", "a", count_state(6), 10, False))
    report = collect(store)
    assert report.deferred == ["a: shard_of_no_final_mutator"]
    assert mutator not in store.collected
    assert not store.ranges
    assert not store.tallies
    assert value(store, "a") == 9


def test_dry_run_writes_nothing() -> None:
    """A dry run reports what it would fold and writes nothing."""
    store = MemoryStore()
    add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 3})
    report = collect(store, dry_run=True)
    assert (report.dry_run, report.instances_folded, report.mutators_collected) == (True, 1, 1)
    assert not store.tallies
    assert not store.collected
    assert len(store.snapshot("likes", "a").shards) == 1


class FlakyStore(MemoryStore):
    """A store whose CL ALL read of some keys fails, as with a replica down."""

    def __init__(self, down: set[str]) -> None:
        super().__init__()
        self.down = down

    async def read_key(self, key: str) -> KeyView:
        if key in self.down:
            raise StoreTimeoutError("Cannot achieve consistency level ALL")
        return await super().read_key(key)


def test_an_unavailable_instance_is_deferred_and_the_run_goes_on() -> None:
    """An instance whose read fails is deferred, the others are folded, and a later run finishes it."""
    store = FlakyStore(down={"a"})
    mutator = add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 3, "b": 2})
    report = collect(store)
    assert (report.instances_deferred, report.instances_folded, report.mutators_collected) == (1, 1, 0)
    assert report.deferred == ["a: storage_unavailable"]
    assert mutator not in store.collected
    assert value(store, "a") == 3
    assert value(store, "b") == 2

    store.down.clear()
    report = collect(store)
    assert (report.instances_deferred, report.mutators_collected) == (0, 1)
    assert value(store, "a") == 3
    assert store.snapshot("likes", "a").shards == ()


def test_a_shard_written_at_or_after_its_retire_time_is_not_folded() -> None:
    # Its row would survive a deletion at the retire time and count twice.
    """A shard stamped at or after its mutator's retire time is deferred, never folded."""
    store = MemoryStore()
    add_mutator(store, born_us=2_000_000, retired_us=2_000_000, shards={"a": 3})
    report = collect(store)
    assert report.deferred == ["a: shard_written_after_retirement"]
    assert not store.tallies
    assert value(store, "a") == 3


def test_a_tally_newer_than_the_fold_is_not_overwritten() -> None:
    """A fold older than the tally in place is deferred instead of overwriting it."""
    store = MemoryStore()
    # A worker whose clock ran ahead folded shards retired after every one this run knows as final.
    store.tallies[("likes", "a")] = memory_store.Cell(count_state(3), 3_000_000)
    late = add_mutator(store, born_us=1_500, retired_us=2_000_000, shards={"a": 4})  # retired "earlier"
    report = collect(store)
    assert report.deferred == ["a: tally_newer_than_fold"]
    assert late not in store.collected
    assert value(store, "a") == 7


def test_states_of_different_kinds_are_never_merged() -> None:
    """Shards of another kind than the counter's are deferred as unmergeable."""
    store = MemoryStore()
    mutator = add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 3})
    other = new_state(COUNTERS["top_qty"])
    other.apply(5)
    store.land(mutator, 1_000, 1_001, ShardWrite("likes", "a", other.to_bytes(), 10, False))
    second = add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 1})
    report = collect(store)
    assert report.deferred == ["a: unmergeable"]
    assert mutator not in store.collected
    assert second not in store.collected


def test_concurrent_settling_gives_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Folding many instances concurrently gives the same values as one at a time."""
    store = MemoryStore()
    add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={str(k): k for k in range(1, 40)})

    async def answer_at_once(op: memory_store.Op) -> memory_store.Fault:
        return memory_store.Fault.NONE

    # Under an event loop nobody drives the gates one by one: every storage call applies at once.
    monkeypatch.setattr(memory_store, "_gate", answer_at_once)
    collector = Collector(store, GRACE_US, concurrency=8)
    report = asyncio.run(collector.run(NOW_US))
    assert (report.instances_folded, report.mutators_collected) == (39, 1)
    assert all(value(store, str(k)) == k for k in range(1, 40))


class PagedStore(MemoryStore):
    """Reads a key as Cassandra pages it: ``page_size`` rows to a request, each request a storage step of its
    own (so another worker may fold between two), the tallies as of the first request."""

    def __init__(self, page_size: int) -> None:
        super().__init__()
        self.page_size = page_size
        self.tally_reads = 0

    async def read_key(self, key: str) -> KeyView:
        first: KeyView | None = None
        shards: list[ShardView] = []
        after: tuple[int, uuid.UUID] | None = None
        while True:
            pages = len(shards) // self.page_size
            await self._read("read_key_page", (key, pages))
            now = self.key_view(key)  # rows in clustering (birth, mutator) order, as Cassandra keeps them
            first = first or now
            page = [s for s in now.shards if after is None or (s.born_us, s.mutator) > after][:self.page_size]
            shards.extend(page)
            if len(page) < self.page_size:  # a full page may have more after it: ask again
                return KeyView(first.tallies, first.tally_write_us, tuple(shards), pages + 1)
            after = (page[-1].born_us, page[-1].mutator)

    async def read_tallies(self, key: str) -> tuple[Mapping[str, bytes], Mapping[str, int]]:
        self.tally_reads += 1
        await self._read("read_tallies", key)
        view = self.key_view(key)
        return view.tallies, view.tally_write_us


def test_a_paged_read_with_no_fold_between_its_pages_folds_after_one_tally_check() -> None:
    """A read of several pages with nothing folded meanwhile folds every final shard, checking the tally once."""
    store = PagedStore(page_size=2)
    for i in range(5):
        add_mutator(store, born_us=1_000 + i, retired_us=2_000_000, shards={"a": i + 1})
    report = collect(store)
    assert (report.instances_folded, report.shards_deleted, report.instances_deferred) == (1, 5, 0)
    assert store.tally_reads == 1
    assert value(store, "a") == 15
    assert store.snapshot("likes", "a").shards == ()


def test_a_fold_between_the_pages_of_a_read_is_neither_counted_twice_nor_lost() -> None:
    """A worker folds every early shard between two pages of another's read; the instance's value stays exact."""
    store = PagedStore(page_size=3)
    for i in range(7):
        add_mutator(store, born_us=1_000 + i, retired_us=2_000_000, shards={"a": i + 1})
    late = add_mutator(store, born_us=3_000_000, retired_us=NOW_US - 5 * GRACE_US, shards={"a": 100})
    assert value(store, "a") == 128
    reader = Task("reader", Collector(store, GRACE_US, concurrency=1).run(NOW_US))
    while reader.pending != Op("read_key_page", ("a", 1)):
        reader.step()
    # The other worker's cutoff comes before ``late`` retired: it folds the early shards, at their retire time.
    other = Collector(store, 10 * GRACE_US, concurrency=1)
    folded: GcReport = run(other.run(NOW_US))
    assert (folded.instances_folded, folded.shards_deleted) == (1, 7)
    assert value(store, "a") == 128

    reader.finish()
    assert reader.error is None
    assert (reader.result.instances_folded, reader.result.instances_deferred) == (1, 0)
    assert value(store, "a") == 128
    assert store.snapshot("likes", "a").shards == ()
    assert store.tallies[("likes", "a")].ts == store.mutators[late].retired_us


def test_an_instance_that_changes_under_every_paged_read_is_deferred() -> None:
    """A paged read whose tally never holds still is tried a few times, then deferred with nothing written."""

    class Restless(PagedStore):
        async def read_tallies(self, key: str) -> tuple[Mapping[str, bytes], Mapping[str, int]]:
            await super().read_tallies(key)
            return {"likes": b"another fold"}, {"likes": self.tally_reads}

    store = Restless(page_size=2)
    mutators = [add_mutator(store, born_us=1_000 + i, retired_us=2_000_000, shards={"a": 1}) for i in range(5)]
    report = collect(store)
    assert report.deferred == ["a: changed_while_read"]
    assert store.tally_reads == 3
    assert not store.tallies
    assert value(store, "a") == 5
    assert not any(m in store.collected for m in mutators)


def test_forget_after_deletes_long_collected_mutators() -> None:
    """Registry entries collected longer ago than forget_after are deleted."""
    class Forgetting(MemoryStore):
        forgotten: list[uuid.UUID]

        async def forget(self, mutator: uuid.UUID) -> None:
            self.forgotten.append(mutator)

    store = Forgetting()
    store.forgotten = []
    old = add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 1})
    store.collected[old] = 3_000_000
    add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"b": 1})
    report = collect(store, forget_after_us=NOW_US - 5_000_000)
    assert store.forgotten == [old]
    assert report.mutators_forgotten == 1


def entry(*, partition: int = 0, expires_us: int = 1_000, retired_us: int | None = None,
          topic: str = "likes") -> RegistryEntry:
    return RegistryEntry(uuid.uuid4(), "g", topic, partition, 0, expires_us, retired_us, None)


def test_orphans_are_expired_mutators_nobody_will_retire() -> None:
    """Orphans are expired mutators that no partition row will ever retire."""
    owner, window, bystander = entry(), entry(), entry()
    gone_topic, gone_partition = entry(topic="deleted"), entry(partition=7)
    unexpired, retired = entry(expires_us=NOW_US), entry(retired_us=5)
    row = PartitionRow(owner.id, window.id, 0, 3, 9, 12)
    rows = {PartitionId("g", "likes", 0): row, PartitionId("g", "likes", 7): None}
    registry = [owner, window, bystander, gone_topic, gone_partition, unexpired, retired]
    found = {o.entry.id: o for o in find_orphans(registry, rows, {"likes": 4}, NOW_US, GRACE_US)}
    assert {k: o.reason for k, o in found.items()} == {
        bystander.id: "never_owned", gone_topic.id: "topic_gone", gone_partition.id: "partition_gone"}
    assert all(o.retire_us >= NOW_US for o in found.values())


def test_an_orphaned_window_writer_is_retired_after_its_last_write() -> None:
    """An orphaned window writer is retired after the timestamp of its last write."""
    writer = RegistryEntry(uuid.uuid4(), "g", "likes", 3, NOW_US - 10, 0, None, None)
    row = PartitionRow(writer.id, writer.id, NOW_US - 10, 50, 9, 12)
    (orphan,) = find_orphans([writer], {PartitionId("g", "likes", 3): row}, {"likes": 2}, NOW_US, 0)
    assert orphan.reason == "partition_gone"
    assert orphan.retire_us > writer.born_us + row.flush_seq


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("30s", 30.0), ("5m", 300.0), ("1.5h", 5400.0),
                                               ("2d", 172_800.0), ("250ms", 0.25)])
def test_durations(text: str, seconds: float) -> None:
    """Durations parse with their units."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "-1s", "m"])
def test_bad_durations_are_refused(text: str) -> None:
    """Text that is not a duration is refused with a clear message."""
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        parse_duration(text)


def test_progress_is_told_as_each_page_of_a_mutator_is_folded() -> None:
    """A mutator of millions of instances takes minutes to fold: progress is told after each page of its work
    list, not only between mutators (one such mutator left the log without a gc_progress line for minutes)."""
    store = MemoryStore()
    add_mutator(store, born_us=1_000, retired_us=2_000_000, shards={"a": 3, "b": 1, "c": 2})
    told: list[tuple[int, int, int]] = []
    collect(store, progress=lambda done, total, report: told.append((done, total, report.instances_folded)))
    # before the mutator, after each of its two pages (one instance, then two), and at the end
    assert told == [(0, 1, 0), (0, 1, 1), (0, 1, 3), (1, 1, 3)]
