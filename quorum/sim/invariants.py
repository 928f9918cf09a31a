"""Safety properties checked after every simulated event.

Each is stated as in Kafka's ``RaftEventSimulationTest`` (SingleLeader,
MonotonicEpoch, MonotonicHighWatermark, MajorityReachedHighWatermark,
ConsistentCommittedData) plus leader completeness (Raft §3.6.3), and two
checks of the Ready contract made as each message leaves its node: a granted
vote is already durable (Raft §3.8), and a fetch offset never exceeds the
durable log (so the leader counts only data that survives a crash).  The
checker sees nodes from outside, through their public status, their stores'
durable contents and what they applied; it never trusts the core's own
bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from quorum.messages import FetchRequest, Message, VoteResponse
from quorum.sim.node import SimNode
from quorum.types import Batch, NodeId, Role, SnapshotId

__all__ = ["InvariantChecker", "Violation"]


class Violation(AssertionError):
    """A safety property failed; the message says which and where."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"{rule}: {detail}")
        self.rule = rule
        self.detail = detail


@dataclass(slots=True)
class InvariantChecker:
    voters: frozenset[NodeId]
    # epoch -> the one node that led it
    leaders: dict[int, NodeId] = field(default_factory=dict)
    # node -> highest epoch ever observed (durable, so across restarts)
    epochs: dict[NodeId, int] = field(default_factory=dict)
    # (node, incarnation) -> highest high watermark observed
    high_watermarks: dict[tuple[NodeId, int], int] = field(default_factory=dict)
    # committed end offset -> epoch of the batch ending there
    committed_marks: dict[int, int] = field(default_factory=dict)
    max_committed: int = 0
    # end offset -> chain hash of the applied prefix ending there
    chains: dict[int, bytes] = field(default_factory=dict)
    # base offset -> (epoch, records) of every batch any node applied
    applied_batches: dict[int, tuple[int, tuple[bytes, ...]]] = field(default_factory=dict)
    checks: int = 0

    # -- applied data: ConsistentCommittedData, continuously --------------

    def on_apply(self, node: NodeId, batch: Batch, chain: bytes) -> None:
        seen = self.applied_batches.setdefault(batch.base_offset, (batch.epoch, batch.records))
        if seen != (batch.epoch, batch.records):
            raise Violation(
                "ConsistentCommittedData",
                f"node {node} applied a batch at offset {batch.base_offset} in epoch "
                f"{batch.epoch} but another node applied one from epoch {seen[0]} there",
            )
        self._check_chain(node, batch.end_offset, chain)

    def on_load(self, node: NodeId, sid: SnapshotId, chain: bytes) -> None:
        self._check_chain(node, sid.end_offset, chain)

    def _check_chain(self, node: NodeId, end_offset: int, chain: bytes) -> None:
        seen = self.chains.setdefault(end_offset, chain)
        if seen != chain:
            raise Violation(
                "ConsistentCommittedData",
                f"node {node}'s applied prefix up to offset {end_offset} differs from "
                "another node's",
            )

    # -- messages leaving a node: the Ready contract's ordering -------------

    def on_send(self, node: SimNode, msg: Message) -> None:
        """What a message promises must already be on disk when it leaves."""
        if isinstance(msg, VoteResponse) and msg.granted and not msg.pre_vote:
            state = node.stores.state.durable()
            durable = state is not None and (
                state.epoch > msg.epoch or (state.epoch == msg.epoch and state.voted_for == msg.dst)
            )
            if not durable:
                raise Violation(
                    "VoteDurableBeforeGrant",
                    f"node {node.node_id} granted its epoch-{msg.epoch} vote to {msg.dst} "
                    f"while its durable state was {state}",
                )
        elif isinstance(msg, FetchRequest):
            durable_end = node.stores.log.durable_end_offset()
            snapshot = node.stores.snapshots.latest()
            covered = max(durable_end, snapshot.end_offset if snapshot else 0)
            if msg.fetch_offset > covered:
                raise Violation(
                    "DurableBeforeFetch",
                    f"node {node.node_id} fetched at offset {msg.fetch_offset} but only "
                    f"{covered} is durable",
                )

    # -- after every event ---------------------------------------------------

    def check(
        self,
        changed: Iterable[SimNode],
        nodes: Iterable[SimNode] | None = None,
    ) -> None:
        """Check the ``changed`` nodes, and durability across all ``nodes``
        (by default the changed ones)."""
        self.checks += 1
        changed = list(changed)
        nodes = changed if nodes is None else nodes
        live = [n for n in changed if n.core is not None]
        for node in live:
            core = node.core
            assert core is not None
            epoch = core.epoch
            prior = self.epochs.get(node.node_id, 0)
            if epoch < prior:
                raise Violation(
                    "MonotonicEpoch",
                    f"node {node.node_id} is at epoch {epoch} after having been at {prior}",
                )
            self.epochs[node.node_id] = epoch
            if core.role is Role.LEADER:
                first = self.leaders.get(epoch)
                if first is None:
                    self.leaders[epoch] = node.node_id
                    self._check_leader_completeness(node, epoch)
                elif first != node.node_id:
                    raise Violation(
                        "SingleLeader",
                        f"nodes {first} and {node.node_id} both led epoch {epoch}",
                    )
            key = (node.node_id, node.incarnation)
            hw = core.high_watermark
            last = self.high_watermarks.get(key, 0)
            if hw < last:
                raise Violation(
                    "MonotonicHighWatermark",
                    f"node {node.node_id}'s high watermark went from {last} to {hw}",
                )
            if hw > last:
                self.high_watermarks[key] = hw
                self._mark_committed(node, hw)
        if self.max_committed:
            self._check_majority_has(nodes, self.max_committed)

    def _mark_committed(self, node: SimNode, hw: int) -> None:
        core = node.core
        assert core is not None
        epoch = core.log.epoch_of_end(hw)
        if epoch is None:
            return  # below this node's log start: covered by its snapshot
        seen = self.committed_marks.setdefault(hw, epoch)
        if seen != epoch:
            raise Violation(
                "ConsistentCommittedData",
                f"offset {hw} was committed in epoch {seen} but node {node.node_id} "
                f"commits it in epoch {epoch}",
            )
        if hw > self.max_committed:
            self.max_committed = hw

    def _check_majority_has(self, nodes: Iterable[SimNode], end_offset: int) -> None:
        """MajorityReachedHighWatermark, on durable state only: what is
        committed must survive any minority of crashes."""
        epoch = self.committed_marks[end_offset]
        holders = [
            n.node_id
            for n in nodes
            if n.node_id in self.voters and _durably_has(n, end_offset, epoch)
        ]
        if len(holders) < len(self.voters) // 2 + 1:
            raise Violation(
                "MajorityReachedHighWatermark",
                f"offset {end_offset} (epoch {epoch}) is committed but only voters "
                f"{sorted(holders)} of {sorted(self.voters)} hold it durably",
            )

    def _check_leader_completeness(self, node: SimNode, epoch: int) -> None:
        """Raft §3.6.3: a new leader's log holds every committed entry."""
        core = node.core
        assert core is not None
        c = self.max_committed
        if c == 0 or c <= core.log.start_offset:
            return
        want = self.committed_marks[c]
        have = core.log.epoch_of_end(c)
        if have != want:
            raise Violation(
                "LeaderCompleteness",
                f"node {node.node_id} leads epoch {epoch} without the committed offset {c} "
                f"(epoch {want}); its log ends at {core.log.end_offset}",
            )


def _durably_has(node: SimNode, end_offset: int, epoch: int) -> bool:
    snapshot = node.stores.snapshots.latest()
    if snapshot is not None and snapshot.end_offset >= end_offset:
        return True
    return node.stores.log.durable_epoch_of_end(end_offset) == epoch
