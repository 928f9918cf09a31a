"""A partition leader for client tests: it appends the client's batch bytes
as a broker does (CRC and records checked, offsets assigned), with the
partition log's real producer-state checks (duplicates answered with their
original offsets, sequence gaps refused)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.client.accumulator import ProduceAnswer
from broker.errors import Errors
from partition_log.batch import decode_records, verify
from partition_log.errors import PartitionLogError
from partition_log.producer_state import (
    NO_PRODUCER_ID,
    Duplicate,
    ProducerBatch,
    ProducerStateManager,
)


@dataclass
class FakePartition:
    # Each record in the log: (offset, value).
    log: list[tuple[int, bytes | None]] = field(default_factory=list)
    producers: ProducerStateManager = field(default_factory=ProducerStateManager)
    # Batches written, with the producer id, epoch and base sequence they carried.
    written: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def log_end_offset(self) -> int:
        return len(self.log)

    def produce(self, payload: bytes, now_ms: int = 0) -> ProduceAnswer:
        """Append ``payload`` (one batch), as Partition.appendRecordsToLeader."""
        try:
            header = verify(payload)
        except PartitionLogError as error:
            return ProduceAnswer(Errors.CORRUPT_MESSAGE, message=str(error))
        base = self.log_end_offset
        if header.producer_id != NO_PRODUCER_ID:
            producer_batch = ProducerBatch(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.last_offset_delta,
                base,
                header.max_timestamp,
            )
            try:
                check = self.producers.check(producer_batch)
            except PartitionLogError as error:
                return ProduceAnswer(
                    Errors[error.code.name], log_start_offset=0, message=str(error)
                )
            if isinstance(check, Duplicate):
                return ProduceAnswer(
                    Errors.NONE, base_offset=check.first_offset, log_start_offset=0
                )
            self.producers.update(producer_batch)
        for record in decode_records(payload):
            self.log.append((base + record.offset, record.value))
        self.written.append((header.producer_id, header.producer_epoch, header.base_sequence))
        return ProduceAnswer(Errors.NONE, base_offset=base, log_start_offset=0)

    def values(self) -> list[bytes | None]:
        return [value for _, value in self.log]
