"""A group coordinator shard driven as its driver drives it (replay a
decision's records at once), with clients that follow KIP-848's member
protocol: hold what the last answer gave, give up what it took away."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.errors import Errors
from broker.group.api import HeartbeatRequest, HeartbeatResponse, Result, TopicMetadata
from broker.group.assignors import ASSIGNORS
from broker.group.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, CoordinatorRecord
from broker.group.shard import GroupConfig, GroupCoordinatorShard
from broker.group.state import Groups
from broker.group.types import Partitions


class MapTopics:
    """A :class:`broker.group.api.TopicsView` over a dict."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.by_name = {
            name: TopicMetadata(f"id-{name}", name, count) for name, count in counts.items()
        }

    def set(self, name: str, count: int) -> None:
        self.by_name[name] = TopicMetadata(f"id-{name}", name, count)

    def topic(self, name: str) -> TopicMetadata | None:
        return self.by_name.get(name)

    def names(self) -> Iterable[str]:
        return list(self.by_name)


def new_shard(seed: int = 0, **config: int) -> GroupCoordinatorShard:
    return GroupCoordinatorShard(GroupConfig(**config), ASSIGNORS, random.Random(seed))  # type: ignore[arg-type]


@dataclass
class Log:
    """The offsets partition as the shard wrote it."""

    records: list[CoordinatorRecord] = field(default_factory=list)

    def apply(self, shard: GroupCoordinatorShard, result: Result[Any]) -> None:
        for record in result.records:
            self.records.append(record)
            shard.replay(record)


def rebuilt(records: Iterable[CoordinatorRecord]) -> Groups:
    groups = Groups()
    for record in records:
        groups.replay(record)
    return groups


def compacted(records: list[CoordinatorRecord]) -> list[CoordinatorRecord]:
    """The last record of each key, in log order (tombstones kept)."""
    last = {record.key: i for i, record in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r.key] == i]


def dump(groups: Groups) -> dict[str, object]:
    """Everything a group is, comparable."""
    out: dict[str, object] = {}
    for group in groups:
        gid = group.group_id
        out[gid] = (
            group.epoch,
            group.assignment_epoch,
            group.subscription,
            sorted((m.member_id, m.metadata, m.target, m.current) for m in group.members.values()),
            sorted(group.offsets.items()),
            sorted(group.record_offsets.items()),
            sorted(group.owners.items()),
            {pid: sorted(parts.items()) for pid, parts in groups.pending_offsets(gid).items()},
        )
    return out


@dataclass
class Client:
    """A member's client: joins, holds what it is given, revokes what is
    taken away (at once, or when told to)."""

    group_id: str
    topics: tuple[str, ...]
    member_id: str = ""
    epoch: int = 0
    held: Partitions = frozenset()
    # Partitions the coordinator took away that this client still holds
    # (it revokes them on its next heartbeat if revoke_at_once is False).
    to_revoke: Partitions = frozenset()
    revoke_at_once: bool = True
    fenced: bool = False
    rebalance_timeout_ms: int = 60_000
    # A static member's (group.instance.id).
    instance_id: str | None = None

    def request(self) -> HeartbeatRequest:
        if self.epoch == 0:
            return HeartbeatRequest(
                group_id=self.group_id,
                member_id=self.member_id,
                member_epoch=0,
                instance_id=self.instance_id,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
                subscribed_topic_names=self.topics,
                owned=frozenset(),
            )
        return HeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.epoch,
            instance_id=self.instance_id,
            owned=self.held,
        )

    def step_response(self, response: HeartbeatResponse) -> None:
        if response.error in (Errors.FENCED_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID):
            # Give everything up and rejoin (KIP-848).
            self.held, self.epoch, self.to_revoke = frozenset(), 0, frozenset()
            self.fenced = True
            return
        assert response.error is Errors.NONE, response
        assert response.assignment is not None
        self.member_id = response.member_id
        self.epoch = response.member_epoch
        taken = self.held - response.assignment
        if self.revoke_at_once:
            self.held = response.assignment
        else:
            # Hold on to what was taken until the next heartbeat.
            self.to_revoke = taken
            self.held = response.assignment | taken

    def revoke(self) -> None:
        self.held = self.held - self.to_revoke
        self.to_revoke = frozenset()


