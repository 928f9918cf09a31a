"""Each segment's aborted-transaction index (``.txnindex``) in the partition
log: written when an abort marker is appended (leader and follower), kept
through a reopen, rebuilt when missing, damaged or past the recovery point
after a power loss, cut by truncation, carried by retention and the
cleaner's swap; and ``collect_aborted_transactions`` checked against a model of the producers
that reads the log's batches."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.batch import BatchHeader, build_batch, decode_records
from partition_log.errors import PartitionLogError
from partition_log.files import MemoryDirectory
from partition_log.log import SNAPSHOT_SUFFIX, AppendOrigin, LogConfig, PartitionLog
from partition_log.log_files import read_whole
from partition_log.records import Record
from partition_log.segment import TXN_INDEX_SUFFIX, file_name
from partition_log.txn import ControlType, EndTxnMarker, build_marker_batch, read_marker
from partition_log.txn_index import AbortedTxn, decode_entries, encode_entry
from tests.partition_log.log_util import read_batches

COORDINATOR = AppendOrigin.COORDINATOR
SMALL = LogConfig(segment_bytes=400, index_interval_bytes=100, flush_messages=1)


class Writer:
    """Appends as a leader: producers' batches, in sequence, and their
    coordinator's markers; records what each data record is."""

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.sequences: dict[int, int] = {}
        self.counter = 0

    def data(self, pid: int, *, txn: bool = True, count: int = 1) -> int:
        records = []
        for i in range(count):
            self.counter += 1
            records.append(Record(i, 1_000, b"k%d" % self.counter, b"v%d" % self.counter))
        if pid < 0:
            data = build_batch(records)
        else:
            sequence = self.sequences.get(pid, 0)
            data = build_batch(
                records,
                producer_id=pid,
                producer_epoch=0,
                base_sequence=sequence,
                transactional=txn,
            )
            self.sequences[pid] = sequence + count
        return self.log.append_as_leader(data, 0, now_ms=1_000).first_offset

    def end(self, pid: int, kind: ControlType) -> int:
        marker = build_marker_batch(pid, 0, EndTxnMarker(kind, 1), 1_000)
        return self.log.append_as_leader(marker, 0, 1_000, origin=COORDINATOR).first_offset


def open_log(directory: MemoryDirectory, config: LogConfig = SMALL, hw: int = 0) -> PartitionLog:
    return PartitionLog.open(directory, config, now_ms=0, high_watermark=hw)


def on_disk(log: PartitionLog) -> list[AbortedTxn]:
    """Every segment's ``.txnindex`` entries, read from the files, in
    segment order."""
    out: list[AbortedTxn] = []
    for base in log.segment_base_offsets:
        name = file_name(base, TXN_INDEX_SUFFIX)
        out.extend(decode_entries(read_whole(log.directory, name), name))
    return out


# -- the model ----------------------------------------------------------------------


@dataclass
class Model:
    """What the log's batches say, read by the rule of KIP-98 rather than
    by the producer state: the aborted transactions (with the last stable
    offset when each ended) and the records a read_committed reader sees."""

    aborted: list[AbortedTxn] = field(default_factory=list)
    committed_records: list[tuple[int, bytes | None]] = field(default_factory=list)

    @classmethod
    def of(cls, batches: list[bytes]) -> Model:
        model = cls()
        open_txns: dict[int, int] = {}
        pending: dict[int, list[tuple[int, bytes | None]]] = {}
        for data in batches:
            header = BatchHeader.parse(data)
            pid = header.producer_id
            if header.is_control:
                marker = read_marker(data, header)
                if pid in open_txns:
                    first = open_txns.pop(pid)
                    records = pending.pop(pid)
                    if marker.aborted:
                        lso = min(open_txns.values(), default=header.base_offset + 1)
                        model.aborted.append(AbortedTxn(pid, first, header.base_offset, lso))
                    else:
                        model.committed_records.extend(records)
                continue
            records = [(r.offset, r.value) for r in decode_records(data)]
            if header.is_transactional:
                open_txns.setdefault(pid, header.base_offset)
                pending.setdefault(pid, []).extend(records)
            else:
                model.committed_records.extend(records)
        model.committed_records.sort()
        return model


