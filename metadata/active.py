"""The controller at run time: asyncio glue between the quorum node, the
state machine and the decisions of :class:`metadata.controller.Controller`.
It sees the quorum only through :class:`quorum.driver.raft_client.RaftClient`.

Every controller node runs one.  It is *active* while its node leads the
quorum and has applied its own epoch's first batch (so it has replayed
every record before its term: Kafka fires ``handleLeaderChange`` to the
new leader only then); otherwise it is a standby that only replays.

A write runs on the event loop without awaiting between deciding and
queueing: the controller decides on its speculative image, the node queues
the records (:meth:`RaftClient.submit`, which also tells the offset they
will get), the speculative image replays them, and only then does the
caller wait for the commit.  The answer is sent once the records have
committed (and been applied), never before; an answer that writes nothing
waits for every earlier write to commit, so no answer reflects state that
could still be lost.  Losing leadership drops the speculative image.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from metadata import configs
from metadata.configs import ResourceType
from metadata.controller import Controller, ControllerOptions, ControllerResult
from metadata.errors import ApiError, Errors
from metadata.image import MetadataImage
from metadata.records import Record, encode_record
from metadata.state_machine import ControllerStateMachine
from quorum.driver.raft_client import (
    BusyError,
    IndeterminateError,
    NodeStoppedError,
    NotLeaderError,
    ProposalOutcome,
    RaftClient,
    ReadTimeoutError,
)
from quorum.types import Batch

__all__ = ["ControllerSettings", "QuorumController", "batch_bounds"]

log = logging.getLogger("kq.controller")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The ``[controller]`` settings of a controller node."""

    # A broker not heard from for this long is fenced (Kafka's
    # broker.session.timeout.ms).
    broker_session_timeout_ms: int = 9_000
    # The heartbeat interval brokers are expected to keep (Kafka's
    # broker.heartbeat.interval.ms, a broker setting): checked against the
    # session timeout, so that a broker misses several before it is fenced.
    broker_heartbeat_interval_ms: int = 2_000
    # How often the active controller checks sessions and timers.
    tick_interval_ms: int = 250
    # A NoOp record when nothing was written for this long, so brokers can
    # tell how stale their metadata is (KIP-835's
    # metadata.max.idle.interval.ms); 0: never.
    metadata_max_idle_interval_ms: int = 500
    # KIP-966's last known leader: a partition left with no ISR or ELR
    # member (every one restarted uncleanly) elects its last leader, in an
    # unclean election, once that broker is unfenced.  Kafka's
    # PartitionChangeBuilder.useLastKnownLeaderInBalancedRecovery: true, and
    # not a Kafka config (kq's [controller] section and environment only).
    use_last_known_leader: bool = True

    def __post_init__(self) -> None:
        if self.broker_heartbeat_interval_ms >= self.broker_session_timeout_ms:
            raise ValueError(
                f"broker_heartbeat_interval_ms ({self.broker_heartbeat_interval_ms}) must be "
                f"below broker_session_timeout_ms ({self.broker_session_timeout_ms})"
            )
        if self.tick_interval_ms <= 0:
            raise ValueError("tick_interval_ms must be positive")


def batch_bounds(
    encoded: Sequence[bytes], max_records: int, max_bytes: int
) -> list[tuple[int, int]]:
    """[lo, hi) ranges cutting ``encoded`` into batches of at most
    ``max_records`` records and ``max_bytes`` bytes (a single larger record
    alone)."""
    bounds: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, data in enumerate(encoded):
        if i > start and (i - start >= max_records or size + len(data) > max_bytes):
            bounds.append((start, i))
            start, size = i, 0
        size += len(data)
    bounds.append((start, len(encoded)))
    return bounds


