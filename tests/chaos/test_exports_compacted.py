"""A record's sequence in the node exports is its batch's base sequence plus
its offset delta: compaction keeps a batch's base offset and base sequence
but drops records from it, so a replica that cleaned the batch and one that
did not export the same sequence at every offset both still hold."""

from __future__ import annotations

from pathlib import Path

from chaos.node_exports import partition_exports
from history.partition_checks import PartitionExports, check_partitions
from partition_log.batch import BatchHeader
from partition_log.compaction import OffsetMap, build_offset_map, clean_batch
from partition_log.log import LogConfig, PartitionLog
from partition_log.log_files import encode_offset
from partition_log.os_files import OsDirectory
from tests.partition_log.log_util import batch

PRODUCER, BASE_SEQUENCE = 7, 10


def _batches() -> list[bytes]:
    """Producer 7's first batch (keys k0, k1, k2 at offsets 0-2, sequences
    10-12), then its second (key k0 again at offset 3, sequence 13), which
    makes the record at offset 0 obsolete."""
    first = batch(3, producer=PRODUCER, producer_epoch=0, sequence=BASE_SEQUENCE, epoch=0)
    second = batch(
        1, base=3, producer=PRODUCER, producer_epoch=0, sequence=BASE_SEQUENCE + 3, epoch=0
    )
    return [first, second]


def _replica(logs: Path, batches: list[bytes]) -> None:
    path = logs / "queue-0"
    path.mkdir(parents=True)
    log = PartitionLog.open(OsDirectory(path), LogConfig(), now_ms=0)
    for data in batches:
        log.append_as_follower(data)
    log.close()
    (path / "replication-offset-checkpoint").write_bytes(encode_offset(4))


def _cleaned(batches: list[bytes]) -> list[bytes]:
    offset_map = OffsetMap()
    build_offset_map(batches, 0, offset_map)
    last = BatchHeader.parse(batches[-1]).last_offset
    out = []
    for data in batches:
        kept = clean_batch(
            data,
            offset_map,
            now_ms=0,
            delete_retention_ms=0,
            producer_last_offsets={PRODUCER: last},
        )
        if kept is not None:
            out.append(kept)
    return out


def test_a_cleaned_batch_exports_the_sequences_its_records_were_sent_with(
    tmp_path: Path,
) -> None:
    cleaned = _cleaned(_batches())
    # The cleaning did drop offset 0 from the first batch, keeping its base.
    header = BatchHeader.parse(cleaned[0])
    assert (header.base_offset, header.base_sequence, header.records_count) == (
        0,
        BASE_SEQUENCE,
        2,
    )
    _replica(tmp_path / "4", cleaned)
    records, _ = partition_exports(4, [tmp_path / "4"])
    assert [(r["offset"], r["sequence"]) for r in records] == [(1, 11), (2, 12), (3, 13)]


def test_a_cleaned_and_an_uncleaned_replica_do_not_diverge(tmp_path: Path) -> None:
    _replica(tmp_path / "4", _cleaned(_batches()))
    _replica(tmp_path / "5", _batches())
    records4, states4 = partition_exports(4, [tmp_path / "4"])
    records5, states5 = partition_exports(5, [tmp_path / "5"])
    found = check_partitions(
        PartitionExports(records=(*records4, *records5), states=(*states4, *states5))
    )
    assert found["replica-divergence"] == []
    # The same replicas, one of them holding a different sequence at
    # offset 2 (a batch written by another producer state): divergence.
    other = batch(3, producer=PRODUCER, producer_epoch=0, sequence=BASE_SEQUENCE + 1, epoch=0)
    _replica(tmp_path / "6", [other, _batches()[1]])
    records6, states6 = partition_exports(6, [tmp_path / "6"])
    found = check_partitions(
        PartitionExports(records=(*records4, *records6), states=(*states4, *states6))
    )
    assert [a.offsets for a in found["replica-divergence"]] == [(1,), (2,)]


def test_record_sequences_wrap_as_kafkas_do(tmp_path: Path) -> None:
    # DefaultRecordBatch.incrementSequence: after 2^31-1 comes 0.
    top = (1 << 31) - 2
    data = batch(3, producer=PRODUCER, producer_epoch=0, sequence=top, epoch=0)
    _replica(tmp_path / "4", [data])
    records, _ = partition_exports(4, [tmp_path / "4"])
    assert [r["sequence"] for r in records] == [top, top + 1, 0]