def random_appends(log: PartitionLog, rng: random.Random, steps: int, first_pid: int = 1) -> None:
    """``steps`` random appends of producers ``first_pid`` .. ``first_pid``
    + 3 (new ones: their sequences start at 0) and of batches without one."""
    w = Writer(log)
    open_pids: set[int] = set()
    for _ in range(steps):
        pid = first_pid + rng.randint(0, 3)
        roll = rng.random()
        if roll < 0.1:
            w.data(-1, count=rng.randint(1, 3))
        elif roll < 0.55:
            w.data(pid, count=rng.randint(1, 3))
            open_pids.add(pid)
        elif roll < 0.65 and pid not in open_pids:
            w.data(pid, txn=False)
        else:
            w.end(pid, rng.choice((ControlType.ABORT, ControlType.COMMIT)))
            open_pids.discard(pid)


# -- writing ------------------------------------------------------------------------


def test_an_abort_writes_an_entry_and_a_commit_none() -> None:
    directory = MemoryDirectory()
    log = open_log(directory)
    w = Writer(log)
    one = w.data(1, count=2)
    two = w.data(2)
    committed = w.end(1, ControlType.COMMIT)
    assert on_disk(log) == []
    three = w.data(3)
    aborted = w.end(2, ControlType.ABORT)
    # Producer 3's transaction is still open: the stable offset stops at it.
    assert on_disk(log) == [AbortedTxn(2, two, aborted, three)]
    alone = w.end(3, ControlType.ABORT)
    assert on_disk(log) == [
        AbortedTxn(2, two, aborted, three),
        AbortedTxn(3, three, alone, alone + 1),
    ]
    # A marker of a producer with no open transaction ends nothing.
    w.end(1, ControlType.ABORT)
    assert len(on_disk(log)) == 2
    assert one < committed
    # Synced with the log (flush_messages=1): a power loss keeps them.
    index_name = file_name(log.segment_base_offsets[-1], TXN_INDEX_SUFFIX)
    assert directory.durable_bytes(index_name) == read_whole(directory, index_name)


def test_a_follower_writes_the_same_entries() -> None:
    leader = open_log(MemoryDirectory())
    random_appends(leader, random.Random(3), 60)
    follower = open_log(MemoryDirectory())
    for data in read_batches(leader):
        follower.append_as_follower(data)
    assert on_disk(leader) != []
    assert on_disk(follower) == on_disk(leader) == Model.of(read_batches(leader)).aborted


def test_the_entries_are_synced_with_the_log_not_before() -> None:
    directory = MemoryDirectory()
    log = open_log(directory, LogConfig(segment_bytes=1 << 20))
    w = Writer(log)
    w.data(1)
    w.end(1, ControlType.ABORT)
    name = file_name(0, TXN_INDEX_SUFFIX)
    assert len(read_whole(directory, name)) == 34  # reached the OS
    assert directory.durable_bytes(name) == b""
    log.flush(0)
    assert directory.durable_bytes(name) == read_whole(directory, name)


# -- opening ------------------------------------------------------------------------


def test_the_entries_survive_a_clean_reopen() -> None:
    directory = MemoryDirectory()
    log = open_log(directory)
    random_appends(log, random.Random(5), 80)
    before = on_disk(log)
    assert before and len(log.segment_base_offsets) > 3
    log.close()
    reopened = open_log(directory)
    assert reopened.recovery.clean and reopened.recovery.rebuilt_txn_indexes == ()
    assert on_disk(reopened) == before
    end = reopened.log_end_offset
    assert reopened.collect_aborted_transactions(0, end) == before


def _damage(directory: MemoryDirectory, name: str, how: str) -> None:
    if how == "deleted":
        directory.delete(name)
        return
    data = read_whole(directory, name)
    directory.delete(name)
    handle = directory.create(name)
    if how == "torn":
        handle.append(data[:-5])
    elif how == "emptied":
        pass
    else:  # an entry whose marker lies past the segment
        handle.append(data + encode_entry(AbortedTxn(9, 0, 1 << 40, 1 << 40)))
    handle.close()


