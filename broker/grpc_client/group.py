"""The consumer's group driver over gRPC (Kafka's ``ConsumerCoordinator`` /
``HeartbeatRequestManager`` / ``CommitRequestManager`` with the KIP-848
"consumer" protocol): the heartbeat task, the rebalance steps run on the
application's poll path, OffsetCommit and OffsetFetch, over the pure
``broker.client.membership.Membership`` (docs/clients.md, "Consumer
groups").

Topic ids of an assignment are named by the coordinator's answer (each
``TopicPartitions.topic``); the client never needs a regex's topic list,
since the coordinator resolves the pattern.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from broker.client.consumer import ConsumerCore
from broker.client.membership import (
    AssignedTopic,
    HeartbeatAnswer,
    HeartbeatRequest,
    Membership,
    MemberState,
    RebalanceKind,
    RebalanceStep,
)
from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.grpc_client.coordinator import MAY_HAVE_WRITTEN, CallTrace, GroupCoordinatorClient
from broker.grpc_client.errors import BrokerClientError
from broker.grpc_client.metadata_cache import MetadataCache, now_ms
from kqproto import groups_pb2

__all__ = [
    "CommitError",
    "CommitFailedError",
    "GroupDriver",
    "IllegalStateError",
    "OffsetAndEpoch",
    "RebalanceListener",
]

log = logging.getLogger(__name__)

OffsetAndEpoch = tuple[int, int]

# A commit refused because the member no longer owns what it commits
# (KIP-848: its epoch moved on, or it was fenced or removed).
_NOT_OWNER = frozenset(
    {Errors.STALE_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID, Errors.FENCED_MEMBER_EPOCH}
)


class CommitError(BrokerClientError):
    """A commit that failed: ``definite`` if its offsets were certainly not
    stored (every attempt was refused before the coordinator wrote), else
    they may have been, as a producer's ``info`` (docs/clients.md)."""

    def __init__(self, code: int, message: str, *, definite: bool) -> None:
        super().__init__(code, f"{message} ({'fail' if definite else 'info'})")
        self.definite = definite


class CommitFailedError(CommitError):
    """A commit the coordinator refused because this consumer no longer
    owns the partitions at that member epoch (Kafka's
    ``CommitFailedException``)."""


class IllegalStateError(RuntimeError):
    """A call the consumer's mode forbids (Kafka's ``IllegalStateException``):
    ``assign`` and ``subscribe`` on one consumer."""


class RebalanceListener:
    """Kafka's ``ConsumerRebalanceListener``; each method may be a coroutine.
    Called on the poll path, in this order within a rebalance: revoked
    (after the revoked partitions' offsets were committed, with
    auto-commit), then assigned; lost instead of revoked when the member was
    fenced (no commit: others may own them already)."""

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> object:
        return None

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> object:
        return None

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> object:
        # As ConsumerRebalanceListener.onPartitionsLost's default.
        return self.on_partitions_revoked(partitions)


async def _call(callback: Callable[[list[TopicPartition]], object], parts: list[Any]) -> None:
    result = callback(parts)
    if inspect.isawaitable(result):
        await result


def _pb_request(group_id: str, request: HeartbeatRequest) -> Any:
    message = groups_pb2.ConsumerGroupHeartbeatRequest(
        group_id=group_id,
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        client_id=request.client_id,
    )
    if request.instance_id is not None:
        message.instance_id = request.instance_id
    if request.subscribed_topic_names is not None:
        message.subscribed_topic_names.names.extend(request.subscribed_topic_names)
    if request.subscribed_topic_regex is not None:
        message.subscribed_topic_regex = request.subscribed_topic_regex
    if request.server_assignor is not None:
        message.server_assignor = request.server_assignor
    if request.owned is not None:
        message.owned.SetInParent()
        for topic_id, parts in request.owned:
            message.owned.topics.add(topic_id=topic_id, partitions=parts)
    return message


def _answer(response: Any) -> HeartbeatAnswer:
    try:
        error = Errors(response.error)
    except ValueError:
        error = Errors.UNKNOWN_SERVER_ERROR
    assignment = None
    if response.HasField("assignment"):
        assignment = tuple(
            AssignedTopic(t.topic_id, t.topic, tuple(t.partitions))
            for t in response.assignment.topics
        )
    return HeartbeatAnswer(
        error=error,
        message=response.message,
        member_id=response.member_id,
        member_epoch=response.member_epoch,
        heartbeat_interval_ms=response.heartbeat_interval_ms,
        assignment=assignment,
    )


