"""The read_committed filter (``partition_log.read_committed``): Kafka's
consumer walk over a fetch's batches with its aborted transactions, on
hand-made fetches, and over a log's fetches against a model of its
producers."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.batch import BatchHeader, build_batch, decode_records, split_batches
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.read_committed import read_committed_batches
from partition_log.records import Record
from partition_log.txn import ControlType, EndTxnMarker, build_marker_batch
from partition_log.txn_index import AbortedTxn
from tests.partition_log.log_util import read_batches
from tests.partition_log.test_log_txn_index import Model, open_log, random_appends


def data(base: int, pid: int = -1, *, txn: bool = True, count: int = 1) -> bytes:
    records = [Record(base + i, 0, b"k", b"%d" % (base + i)) for i in range(count)]
    if pid < 0:
        return build_batch(records, base_offset=base)
    return build_batch(
        records,
        base_offset=base,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=base,
        transactional=txn,
    )


def marker(base: int, pid: int, kind: ControlType) -> bytes:
    return build_marker_batch(pid, 0, EndTxnMarker(kind, 0), 0, base_offset=base)


def seen(batches: list[bytes], aborted: list[AbortedTxn]) -> list[int]:
    """The base offsets of the batches handed on."""
    return [
        BatchHeader.parse(view).base_offset
        for view in read_committed_batches(b"".join(batches), aborted)
    ]


def test_interleaved_producers_one_aborted() -> None:
    batches = [
        data(0, 1),
        data(1, 2),
        data(2),  # no producer
        data(3, 1),
        data(4, 2),
        marker(5, 1, ControlType.ABORT),
        marker(6, 2, ControlType.COMMIT),
        data(7, 1, txn=False),  # idempotent, not transactional
    ]
    aborted = [AbortedTxn(1, 0, 5, 1)]
    assert seen(batches, aborted) == [1, 2, 4, 7]
    # Without the entry every data batch is handed on (the markers never).
    assert seen(batches, []) == [0, 1, 2, 3, 4, 7]


def test_a_transaction_spanning_fetches_is_dropped_in_each() -> None:
    aborted = [AbortedTxn(1, 0, 4, 5)]
    first = [data(0, 1, count=2), data(2, 3)]
    second = [data(3, 1), marker(4, 1, ControlType.ABORT), data(5, 3)]
    # Each fetch has its own list (collect_aborted_transactions from its
    # start): the transaction overlaps both.
    assert seen(first, aborted) == [2]
    assert seen(second, aborted) == [5]


def test_commits_and_aborts_of_one_producer_in_turn() -> None:
    batches = [
        data(0, 1),
        marker(1, 1, ControlType.ABORT),
        data(2, 1),
        marker(3, 1, ControlType.COMMIT),
        data(4, 1, count=2),
        marker(6, 1, ControlType.ABORT),
        data(7, 1),
        marker(8, 1, ControlType.COMMIT),
    ]
    aborted = [AbortedTxn(1, 0, 1, 2), AbortedTxn(1, 4, 6, 7)]
    # The abort marker ends each: the commits between are kept.
    assert seen(batches, aborted) == [2, 7]
    # In whatever order the entries come.
    assert seen(batches, aborted[::-1]) == [2, 7]


def test_an_entry_counts_from_its_first_offset_only() -> None:
    """A producer's batches before its aborted transaction's first offset
    (an earlier, committed transaction) are kept."""
    batches = [
        data(0, 1),
        data(1, 2),
        marker(2, 1, ControlType.COMMIT),
        data(3, 1),
        marker(4, 1, ControlType.ABORT),
        marker(5, 2, ControlType.ABORT),
    ]
    aborted = [AbortedTxn(1, 3, 4, 5), AbortedTxn(2, 1, 5, 6)]
    assert seen(batches, aborted) == [0]


def test_views_are_of_the_fetch() -> None:
    fetch = data(0) + data(1, 4)
    views = list(read_committed_batches(fetch, []))
    assert [bytes(v) for v in views] == [data(0), data(1, 4)]


# -- the read_committed view --------------------------------------------------------


def _fetch_committed(log: PartitionLog, rng: random.Random) -> list[tuple[int, bytes | None]]:
    """Fetch the log up to its last stable offset in random sizes, each
    fetch with its aborted transactions, as a read_committed consumer."""
    out: list[tuple[int, bytes | None]] = []
    position = log.log_start_offset
    stable = log.last_stable_offset
    while position < stable:
        data = log.read(position, rng.randint(1, 600), max_offset=stable)
        if not data:
            break
        # The offset after the last batch fetched: Kafka's upper bound of
        # the fetch's aborted transactions.
        upper = BatchHeader.parse(split_batches(data)[-1]).next_offset
        aborted = log.collect_aborted_transactions(position, upper)
        for batch in read_committed_batches(data, aborted):
            out.extend((r.offset, r.value) for r in decode_records(batch))
        position = upper
    return out


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32))
def test_read_committed_sees_exactly_the_committed_records(seed: int) -> None:
    rng = random.Random(seed)
    directory = MemoryDirectory()
    config = LogConfig(segment_bytes=rng.choice((250, 400, 2_000)), index_interval_bytes=100)
    log = open_log(directory, config)
    random_appends(log, rng, rng.randint(1, 120))
    log.maybe_increment_high_watermark(log.log_end_offset)
    stable = log.last_stable_offset
    batches = read_batches(log)
    # Every transaction with a batch below the stable offset is decided,
    # though its marker may lie past it: the whole log's decisions judge.
    model = Model.of(batches)
    got = _fetch_committed(log, rng)
    assert got == [r for r in model.committed_records if r[0] < stable], f"seed {seed}"
    # Nothing of an aborted transaction, checked on its own.
    aborted_values = {
        r.value
        for b in batches
        for h in [BatchHeader.parse(b)]
        if h.is_transactional and not h.is_control
        for t in model.aborted
        if t.producer_id == h.producer_id and t.first_offset <= h.base_offset < t.last_offset
        for r in decode_records(b)
    }
    assert not aborted_values & {value for _, value in got}, f"seed {seed}"
