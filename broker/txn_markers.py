"""The leader's side of WriteTxnMarkers (Kafka's
``KafkaApis.handleWriteTxnMarkersRequest``): each marker appended to its
partition as a COMMIT or ABORT control batch at the producer's bumped
epoch, stamped with the coordinator's epoch, and answered once the ISR
holds it (an acks=all append).

A marker on the offsets topic goes through the group coordinator, which
appends it and replays it into its shard at once (the transaction's
offsets take effect or are dropped with it); every other partition's goes
straight to the replica.  A partition refuses a marker whose producer
epoch or coordinator epoch is older than what it has seen
(``INVALID_PRODUCER_EPOCH``, ``TRANSACTION_COORDINATOR_FENCED``): a deposed
coordinator's markers never end a transaction its successor decides; and a
transaction version 2 marker at the epoch of the transaction open there
(``INVALID_PRODUCER_EPOCH``): a late copy of the previous transaction's
marker never ends the next one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from broker.coordinator_runtime import CoordinatorFailure
from broker.errors import Errors, ReplicaError
from broker.group.placement import OFFSETS_TOPIC
from broker.group_coordinator import GroupCoordinator
from broker.purgatory import Operation, Purgatory
from broker.replica import Role
from broker.replica_manager import NotLeaderError, ReplicaManager
from broker.txn.api import TxnMarker
from partition_log.log import AppendOrigin
from partition_log.txn import ControlType, EndTxnMarker, build_marker_batch

__all__ = ["TxnMarkerAppender"]

Answer = dict[tuple[str, int], tuple[Errors, str]]


class TxnMarkerAppender:
    """Appends markers to the partitions this broker leads."""

    def __init__(
        self,
        replicas: ReplicaManager,
        purgatory: Purgatory,
        groups: GroupCoordinator | None,
        *,
        now_ms: Callable[[], int],
        timeout_ms: int = 5_000,
    ) -> None:
        self.replicas = replicas
        self.purgatory = purgatory
        self.groups = groups
        self.now_ms = now_ms
        self.timeout_ms = timeout_ms

    async def append(self, markers: Sequence[TxnMarker], coordinator_epoch: int) -> Answer:
        """Every marker at once; each partition's error."""
        answers = await asyncio.gather(
            *(self._append_one(marker, coordinator_epoch) for marker in markers)
        )
        return {
            (marker.topic, marker.partition): answer
            for marker, answer in zip(markers, answers, strict=True)
        }

    async def _append_one(self, marker: TxnMarker, coordinator_epoch: int) -> tuple[Errors, str]:
        end = EndTxnMarker(
            ControlType.COMMIT if marker.commit else ControlType.ABORT, coordinator_epoch
        )
        if marker.topic == OFFSETS_TOPIC and self.groups is not None:
            try:
                await self.groups.write_marker(
                    marker.partition,
                    marker.producer_id,
                    marker.producer_epoch,
                    end,
                    bumps_epoch=marker.bumps_epoch,
                )
            except CoordinatorFailure as failure:
                return failure.code, failure.message
            except ReplicaError as error:
                return error.code, str(error.args[0])
            return Errors.NONE, ""
        try:
            key = self.replicas.resolve(marker.topic, marker.partition)
            now = self.now_ms()
            batch = build_marker_batch(marker.producer_id, marker.producer_epoch, end, now)
            appended = self.replicas.append(
                key,
                batch,
                -1,
                now,
                origin=AppendOrigin.COORDINATOR,
                marker_bumps_epoch=marker.bumps_epoch,
            )
            self.purgatory.wake(key)
        except NotLeaderError as error:
            return error.code, str(error.args[0])
        except ReplicaError as error:
            return error.code, str(error.args[0])
        required = appended.info.last_offset + 1
        epoch = appended.leader_epoch
        outcome: list[Errors] = []

        def check() -> bool | None:
            replica = self.replicas.replicas.get(key)
            if replica is None or replica.role is not Role.LEADER:
                outcome.append(Errors.NOT_LEADER_OR_FOLLOWER)
                return True
            result = replica.check_enough_replicas_reach_offset(required, epoch)
            if not result.done:
                return None
            outcome.append(result.error)
            return True

        done = await self.purgatory.wait_until(
            (key,), check, self.timeout_ms / 1000, operation=Operation.TXN_MARKER
        )
        if not done:
            return (
                Errors.REQUEST_TIMED_OUT,
                f"the marker at offset {required - 1} of {marker.topic}-{marker.partition} did "
                f"not reach the ISR within {self.timeout_ms} ms",
            )
        found = outcome[-1]
        if found is Errors.NONE:
            return Errors.NONE, ""
        return (
            found,
            f"the marker at offset {required - 1} of {marker.topic}-{marker.partition}: "
            f"{found.name}",
        )
