"""Reading a simulated replica's log from outside: its batches by base
offset, each named by its leader epoch and CRC (equal pairs are the same
write), and the record values a consumer would get."""

from __future__ import annotations

from partition_log.batch import BatchScanner, decode_records
from partition_log.log import PartitionLog

__all__ = ["BatchId", "batches", "read_values"]

# (leader epoch, CRC) of the batch at a base offset.
BatchId = tuple[int, int]


def batches(log: PartitionLog) -> dict[int, BatchId]:
    """Every batch of ``log`` by base offset."""
    found: dict[int, BatchId] = {}
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 30)
        if not data:
            break
        for batch in BatchScanner(data, check_crc=False):
            header = batch.header
            found[header.base_offset] = (header.partition_leader_epoch, header.crc)
            offset = header.next_offset
    return found


def read_values(data: bytes) -> list[tuple[int, BatchId, str]]:
    """(offset, batch, value) of every record in ``data`` (whole batches)."""
    out: list[tuple[int, BatchId, str]] = []
    for batch in BatchScanner(data, check_crc=False):
        header = batch.header
        raw = data[batch.position : batch.end]
        for record in decode_records(raw):
            value = b"" if record.value is None else record.value
            out.append(
                (
                    record.offset,
                    (header.partition_leader_epoch, header.crc),
                    value.decode("utf-8", "replace"),
                )
            )
    return out