class GroupDriver:
    """One consumer's membership, heartbeats and commits."""

    def __init__(
        self,
        cache: MetadataCache,
        member: Membership,
        core: ConsumerCore,
        request_timeout_ms: int,
    ) -> None:
        self.member = member
        self.core = core
        self.group_id = member.config.group_id
        self.coordinator = GroupCoordinatorClient(cache, self.group_id)
        self.request_timeout_ms = request_timeout_ms
        self.listener: RebalanceListener = RebalanceListener()
        # New partitions waiting for their committed offsets.
        self.awaiting_committed: set[TopicPartition] = set()
        # OffsetFetch's RequireStable (KIP-447), as Kafka's consumer sets it
        # at read_committed: a partition whose offset a transaction has
        # pending answers UNSTABLE_OFFSET_COMMIT and is asked again at the
        # next poll, so a new owner never starts from an offset that the
        # pending transaction is about to move past.
        self.require_stable = False
        self.auto_commit = False
        # Told the partitions each commit stored (Kafka's
        # ConsumerInterceptor.onCommit): what the application may report as
        # acknowledged.
        self.on_commit: Callable[[dict[TopicPartition, OffsetAndEpoch]], object] | None = None
        self.changed = asyncio.Event()  # an answer the poll path may act on
        self._wake = asyncio.Event()  # something for the heartbeat task
        self._task: asyncio.Task[None] | None = None

    # -- the heartbeat task -----------------------------------------------------------

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._heartbeats())

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _heartbeats(self) -> None:
        while True:
            try:
                await self._heartbeat_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug must not silently end the membership: the session
                # would expire with nobody noticing.
                log.exception("heartbeat task of group %s", self.group_id)
                await asyncio.sleep(self.member.config.retry_backoff_ms / 1000)

    async def _heartbeat_once(self) -> None:
        now = now_ms()
        self.member.tick(now)
        request = self.member.heartbeat_to_send(now)
        if request is None:
            wait_ms = max(1, min(self.member.next_heartbeat_ms() - now, 500))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_ms / 1000)
            return
        try:
            response = await self._heartbeat(_pb_request(self.group_id, request))
        except BrokerClientError as error:
            log.info("heartbeat of group %s failed: %s", self.group_id, error)
            self.member.step_heartbeat_failure(now_ms())
        else:
            self.member.step_heartbeat_response(_answer(response), now_ms())
        self.changed.set()

    async def _heartbeat(self, message: Any) -> Any:
        return await self.coordinator.call(
            "ConsumerGroupHeartbeat",
            lambda stub, t: stub.ConsumerGroupHeartbeat(message, timeout=t),
            self.request_timeout_ms,
        )

    # -- rebalance steps (the poll path) ------------------------------------------------

    async def run_steps(self) -> None:
        """Run the rebalance steps due (commit, listener, assignment), as
        Kafka runs its callbacks in the application's poll."""
        while (step := self.member.rebalance_step()) is not None:
            try:
                await self._run(step)
            finally:
                self.member.complete(step, now_ms())
                self.wake()

    async def _run(self, step: RebalanceStep) -> None:
        parts = sorted(step.partitions)
        held = self.core.assignment()
        if step.kind is RebalanceKind.REVOKE:
            if self.auto_commit:
                offsets = {
                    tp: at for tp, at in self.core.committable().items() if tp in step.partitions
                }
                try:
                    await self.commit(offsets)
                except BrokerClientError as error:
                    # ConsumerCoordinator logs a failed commit before revocation.
                    log.warning("commit before revoking %s failed: %s", parts, error)
            try:
                await _call(self.listener.on_partitions_revoked, parts)
            finally:
                self.core.assign(held - step.partitions)
                self.awaiting_committed -= step.partitions
        elif step.kind is RebalanceKind.LOSE:
            try:
                await _call(self.listener.on_partitions_lost, parts)
            finally:
                self.core.assign(held - step.partitions)
                self.awaiting_committed -= step.partitions
        else:
            self.core.assign(held | step.partitions)
            self.awaiting_committed |= step.partitions
            await self.maybe_fetch_positions()
            await _call(self.listener.on_partitions_assigned, parts)

    async def maybe_fetch_positions(self) -> None:
        """Positions of new partitions from their committed offsets, with
        the leader epoch (KIP-320); those without one are reset by
        ``auto.offset.reset``. Left waiting if the coordinator does not
        answer (the next poll asks again)."""
        wanted = self.awaiting_committed & self.core.assignment()
        if not wanted:
            return
        try:
            found = await self.committed(wanted)
        except BrokerClientError as error:
            log.info("OffsetFetch for %s failed: %s", sorted(wanted), error)
            return
        for tp in wanted:
            at = found.get(tp)
            if at is not None and tp in self.core.assignment():
                self.core.seek(tp, at[0], at[1])
        self.awaiting_committed -= wanted

    # -- commits ------------------------------------------------------------------------

    def member_pair(self) -> tuple[str, int]:
        """The member id and epoch commits go with ("" and -1 outside
        membership)."""
        return self._member_pair()

    def _member_pair(self) -> tuple[str, int]:
        if self.member.member_epoch > 0 and self.member.state not in (
            MemberState.UNSUBSCRIBED,
            MemberState.STALE,
            MemberState.FATAL,
        ):
            return self.member.member_id, self.member.member_epoch
        # Outside membership (a consumer that assigns itself partitions).
        return "", -1

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndEpoch]) -> None:
        """OffsetCommit of ``offsets`` (next offset to read, leader epoch of
        the last record consumed) with this member's id and epoch."""
        if not offsets:
            return
        member_id, epoch = self._member_pair()
        topics: dict[str, list[Any]] = {}
        for tp, (offset, leader_epoch) in sorted(offsets.items()):
            if offset < 0:
                raise ValueError(f"cannot commit a negative offset {offset} for {tp}")
            topics.setdefault(tp.topic, []).append(
                groups_pb2.OffsetCommitPartition(
                    partition=tp.partition, offset=offset, leader_epoch=leader_epoch
                )
            )
        request = groups_pb2.OffsetCommitRequest(
            group_id=self.group_id,
            member_id=member_id,
            member_epoch=epoch,
            topics=[groups_pb2.OffsetCommitTopic(name=t, partitions=p) for t, p in topics.items()],
        )
        trace = CallTrace()
        try:
            response = await self.coordinator.call(
                "OffsetCommit",
                lambda stub, t: stub.OffsetCommit(request, timeout=t),
                self.request_timeout_ms,
                trace,
            )
        except BrokerClientError as error:
            # No answer in time (or an unexpected status): stored only if an
            # attempt reached the coordinator.
            raise CommitError(
                error.code, f"commit to group {self.group_id}: {error.message}",
                definite=not trace.uncertain,
            ) from error  # fmt: skip
        self._check_commit(int(response.error), response.message, "", member_id, epoch, trace)
        self._acknowledged(offsets, response)
        failed = [
            (f" of {topic.name}-{part.partition}", part)
            for topic in response.topics
            for part in topic.partitions
            if part.error != Errors.NONE
        ]
        written = sum(len(t.partitions) for t in response.topics) > len(failed)
        for where, part in failed:
            # Some partitions stored and others not is no definite failure.
            trace.uncertain |= written
            self._check_commit(int(part.error), part.message, where, member_id, epoch, trace)

    def _acknowledged(
        self, offsets: Mapping[TopicPartition, OffsetAndEpoch], response: Any
    ) -> None:
        """``on_commit`` with the partitions the coordinator answered NONE
        (stored: the answer comes once the offsets partition's high
        watermark passed them); its errors are logged, as Kafka's
        interceptors', and never fail the commit."""
        if self.on_commit is None:
            return
        stored = {
            tp: offsets[tp]
            for topic in response.topics
            for part in topic.partitions
            if part.error == Errors.NONE
            and (tp := TopicPartition(topic.name, part.partition)) in offsets
        }
        if not stored:
            return
        try:
            self.on_commit(stored)
        except Exception:
            log.exception("on_commit of group %s", self.group_id)

    def _check_commit(
        self, code: int, message: str, where: str, member: str, epoch: int, trace: CallTrace
    ) -> None:
        if code == Errors.NONE:
            return
        try:
            error = Errors(code)
        except ValueError:
            error = Errors.UNKNOWN_SERVER_ERROR
        # A refusal is definite unless this or an earlier attempt may have
        # written (NOT_COORDINATOR after the append, a lost answer).
        definite = not trace.uncertain and error not in MAY_HAVE_WRITTEN
        if error in _NOT_OWNER:
            raise CommitFailedError(
                code,
                f"commit{where} to group {self.group_id} refused ({error.name}): member "
                f"{member or '(none)'} at epoch {epoch} no longer owns the partitions "
                f"(a rebalance moved them, or the member was fenced); {message}",
                definite=definite,
            )
        raise CommitError(
            code,
            f"commit{where} to group {self.group_id} failed: {error.name} {message}",
            definite=definite,
        )

    async def committed(
        self, partitions: set[TopicPartition] | frozenset[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndEpoch]:
        """OffsetFetch: the committed (offset, leader epoch) of each
        partition that has one."""
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(partitions):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        member_id, epoch = self._member_pair()
        request = groups_pb2.OffsetFetchRequest(
            group_id=self.group_id,
            topics=[
                groups_pb2.TopicPartitionNumbers(name=t, partitions=p) for t, p in by_topic.items()
            ],
            member_id=member_id,
            member_epoch=epoch,
            require_stable=self.require_stable,
        )
        response = await self.coordinator.call(
            "OffsetFetch",
            lambda stub, t: stub.OffsetFetch(request, timeout=t),
            self.request_timeout_ms,
        )
        if response.error != Errors.NONE:
            raise BrokerClientError(
                int(response.error), f"OffsetFetch for group {self.group_id}: {response.message}"
            )
        out: dict[TopicPartition, OffsetAndEpoch] = {}
        for topic in response.topics:
            for part in topic.partitions:
                if part.error != Errors.NONE:
                    raise BrokerClientError(
                        int(part.error),
                        f"OffsetFetch of {topic.name}-{part.partition} for group "
                        f"{self.group_id}: {part.message}",
                    )
                if part.offset >= 0:
                    out[TopicPartition(topic.name, part.partition)] = (
                        part.offset,
                        part.leader_epoch,
                    )
        return out
