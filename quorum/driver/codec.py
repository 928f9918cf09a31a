"""Binary encodings of what a node stores: record batches and the quorum state.

Every value carries a CRC-32C (Castagnoli, the ``crc32c`` package) so that a
value damaged on disk is detected when it is read, never served.  Decoding
checks the format version, the CRC, every length and every field's range;
any mismatch raises :class:`~quorum.storage.StorageCorruptError` naming what
was being decoded and where (the caller passes ``where``, e.g. the RocksDB key).

All integers are big-endian.

Record batch (one RocksDB value per batch)::

    version   u8    0
    crc32c    u32   CRC-32C of the body below
    body:
      base_offset  i64   offset of the first record (>= 0)
      epoch        i32   epoch of the leader that wrote the batch (>= 0)
      kind         u32   BatchKind (0 data, 1 leader change)
      count        u32   number of records (>= 1)
      count times:
        length     u32   record length
        bytes      length bytes

The body is exactly the byte string over which ``RecordBatch.crc32c`` of
``proto/kqproto/raft.proto`` is computed, so :func:`batch_crc` is also the CRC a
batch carries on the wire.  The version byte is outside the CRC; it is checked
exactly (only version 0 exists), so a damaged version byte is reported too.

Quorum state::

    version   u8    0
    crc32c    u32   CRC-32C of the body below
    body:
      epoch        i32   (>= 0)
      voted_for    i32   node id, or -1 for none
      leader_id    i32   node id, or -1 for none
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from quorum.storage import StorageCorruptError
from quorum.types import Batch, BatchKind, QuorumState

__all__ = [
    "BATCH_FORMAT_VERSION",
    "STATE_FORMAT_VERSION",
    "batch_body",
    "batch_crc",
    "decode_batch",
    "decode_quorum_state",
    "encode_batch",
    "encode_quorum_state",
]

BATCH_FORMAT_VERSION = 0
STATE_FORMAT_VERSION = 0

_PREFIX = struct.Struct(">BI")  # version, crc32c
_BATCH_HEAD = struct.Struct(">qiII")  # base_offset, epoch, kind, count
_LEN = struct.Struct(">I")
_STATE = struct.Struct(">iii")  # epoch, voted_for, leader_id
_KINDS = frozenset(int(k) for k in BatchKind)
_I32_MAX = 2**31 - 1
_U32_MAX = 2**32 - 1


def batch_body(batch: Batch) -> bytes:
    """The CRC-covered bytes of ``batch`` (see the module docstring).

    Raises ValueError if a field does not fit its width or the batch has no
    records (a Batch never has none).
    """
    if not batch.records:
        raise ValueError(f"batch at offset {batch.base_offset} has no records")
    if not 0 <= batch.base_offset < 2**63:
        raise ValueError(f"base offset {batch.base_offset} out of range")
    if not 0 <= batch.epoch <= _I32_MAX:
        raise ValueError(f"epoch {batch.epoch} out of range")
    parts = [_BATCH_HEAD.pack(batch.base_offset, batch.epoch, int(batch.kind), len(batch.records))]
    for record in batch.records:
        if len(record) > _U32_MAX:
            raise ValueError(f"a record of {len(record)} bytes is too long")
        parts.append(_LEN.pack(len(record)))
        parts.append(record)
    return b"".join(parts)


def batch_crc(batch: Batch) -> int:
    """The CRC-32C of ``batch`` as ``RecordBatch.crc32c`` defines it."""
    return int(crc32c(batch_body(batch)))


def encode_batch(batch: Batch) -> bytes:
    body = batch_body(batch)
    return _PREFIX.pack(BATCH_FORMAT_VERSION, crc32c(body)) + body


def _check_prefix(data: bytes, what: str, where: str, version: int) -> memoryview:
    """Check the version and CRC of ``data``; return its body."""
    if len(data) < _PREFIX.size:
        raise StorageCorruptError(
            f"{what} at {where} is truncated: {len(data)} bytes, shorter than its "
            f"{_PREFIX.size}-byte header"
        )
    found_version, stored_crc = _PREFIX.unpack_from(data)
    if found_version != version:
        raise StorageCorruptError(
            f"{what} at {where} has unknown format version {found_version} (expected {version})"
        )
    body = memoryview(data)[_PREFIX.size :]
    actual = crc32c(body)
    if actual != stored_crc:
        raise StorageCorruptError(
            f"{what} at {where} fails its CRC-32C check: stored {stored_crc:#010x}, "
            f"computed {actual:#010x} over {len(body)} bytes"
        )
    return body


def decode_batch(data: bytes, where: str) -> Batch:
    """Decode a value made by :func:`encode_batch`, checking everything."""
    what = "record batch"
    body = _check_prefix(data, what, where, BATCH_FORMAT_VERSION)
    if len(body) < _BATCH_HEAD.size:
        raise StorageCorruptError(
            f"{what} at {where} is truncated: body of {len(body)} bytes is shorter than "
            f"its {_BATCH_HEAD.size}-byte batch header"
        )
    base_offset, epoch, kind, count = _BATCH_HEAD.unpack_from(body)
    if base_offset < 0 or epoch < 0:
        raise StorageCorruptError(
            f"{what} at {where} has a negative base offset or epoch ({base_offset}, {epoch})"
        )
    if kind not in _KINDS:
        raise StorageCorruptError(f"{what} at {where} has unknown batch kind {kind}")
    if count == 0:
        raise StorageCorruptError(f"{what} at {where} holds no records")
    pos = _BATCH_HEAD.size
    records: list[bytes] = []
    for i in range(count):
        if pos + _LEN.size > len(body):
            raise StorageCorruptError(
                f"{what} at {where} is truncated: record {i} of {count} has no length "
                f"(body ends at byte {len(body)})"
            )
        (length,) = _LEN.unpack_from(body, pos)
        pos += _LEN.size
        if pos + length > len(body):
            raise StorageCorruptError(
                f"{what} at {where} is truncated: record {i} of {count} claims {length} "
                f"bytes but only {len(body) - pos} remain"
            )
        records.append(bytes(body[pos : pos + length]))
        pos += length
    if pos != len(body):
        raise StorageCorruptError(
            f"{what} at {where} has {len(body) - pos} unexpected bytes after its {count} records"
        )
    return Batch(base_offset, epoch, tuple(records), BatchKind(kind))


def _node_field(value: int | None, field: str) -> int:
    if value is None:
        return -1
    if not 0 <= value <= _I32_MAX:
        raise ValueError(f"{field} {value} out of range")
    return value


def encode_quorum_state(state: QuorumState) -> bytes:
    if not 0 <= state.epoch <= _I32_MAX:
        raise ValueError(f"epoch {state.epoch} out of range")
    body = _STATE.pack(
        state.epoch,
        _node_field(state.voted_for, "voted_for"),
        _node_field(state.leader_id, "leader_id"),
    )
    return _PREFIX.pack(STATE_FORMAT_VERSION, crc32c(body)) + body


def decode_quorum_state(data: bytes, where: str) -> QuorumState:
    """Decode a value made by :func:`encode_quorum_state`, checking everything."""
    what = "quorum state"
    body = _check_prefix(data, what, where, STATE_FORMAT_VERSION)
    if len(body) != _STATE.size:
        raise StorageCorruptError(
            f"{what} at {where} has a body of {len(body)} bytes, expected {_STATE.size}"
        )
    epoch, voted_for, leader_id = _STATE.unpack_from(body)
    if epoch < 0 or voted_for < -1 or leader_id < -1:
        raise StorageCorruptError(
            f"{what} at {where} holds impossible values: epoch {epoch}, "
            f"voted_for {voted_for}, leader_id {leader_id}"
        )
    return QuorumState(
        epoch,
        None if voted_for == -1 else voted_for,
        None if leader_id == -1 else leader_id,
    )