@pytest.mark.parametrize("how", ["deleted", "torn", "outside"])
@pytest.mark.parametrize("clean", [True, False])
def test_a_missing_or_damaged_index_is_rebuilt_from_the_log(how: str, clean: bool) -> None:
    directory = MemoryDirectory()
    log = open_log(directory)
    random_appends(log, random.Random(7), 120)
    before = on_disk(log)
    bases = log.segment_base_offsets
    # A segment with entries, below the recovery point (not rescanned).
    damaged = next(
        base
        for base, following in zip(bases, bases[1:], strict=False)
        if any(base <= t.last_offset < following for t in before)
        and following < log.recovery_point
        and base > 0
    )
    name = file_name(damaged, TXN_INDEX_SUFFIX)
    if clean:
        log.close()
    else:
        directory.crash()
    _damage(directory, name, how)
    reopened = open_log(directory)
    assert reopened.recovery.rebuilt_txn_indexes == (name,)
    assert on_disk(reopened) == before == Model.of(read_batches(reopened)).aborted


def test_an_emptied_index_is_not_noticed_and_a_deleted_one_is() -> None:
    """An empty file is a segment without aborts: the check reads the file,
    and only a rebuild from the log could tell (Kafka neither)."""
    directory = MemoryDirectory()
    log = open_log(directory)
    w = Writer(log)
    w.data(1)
    w.end(1, ControlType.ABORT)
    log.close()
    _damage(directory, file_name(0, TXN_INDEX_SUFFIX), "emptied")
    assert on_disk(open_log(directory)) == []


def test_a_rescan_from_a_snapshot_keeps_the_entries_below_it() -> None:
    """The close's snapshot lies inside the active segment: after a power
    loss the rescan replays the producers from it, so the entries of the
    markers below it are kept from the file and those past it derived
    again (the unsynced one lost with its marker)."""
    directory = MemoryDirectory()
    config = LogConfig(segment_bytes=1 << 20)
    log = open_log(directory, config)
    w = Writer(log)
    w.data(1)
    kept = w.end(1, ControlType.ABORT)
    w.data(2)
    log.close()
    log = open_log(directory, config)
    assert len(log.segment_base_offsets) == 1
    w = Writer(log)
    w.sequences = {2: 1}
    w.data(3)
    w.end(3, ControlType.ABORT)
    log.flush(0)
    lost = w.end(2, ControlType.ABORT)
    directory.crash()
    reopened = open_log(directory, config)
    assert not reopened.recovery.clean and reopened.log_end_offset == lost
    entries = on_disk(reopened)
    assert [t.last_offset for t in entries][:1] == [kept] and len(entries) == 2
    assert entries == Model.of(read_batches(reopened)).aborted


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_after_a_power_loss_the_index_agrees_with_the_log(seed: int) -> None:
    rng = random.Random(seed)
    directory = MemoryDirectory()
    config = LogConfig(
        segment_bytes=rng.choice((300, 600, 5_000)),
        index_interval_bytes=100,
        flush_messages=rng.choice((None, 3, 10)),
    )
    log = open_log(directory, config)
    for round_ in range(rng.randint(1, 3)):
        random_appends(log, rng, rng.randint(5, 60), first_pid=1 + 10 * round_)
        if rng.random() < 0.3:
            # Snapshots lost too: the replay starts further back.
            for name in directory.list():
                if name.endswith(SNAPSHOT_SUFFIX) and rng.random() < 0.5:
                    directory.delete(name)
                    directory.sync_directory()
        directory.crash(rng)
        log = open_log(directory, config)
        model = Model.of(read_batches(log))
        assert on_disk(log) == model.aborted, f"seed {seed}"
        assert log.collect_aborted_transactions(0, log.log_end_offset) == model.aborted, (
            f"seed {seed}"
        )


# -- truncation, retention, cleaning ------------------------------------------------