def heartbeat(
    shard: GroupCoordinatorShard, log: Log, client: Client, topics: MapTopics, now_ms: int
) -> HeartbeatResponse:
    if not client.revoke_at_once:
        client.revoke()
    result = shard.consumer_group_heartbeat(client.request(), topics, now_ms)
    log.apply(shard, result)
    client.step_response(result.response)
    return result.response


def owners_disjoint(groups: Groups) -> None:
    """No partition is owned (assigned or pending revocation) by two members."""
    for group in groups:
        seen: dict[tuple[str, int], str] = {}
        for member in group.members.values():
            for partition in member.owned():
                assert partition not in seen, (
                    f"{partition} owned by {seen[partition]} and {member.member_id}"
                )
                seen[partition] = member.member_id
        assert seen == group.owners


@dataclass(frozen=True)
class Written:
    """A record of the offsets partition with its batch's producer (-1 if
    the batch is not transactional) and its offset."""

    record: CoordinatorRecord
    producer_id: int
    producer_epoch: int
    offset: int


@dataclass(frozen=True)
class Marker:
    """A transaction marker (a control batch) in the offsets partition."""

    producer_id: int
    producer_epoch: int
    commit: bool
    offset: int


Entry = Written | Marker


@dataclass
class TxnLog:
    """The offsets partition with offsets and transaction markers, replayed
    into the shard as the runtime does: each record with its offset and,
    in a transactional batch, its producer; each marker once appended."""

    entries: list[Entry] = field(default_factory=list)

    def _next(self) -> int:
        return len(self.entries)

    def write(
        self,
        shard: GroupCoordinatorShard,
        result: Result[Any],
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> None:
        for record in result.records:
            written = Written(record, producer_id, producer_epoch, self._next())
            self.entries.append(written)
            shard.replay(record, producer_id, producer_epoch, written.offset)

    def marker(
        self, shard: GroupCoordinatorShard, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        self.entries.append(Marker(producer_id, producer_epoch, commit, self._next()))
        shard.replay_end_transaction_marker(producer_id, producer_epoch, commit)


def replayed(entries: Iterable[Entry]) -> Groups:
    """The groups a load of these entries builds (records and markers in
    log order)."""
    groups = Groups()
    for entry in entries:
        if isinstance(entry, Marker):
            groups.replay_end_transaction_marker(
                entry.producer_id, entry.producer_epoch, entry.commit
            )
        else:
            groups.replay(entry.record, entry.producer_id, entry.producer_epoch, entry.offset)
    return groups


def compacted_txn(entries: list[Entry]) -> list[Entry]:
    """The log as Kafka's cleaner leaves it once every transaction has
    ended: records of aborted transactions dropped, then the last record of
    each key among the rest (tombstones kept), and every marker."""
    ended: dict[tuple[int, int], bool] = {}
    txn_of: dict[int, tuple[int, int]] = {}
    seq: dict[int, int] = {}
    for i, entry in enumerate(entries):
        if isinstance(entry, Marker):
            ended[(entry.producer_id, seq.get(entry.producer_id, 0))] = entry.commit
            seq[entry.producer_id] = seq.get(entry.producer_id, 0) + 1
        elif entry.producer_id != NO_PRODUCER_ID:
            txn_of[i] = (entry.producer_id, seq.get(entry.producer_id, 0))
    assert all(txn in ended for txn in txn_of.values()), "a transaction is still open"
    kept = [(i, e) for i, e in enumerate(entries) if i not in txn_of or ended[txn_of[i]] is True]
    last = {e.record.key: i for i, e in kept if isinstance(e, Written)}
    return [e for i, e in kept if isinstance(e, Marker) or last[e.record.key] == i]
