"""B14 of the catalogue: recovery after an unclean shutdown trusts the
segment without checking its batches' CRCs, so a batch damaged on disk
(a bit flip in its records) stays in the log and is served to consumers
and followers. With the bug off, recovery cuts the log at that batch."""

from __future__ import annotations

from pathlib import Path

import pytest

import bugs
from bugs import Bug
from partition_log.batch import BatchScanner, decode_records, verify
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.os_files import OsDirectory
from partition_log.segment import file_name
from tests.partition_log.log_util import batch


@pytest.fixture(params=["memory", "os"])
def directory(request: pytest.FixtureRequest, tmp_path: Path) -> FileDirectory:
    return MemoryDirectory() if request.param == "memory" else OsDirectory(tmp_path)


def _crashed_with_a_flipped_tail(directory: FileDirectory) -> None:
    """Three one-record batches (values v0, v1, v2), the first synced; the
    process dies (no clean shutdown) and a bit of v2 flips on disk."""
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    log.append_as_leader(batch(value=b"v0"), 0, now_ms=0)
    log.flush(0)
    log.append_as_leader(batch(value=b"v1"), 0, now_ms=0)
    log.append_as_leader(batch(value=b"v2"), 0, now_ms=0)
    handle = directory.open(file_name(0, ".log"))
    data = bytearray(handle.read(0, handle.size))
    # The record ends with its value and a header count of 0: the byte
    # before the last is the value's last.
    assert data[-2:] == b"2\x00"
    data[-2] ^= 0x01
    handle.truncate(0)
    handle.append(bytes(data))
    handle.close()
    log._active.close()  # the process is gone: no clean shutdown marker


def _batches(log: PartitionLog, offset: int = 0) -> list[bytes]:
    """The batches a read from ``offset`` serves, as they are (a consumer
    or follower checks their CRCs, the read does not)."""
    data = log.read(offset, 1 << 20)
    return [data[b.position : b.end] for b in BatchScanner(data, check_crc=False)]


def _values(log: PartitionLog) -> list[bytes | None]:
    return [record.value for data in _batches(log) for record in decode_records(data)]


def test_recovery_cuts_the_log_at_a_batch_whose_crc_fails(directory: FileDirectory) -> None:
    _crashed_with_a_flipped_tail(directory)
    reopened = PartitionLog.open(directory, LogConfig(), now_ms=0)
    assert not reopened.recovery.clean
    assert reopened.recovery.reason is not None and "CRC" in reopened.recovery.reason
    assert reopened.log_end_offset == 2
    assert _values(reopened) == [b"v0", b"v1"]
    reopened.close()


def test_b14_recovery_without_crcs_serves_the_damaged_batch(directory: FileDirectory) -> None:
    _crashed_with_a_flipped_tail(directory)
    with bugs.injected(Bug.RECOVERY_SKIPS_CRC):
        reopened = PartitionLog.open(directory, LogConfig(), now_ms=0)
    assert not reopened.recovery.clean and reopened.recovery.truncated_bytes == 0
    assert reopened.log_end_offset == 3
    # The value read at offset 2 is not the one written there.
    assert _values(reopened) == [b"v0", b"v1", b"v3"]
    (served,) = _batches(reopened, 2)
    with pytest.raises(PartitionLogError) as error:
        verify(served)
    assert error.value.code is Errors.CORRUPT_MESSAGE
    reopened.close()
