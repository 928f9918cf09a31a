"""A batch whose CRC fails in a broker's log (a torn tail that B14's
recovery kept) is exported as damaged at each of its offsets, so that
replica-divergence finds the replica differing from the others there."""

from __future__ import annotations

from pathlib import Path

from chaos.node_exports import DAMAGED_HASH, partition_exports
from history.partition_checks import PartitionExports, check_partitions
from partition_log.log import LogConfig, PartitionLog
from partition_log.log_files import encode_offset
from partition_log.os_files import OsDirectory
from partition_log.segment import file_name
from tests.partition_log.log_util import batch


def _replica(logs: Path, values: list[bytes], *, flip_last: bool) -> None:
    """A replica of queue-0 holding one single-record batch per value, its
    HW at its end; with ``flip_last`` a bit of the last value flipped on
    disk, as a damaged tail kept by a recovery leaves it."""
    path = logs / "queue-0"
    path.mkdir(parents=True)
    directory = OsDirectory(path)
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    for value in values:
        log.append_as_leader(batch(value=value), 0, now_ms=0)
    log.close()
    (path / "replication-offset-checkpoint").write_bytes(encode_offset(len(values)))
    if flip_last:
        segment = path / file_name(0, ".log")
        data = bytearray(segment.read_bytes())
        # The record ends with its value, then a header count of 0.
        assert data[-2:] == values[-1][-1:] + b"\x00"
        data[-2] ^= 0x01
        segment.write_bytes(bytes(data))


def test_a_damaged_batch_is_exported_as_damaged(tmp_path: Path) -> None:
    values = [b"v0", b"v1", b"v2"]
    _replica(tmp_path / "4", values, flip_last=True)
    records, states = partition_exports(4, [tmp_path / "4"])
    assert [(r["offset"], r["hash"] == DAMAGED_HASH) for r in records] == [
        (0, False),
        (1, False),
        (2, True),
    ]
    assert states[0]["log_end_offset"] == 3 and states[0]["high_watermark"] == 3


def test_replica_divergence_fires_on_a_replica_holding_a_damaged_batch(tmp_path: Path) -> None:
    values = [b"v0", b"v1", b"v2"]
    _replica(tmp_path / "4", values, flip_last=True)
    _replica(tmp_path / "5", values, flip_last=False)
    records4, states4 = partition_exports(4, [tmp_path / "4"])
    records5, states5 = partition_exports(5, [tmp_path / "5"])
    found = check_partitions(
        PartitionExports(records=(*records4, *records5), states=(*states4, *states5))
    )
    (anomaly,) = found["replica-divergence"]
    assert (
        anomaly.nodes == (4, 5) and anomaly.offsets == (2,) and DAMAGED_HASH[:12] in anomaly.message
    )
    # Both intact: nothing.
    _replica(tmp_path / "6", values, flip_last=False)
    records6, states6 = partition_exports(6, [tmp_path / "6"])
    found = check_partitions(
        PartitionExports(records=(*records5, *records6), states=(*states5, *states6))
    )
    assert found["replica-divergence"] == []
