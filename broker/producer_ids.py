"""Where a broker's producer ids come from (InitProducerId for idempotent
producers): blocks of ids the controller hands out (``AllocateProducerIds``,
KIP-730), used up one id per producer (Kafka's ``RPCProducerIdManager``).

:class:`ProducerIdSource` is the seam the broker's service asks;
:class:`BlockProducerIds` takes its blocks from any
:class:`ProducerIdBlocks` (the process backs it with the controller's RPC;
:class:`CountingBlocks` is its in-process twin for tests).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "BlockProducerIds",
    "CountingBlocks",
    "ProducerIdBlock",
    "ProducerIdBlocks",
    "ProducerIdSource",
    "ProducerIdsError",
]


class ProducerIdsError(Exception):
    """No producer id could be had (the controller refused or is
    unreachable): the producer retries (Kafka answers
    COORDINATOR_LOAD_IN_PROGRESS or the controller's error)."""


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """``AllocateProducerIdsResponse``: ``length`` ids from ``first``."""

    first: int
    length: int

    def __post_init__(self) -> None:
        if self.first < 0 or self.length <= 0:
            raise ValueError(
                f"a producer id block needs first >= 0 and length > 0, not "
                f"first {self.first} length {self.length}"
            )


class ProducerIdBlocks(Protocol):
    """Whoever hands out blocks (the controller)."""

    async def allocate_block(self) -> ProducerIdBlock: ...


class ProducerIdSource(Protocol):
    """One new producer id per call."""

    async def next_producer_id(self) -> int: ...


class BlockProducerIds:
    """Ids from blocks, one block asked for at a time, the next one once
    the current is used up (``RPCProducerIdManager.generateProducerId``)."""

    def __init__(self, blocks: ProducerIdBlocks) -> None:
        self._blocks = blocks
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def next_producer_id(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                block = await self._blocks.allocate_block()
                if block.first < self._end:
                    # Blocks only move forward: a repeated id would let two
                    # producers share sequence numbers.
                    raise ProducerIdsError(
                        f"the producer id block from {block.first} overlaps ids already "
                        f"given out (below {self._end})"
                    )
                self._next, self._end = block.first, block.first + block.length
            found = self._next
            self._next += 1
            return found


class CountingBlocks:
    """Blocks of ``block_size`` one after another from ``first``, as the
    controller's ``ProducerIdControlManager`` hands them out."""

    def __init__(self, first: int = 0, block_size: int = 1000) -> None:
        self._next = first
        self.block_size = block_size
        self.allocated = 0

    async def allocate_block(self) -> ProducerIdBlock:
        block = ProducerIdBlock(self._next, self.block_size)
        self._next += self.block_size
        self.allocated += 1
        return block