def test_truncation_cuts_the_entries_of_the_markers_it_removes() -> None:
    directory = MemoryDirectory()
    log = open_log(directory)
    random_appends(log, random.Random(11), 150)
    entries = on_disk(log)
    assert len(entries) >= 4 and len(log.segment_base_offsets) > 3
    batches = read_batches(log)
    # Just below a marker, then inside an older segment.
    for cut in (entries[-1].last_offset, entries[len(entries) // 2].last_offset):
        log.truncate_to(cut)
        assert on_disk(log) == [t for t in entries if t.last_offset < cut]
        kept = [b for b in batches if BatchHeader.parse(b).base_offset < cut]
        assert on_disk(log) == Model.of(kept).aborted
    for name in directory.list():
        if name.endswith(TXN_INDEX_SUFFIX):
            assert int(name[:20]) in log.segment_base_offsets, name
    # Appended again after the cut, the entries follow on in the active segment.
    w = Writer(log)
    w.data(99)
    marker = w.end(99, ControlType.ABORT)
    assert on_disk(log)[-1].last_offset == marker
    log.truncate_fully_and_start_at(log.log_end_offset + 5, now_ms=0)
    assert on_disk(log) == []


def test_retention_takes_the_index_with_its_segment() -> None:
    directory = MemoryDirectory()
    config = LogConfig(
        segment_bytes=400, index_interval_bytes=100, flush_messages=1, retention_bytes=1_500
    )
    log = open_log(directory, config)
    random_appends(log, random.Random(13), 150)
    entries = on_disk(log)
    log.maybe_increment_high_watermark(log.log_end_offset)
    assert log.maybe_delete_segments(now_ms=2_000)
    first = log.segment_base_offsets[0]
    assert on_disk(log) == [t for t in entries if t.last_offset >= first]
    assert not [n for n in directory.list() if n.endswith(TXN_INDEX_SUFFIX) and int(n[:20]) < first]
    reopened_entries = on_disk(log)
    log.close()
    assert on_disk(open_log(directory, config)) == reopened_entries


def test_the_cleaners_swap_keeps_the_entries_of_the_segments_it_replaces() -> None:
    directory = MemoryDirectory()
    log = open_log(directory)
    random_appends(log, random.Random(17), 150)
    entries = on_disk(log)
    bases = log.segment_base_offsets
    old = bases[1:4]
    inside = [t for t in entries if bases[1] <= t.last_offset < bases[4]]
    assert inside

    # The cleaner's output: the batches of the range less the aborted
    # transactions' records (Kafka's cleaner drops those), in other segments.
    def dropped(header: BatchHeader) -> bool:
        return not header.is_control and any(
            t.producer_id == header.producer_id
            and t.first_offset <= header.base_offset < t.last_offset
            for t in inside
        )

    kept = [
        b
        for b in read_batches(log)
        if bases[1] <= BatchHeader.parse(b).base_offset < bases[4]
        and not dropped(BatchHeader.parse(b))
    ]
    size = log.size
    log.replace_segments(old, kept, now_ms=0)
    assert log.size < size
    assert on_disk(log) == entries
    assert log.collect_aborted_transactions(bases[1], bases[4]) == [
        t for t in entries if t.last_offset >= bases[1] and t.first_offset < bases[4]
    ]
    log.close()
    # Each entry is in the segment holding its marker: the open's check
    # rebuilds nothing.
    reopened = open_log(directory)
    assert reopened.recovery.rebuilt_txn_indexes == ()
    assert on_disk(reopened) == entries


# -- collect_aborted_transactions ---------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32))
def test_collecting_aborted_transactions_finds_every_overlapping_one(seed: int) -> None:
    rng = random.Random(seed)
    directory = MemoryDirectory()
    config = LogConfig(segment_bytes=rng.choice((250, 400, 2_000)), index_interval_bytes=100)
    log = open_log(directory, config)
    random_appends(log, rng, rng.randint(1, 120))
    if rng.random() < 0.3:
        log.close()
        log = open_log(directory, config)
    model = Model.of(read_batches(log)).aborted
    end = log.log_end_offset
    for _ in range(20):
        start = rng.randint(0, end)
        upper = rng.randint(start, end + 1)
        expected = [t for t in model if t.last_offset >= start and t.first_offset < upper]
        got = log.collect_aborted_transactions(start, upper)
        assert got == expected, f"seed {seed}, [{start}, {upper})"


def test_collecting_stops_at_the_first_segment_that_completes_the_search() -> None:
    """Later segments' files are not read once a search is complete: a
    damaged later file is never reached."""
    directory = MemoryDirectory()
    log = open_log(directory)
    w = Writer(log)
    w.data(1)
    marker = w.end(1, ControlType.ABORT)
    while len(log.segment_base_offsets) < 3:
        w.data(-1, count=3)
    log.close()
    log = open_log(directory)
    last = file_name(log.segment_base_offsets[1], TXN_INDEX_SUFFIX)
    handle = directory.open(last)
    handle.append(b"\x00")
    handle.close()
    assert log.collect_aborted_transactions(0, marker + 1) == [AbortedTxn(1, 0, marker, marker + 1)]
    # A search that must go on reads it, and names it.
    with pytest.raises(PartitionLogError, match=last):
        log.collect_aborted_transactions(0, log.log_end_offset)
