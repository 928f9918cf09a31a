"""The aborted-transaction index (``partition_log.txn_index``): its entries'
bytes, the refusal of a damaged file by name, truncation, and the search a
``read_committed`` fetch makes, checked against every aborted transaction
of a partition written by a model of its producers."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.errors import Errors, PartitionLogError
from partition_log.producer_state import ProducerBatch, ProducerStateManager
from partition_log.txn import ControlType, EndTxnMarker
from partition_log.txn_index import (
    ENTRY_SIZE,
    AbortedTxn,
    decode_entries,
    encode_entry,
    search,
    truncated,
)


def test_an_entry_is_kafkas_aborted_txn() -> None:
    txn = AbortedTxn(7, 10, 20, 15)
    data = encode_entry(txn)
    assert ENTRY_SIZE == len(data) == 34
    assert data[:2] == b"\x00\x00"  # version 0
    assert int.from_bytes(data[2:10], "big") == 7
    assert decode_entries(data + encode_entry(AbortedTxn(8, 12, 21, 22))) == [
        txn,
        AbortedTxn(8, 12, 21, 22),
    ]
    assert decode_entries(b"") == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (encode_entry(AbortedTxn(7, 10, 20, 15))[:-1], "33 bytes, not a whole number"),
        (b"\x00\x01" + encode_entry(AbortedTxn(7, 10, 20, 15))[2:], "entry 0 has version 1"),
        (
            encode_entry(AbortedTxn(7, 10, 20, 15)) + encode_entry(AbortedTxn(8, 1, 20, 21)),
            "entry 1's last offset 20 does not follow 20",
        ),
        (
            encode_entry(AbortedTxn(7, 10, 20, 15))[:10]
            + (30).to_bytes(8, "big")
            + (20).to_bytes(8, "big")
            + (0).to_bytes(8, "big"),
            "entry 0: aborted transaction of producer 7: offsets 30..20",
        ),
    ],
)
def test_a_damaged_index_is_refused_by_name(data: bytes, message: str) -> None:
    with pytest.raises(PartitionLogError, match=message) as refused:
        decode_entries(data, "00000000000000000000.txnindex")
    assert refused.value.code is Errors.KAFKA_STORAGE_ERROR
    assert "00000000000000000000.txnindex" in str(refused.value)


def test_truncation_drops_the_entries_whose_marker_it_cuts() -> None:
    entries = [AbortedTxn(1, 0, 4, 5), AbortedTxn(2, 3, 9, 10)]
    assert truncated(entries, 10) == entries
    assert truncated(entries, 9) == entries[:1]
    assert truncated(entries, 4) == []


def test_the_search_stops_where_no_later_transaction_can_overlap() -> None:
    entries = [AbortedTxn(1, 0, 4, 2), AbortedTxn(2, 2, 6, 7), AbortedTxn(3, 8, 9, 10)]
    found = search(entries, 5, 7)
    # 1's marker is below the start; 2 overlaps, and its stable offset 7
    # reaches the upper bound: nothing later can begin below it.
    assert found.aborted == (entries[1],) and found.complete
    assert search(entries, 0, 20).aborted == tuple(entries)
    assert not search(entries, 0, 20).complete


# -- against a partition's producers ------------------------------------------------------


def _partition(rng: random.Random) -> tuple[list[AbortedTxn], int]:
    """The aborted transactions of a partition written by three producers
    at random, in marker order, and its end offset."""
    state = ProducerStateManager()
    end = 0
    aborted: list[AbortedTxn] = []
    sequences = {1: 0, 2: 0, 3: 0}
    for _ in range(rng.randint(1, 80)):
        pid = rng.randint(1, 3)
        if rng.random() < 0.6:
            state.update(ProducerBatch(pid, 0, sequences[pid], 0, end, 0, True))
            sequences[pid] += 1
        else:
            kind = rng.choice((ControlType.ABORT, ControlType.COMMIT))
            done = state.update(ProducerBatch(pid, 0, -1, 0, end, 0, True, EndTxnMarker(kind, 0)))
            if done is not None and done.aborted:
                aborted.append(
                    AbortedTxn(pid, done.first_offset, done.last_offset, done.last_stable_offset)
                )
        end += 1
    return aborted, end


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32))
def test_searching_segment_by_segment_finds_every_overlapping_aborted_transaction(
    seed: int,
) -> None:
    rng = random.Random(seed)
    aborted, end = _partition(rng)
    # Segments: random bases; each entry in the segment of its marker.
    bases = sorted({0, *rng.sample(range(end + 1), min(end, rng.randint(0, 6)))})
    segments: list[list[AbortedTxn]] = [[] for _ in bases]
    for txn in aborted:
        index = max(i for i, base in enumerate(bases) if base <= txn.last_offset)
        segments[index].append(txn)
    for _ in range(10):
        start = rng.randint(0, end)
        upper = rng.randint(start, end + 1)
        found: list[AbortedTxn] = []
        first = max(i for i, base in enumerate(bases) if base <= start)
        for entries in segments[first:]:
            result = search(entries, start, upper)
            found.extend(result.aborted)
            if result.complete:
                break
        expected = [t for t in aborted if t.last_offset >= start and t.first_offset < upper]
        assert found == expected, (seed, start, upper)
        # The bytes say the same.
        data = b"".join(encode_entry(t) for t in aborted)
        assert decode_entries(data) == aborted
