"""The simulator's replicated state machine: a hash chain over the log.

Each applied batch extends ``chain = sha256(chain || offset || epoch ||
kind || records)`` (the idea of hashicorp/raft's fuzzy FSM), so two nodes
that applied the same committed prefix hold the same 32 bytes, and a
snapshot is just the chain at its end offset.
"""

from __future__ import annotations

import json

from quorum.shared_log import chain_digest
from quorum.types import Batch, SnapshotId

__all__ = ["HashChainMachine"]

GENESIS = b"\x00" * 32


class HashChainMachine:
    def __init__(self) -> None:
        self.applied_end = 0
        self.last_epoch = 0
        self.chain = GENESIS
        self.batches_applied = 0

    def apply(self, batch: Batch) -> None:
        if batch.base_offset != self.applied_end:
            raise AssertionError(
                f"batch at {batch.base_offset} applied after offset {self.applied_end}"
            )
        self.chain = chain_digest(self.chain, batch)  # as a node's SharedLog does
        self.applied_end = batch.end_offset
        self.last_epoch = batch.epoch
        self.batches_applied += 1

    def snapshot(self) -> tuple[SnapshotId, bytes]:
        sid = SnapshotId(self.applied_end, self.last_epoch)
        data = json.dumps(
            {"end_offset": self.applied_end, "epoch": self.last_epoch, "chain": self.chain.hex()}
        ).encode()
        return sid, data

    def load(self, sid: SnapshotId, data: bytes) -> None:
        obj = json.loads(data)
        if obj["end_offset"] != sid.end_offset or obj["epoch"] != sid.epoch:
            raise AssertionError(f"snapshot {sid} holds {obj}")
        self.applied_end = sid.end_offset
        self.last_epoch = sid.epoch
        self.chain = bytes.fromhex(obj["chain"])