class QuorumController:
    def __init__(
        self,
        node: RaftClient,
        state_machine: ControllerStateMachine,
        cluster_id: str,
        settings: ControllerSettings | None = None,
        rng: random.Random | None = None,
    ) -> None:
        settings = settings or ControllerSettings()
        self.settings = settings
        self.node = node
        self.sm = state_machine
        self.options = ControllerOptions(
            cluster_id,
            session_timeout_ms=settings.broker_session_timeout_ms,
            use_last_known_leader=settings.use_last_known_leader,
        )
        self.controller = Controller(self.options, rng or random.Random())
        self.tick_interval_ms = settings.tick_interval_ms
        self.noop_interval_ms = settings.metadata_max_idle_interval_ms
        # The epoch this controller is active in; None: standby.
        self.active_epoch: int | None = None
        self._tail: asyncio.Future[ProposalOutcome] | None = None
        # The end offset of this controller's last write (0: none this term).
        self._written_end = 0
        self._last_write_ms = 0
        self._last_rebalance_ms = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        state_machine.add_batch_listener(self._on_batch)

    @property
    def is_active(self) -> bool:
        return self.active_epoch is not None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        self._become_standby()

    # -- state ----------------------------------------------------------------

    def committed_image(self) -> MetadataImage:
        return self.sm.image

    def _on_batch(self, batch: Batch) -> None:
        """After the state machine applied a committed batch."""
        if self.is_active and self.sm.applied_offset >= self._written_end:
            # Everything this controller wrote has committed: the committed
            # image is the speculative one (and cheaper to hold).
            self.controller.reset(self.sm.image)
        self._wakeup.set()

    def _leads(self) -> int | None:
        """The epoch this node leads, None if it leads none."""
        known = self.node.leader_and_epoch()
        return known.epoch if known.leader_id == self.node.node_id else None

    def _should_be_active(self) -> bool:
        epoch = self._leads()
        return (
            epoch is not None and self.sm.last_leader_change_epoch == epoch and not self._stopping
        )

    def _become_active(self) -> None:
        epoch = self.node.leader_and_epoch().epoch
        now = self.node.now_ms()
        self.active_epoch = epoch
        self._last_rebalance_ms = now
        records = self.controller.activate(self.sm.image, now)
        log.info(
            "controller %d is active in epoch %d at offset %d (%d brokers, %d topics)",
            self.node.node_id,
            epoch,
            self.sm.applied_offset,
            len(self.sm.image.brokers),
            len(self.sm.image.topics),
        )
        try:
            self._append_unawaited(records, atomic=False)
        except ApiError as exc:
            log.warning("controller %d could not open its term: %s", self.node.node_id, exc)
            self._become_standby()

    def _become_standby(self) -> None:
        if self.active_epoch is not None:
            log.info(
                "controller %d is no longer active (epoch %d)",
                self.node.node_id,
                self.active_epoch,
            )
        self.active_epoch = None
        self._tail = None
        self._written_end = 0
        self.controller.reset(self.sm.image)

    def _check_role(self) -> None:
        if self.is_active and self._leads() != self.active_epoch:
            self._become_standby()
        if not self.is_active and self._should_be_active():
            self._become_active()

    def _not_controller(self) -> ApiError:
        return ApiError(
            Errors.NOT_CONTROLLER,
            f"controller {self.node.node_id} is not the active controller",
        )

    # -- writing ------------------------------------------------------------------

    def _append(self, records: list[Record], atomic: bool) -> asyncio.Future[ProposalOutcome]:
        """Queue ``records`` and replay them into the speculative image, in
        batches of at most the node's limits; ``atomic`` ones must fit one."""
        encoded = [encode_record(r) for r in records]
        chunks = batch_bounds(encoded, self.node.max_batch_records, self.node.max_batch_bytes)
        if atomic and len(chunks) > 1:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"the change needs {len(records)} records, more than one batch holds",
            )
        future: asyncio.Future[ProposalOutcome] | None = None
        # Only the epoch this controller decided in: were the node to lead a
        # later one meanwhile, the speculative image would be stale.
        epoch = self.active_epoch
        assert epoch is not None
        for lo, hi in chunks:
            try:
                base, future = self.node.submit(encoded[lo:hi], epoch)
            except NotLeaderError:
                self._become_standby()
                raise self._not_controller() from None
            except BusyError as exc:
                raise ApiError(Errors.THROTTLING, str(exc)) from None
            except NodeStoppedError as exc:
                raise ApiError(Errors.NOT_CONTROLLER, str(exc)) from None
            self.controller.replay(records[lo:hi], base, epoch)
            self._written_end = base + hi - lo
        assert future is not None
        self._tail = future
        self._last_write_ms = self.node.now_ms()
        return future

    def _append_unawaited(self, records: list[Record], atomic: bool) -> None:
        """Write records nobody waits for (the controller's own: opening its
        term, fencing, rebalancing, NoOps); a failure is only logged: the
        condition that caused the write causes it again."""
        future = self._append(records, atomic)
        future.add_done_callback(self._note_failure)

    def _note_failure(self, future: asyncio.Future[ProposalOutcome]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.info(
                "controller %d: a write of its own did not commit: %s",
                self.node.node_id,
                future.exception(),
            )

    async def _await(self, future: asyncio.Future[ProposalOutcome], timeout_s: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            raise ApiError(
                Errors.INDETERMINATE,
                f"no outcome within {timeout_s:.3f}s: the change may or may not have committed",
            ) from None
        except NotLeaderError:
            # The records were never appended, or another leader's batch took
            # their offsets: they did not commit.
            self._check_role()
            raise self._not_controller() from None
        except (IndeterminateError, NodeStoppedError) as exc:
            raise ApiError(Errors.INDETERMINATE, str(exc)) from None

    async def write(
        self, decide: Callable[[Controller], ControllerResult[T]], timeout_s: float
    ) -> T:
        """Decide on the speculative image, write the records, answer once
        they committed.  Raises ApiError (NOT_CONTROLLER off the active
        controller, the decision's own refusals, INDETERMINATE)."""
        response, _ = await self.write_at(decide, timeout_s)
        return response

    async def write_at(
        self, decide: Callable[[Controller], ControllerResult[T]], timeout_s: float
    ) -> tuple[T, ProposalOutcome | None]:
        """:meth:`write`, also saying where the decision's last batch
        committed (its first offset and epoch); None when it wrote nothing."""
        self._check_role()
        if not self.is_active:
            raise self._not_controller()
        self.controller.next_offset = self.node.next_offset()
        result = decide(self.controller)
        if result.records:
            future = self._append(result.records, result.atomic)
            await self._await(future, timeout_s)
            return result.response, future.result()
        if self._tail is not None and not self._tail.done():
            await self._await(self._tail, timeout_s)
        return result.response, None

    async def read(self, linearizable: bool, timeout_s: float) -> MetadataImage:
        """The committed image; ``linearizable``: only on the active
        controller, after confirming leadership (read index)."""
        if linearizable:
            if not self.is_active:
                raise self._not_controller()
            try:
                await self.node.read_barrier(timeout_s)
            except NotLeaderError:
                raise self._not_controller() from None
            except (ReadTimeoutError, NodeStoppedError) as exc:
                raise ApiError(Errors.REQUEST_TIMED_OUT, str(exc)) from None
        return self.sm.image

    # -- periodic work --------------------------------------------------------------

    async def _run(self) -> None:
        interval = self.tick_interval_ms / 1000
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), interval)
            self._wakeup.clear()
            if self._stopping:
                break
            try:
                self._check_role()
                if self.is_active:
                    self._tick(self.node.now_ms())
            except ApiError as exc:
                log.warning("controller %d: periodic work refused: %s", self.node.node_id, exc)
            except Exception:  # pragma: no cover - keep the controller alive, loudly
                log.exception("controller %d: periodic work failed", self.node.node_id)

    def _tick(self, now_ms: int) -> None:
        c = self.controller
        c.next_offset = self.node.next_offset()
        fenced = c.fence_expired(now_ms, limit=1)
        if fenced.records:
            log.warning(
                "controller %d fences broker(s) %s: no heartbeat within %d ms",
                self.node.node_id,
                fenced.response,
                self.options.session_timeout_ms,
            )
            self._append_unawaited(fenced.records, atomic=False)
        cluster = c.image.config((int(ResourceType.CLUSTER), ""))
        every_s = configs.as_int(
            configs.effective("leader.imbalance.check.interval.seconds", cluster=cluster)
        )
        if now_ms - self._last_rebalance_ms >= every_s * 1000:
            self._last_rebalance_ms = now_ms
            c.next_offset = self.node.next_offset()
            moved = c.rebalance_leaders()
            if moved.records:
                log.info(
                    "controller %d moves %d leaderships back to preferred replicas",
                    self.node.node_id,
                    moved.response,
                )
                self._append_unawaited(moved.records, atomic=False)
        if self.noop_interval_ms and now_ms - self._last_write_ms >= self.noop_interval_ms:
            self._append_unawaited(c.noop().records, atomic=True)
