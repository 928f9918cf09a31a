"""Binary encodings of batches and quorum state: round trips and damage."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from quorum.driver.codec import (
    batch_crc,
    decode_batch,
    decode_quorum_state,
    encode_batch,
    encode_quorum_state,
)
from quorum.storage import StorageCorruptError
from quorum.types import Batch, BatchKind, QuorumState

batches = st.builds(
    Batch,
    base_offset=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 2**31 - 1),
    records=st.lists(st.binary(max_size=40), min_size=1, max_size=6).map(tuple),
    kind=st.sampled_from(BatchKind),
)
node_ids = st.none() | st.integers(0, 2**31 - 1)
states = st.builds(QuorumState, st.integers(0, 2**31 - 1), node_ids, node_ids)


@given(batches)
def test_batch_round_trip(batch: Batch) -> None:
    assert decode_batch(encode_batch(batch), "test") == batch


@given(states)
def test_quorum_state_round_trip(state: QuorumState) -> None:
    assert decode_quorum_state(encode_quorum_state(state), "test") == state


def test_batch_crc_is_the_one_raft_proto_documents() -> None:
    """RecordBatch.crc32c: base_offset i64 | epoch i32 | kind u32 | count u32 |
    per record: length u32 then bytes, big-endian."""
    batch = Batch(7, 3, (b"ab", b"", b"xyz"), BatchKind.LEADER_CHANGE)
    body = struct.pack(">qiII", 7, 3, 1, 3)
    for record in batch.records:
        body += struct.pack(">I", len(record)) + record
    assert batch_crc(batch) == crc32c(body)
    assert encode_batch(batch) == struct.pack(">BI", 0, crc32c(body)) + body


@given(batches, st.data())
def test_any_flipped_byte_of_a_batch_is_detected(batch: Batch, data: st.DataObject) -> None:
    raw = bytearray(encode_batch(batch))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(StorageCorruptError, match="record batch at key 7"):
        decode_batch(bytes(raw), "key 7")


@given(batches, st.data())
def test_any_truncation_of_a_batch_is_detected(batch: Batch, data: st.DataObject) -> None:
    raw = encode_batch(batch)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(StorageCorruptError):
        decode_batch(raw[:cut], "here")


@given(states, st.data())
def test_any_damage_to_the_quorum_state_is_detected(
    state: QuorumState, data: st.DataObject
) -> None:
    raw = bytearray(encode_quorum_state(state))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(StorageCorruptError, match="quorum state at here"):
        decode_quorum_state(bytes(raw), "here")
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(StorageCorruptError):
        decode_quorum_state(encode_quorum_state(state)[:cut], "here")


def _with_body(body: bytes) -> bytes:
    """A value with a valid version and CRC around ``body``."""
    return struct.pack(">BI", 0, crc32c(body)) + body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (struct.pack(">qiII", 0, 1, 0, 0), "holds no records"),
        (struct.pack(">qiII", 0, 1, 9, 1) + b"\0\0\0\0", "unknown batch kind 9"),
        (struct.pack(">qiII", -1, 1, 0, 1) + b"\0\0\0\0", "negative base offset"),
        (struct.pack(">qiII", 0, 1, 0, 2) + b"\0\0\0\0", "record 1 of 2 has no length"),
        (struct.pack(">qiII", 0, 1, 0, 1) + b"\0\0\0\x05ab", "claims 5 bytes but only 2"),
        (struct.pack(">qiII", 0, 1, 0, 1) + b"\0\0\0\0zz", "2 unexpected bytes"),
        (b"\0" * 5, "shorter than its 20-byte batch header"),
    ],
)
def test_checksummed_but_impossible_batches_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(StorageCorruptError, match=message):
        decode_batch(_with_body(body), "k")


def test_unknown_version_and_impossible_state_are_refused() -> None:
    good = encode_quorum_state(QuorumState(1, 2, None))
    with pytest.raises(StorageCorruptError, match="unknown format version 1"):
        decode_quorum_state(b"\x01" + good[1:], "k")
    with pytest.raises(StorageCorruptError, match="impossible values"):
        decode_quorum_state(_with_body(struct.pack(">iii", 1, -5, -1)), "k")


def test_values_that_do_not_fit_are_refused_when_encoding() -> None:
    with pytest.raises(ValueError, match="epoch"):
        encode_batch(Batch(0, 2**31, (b"x",)))
    with pytest.raises(ValueError, match="no records"):
        encode_batch(Batch(0, 1, ()))
    with pytest.raises(ValueError, match="voted_for"):
        encode_quorum_state(QuorumState(1, 2**31, None))
