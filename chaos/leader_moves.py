"""Leadership moves with every node up: a queue partition reassigned, or its
preferred leader elected, through the controllers' admin RPCs.

The nemesis kinds ``reassign`` and ``elect-leader`` (:mod:`chaos.nemesis`)
move a partition's leadership without a crash, a pause or a cut link: the
old leader stays up and learns from the metadata that it follows.  That is
when a leader's purgatory completes the produces it holds with
``NOT_LEADER_OR_FOLLOWER`` while a follower that fetched their records keeps
them as the new leader (KAFKA-13574), and when followers truncate on
becoming followers at a leader epoch that no crash announced (KIP-101,
KIP-279).

- ``reassign`` (KIP-455, ``kafka-reassign-partitions.sh``): with a broker
  that holds no replica of the partition, the leader's replica moves to it
  (the target keeps the followers in their order and puts the new broker
  last, so when the new replica has caught up the controller removes the
  old leader and elects the first follower of the target); with none, the
  replicas are reordered so that another ISR member is preferred (no leader
  change, only a new preferred replica).  Ended by a ``reassign`` back to
  the replicas it found (``kind: revert``).
- ``elect-leader`` (``kafka-leader-election.sh --type preferred``): an ISR
  member other than the leader is put first by a reassignment to the same
  replicas in a new order (which completes at once: nothing to copy), then
  a preferred election makes it the leader.  Instant: nothing stays in
  force.

:func:`plan_reassign`, :func:`plan_revert` and :func:`plan_election` are
pure; :class:`LeaderMoves` describes the partitions and carries a move out
with the harness's admin certificate, on any backend.  Each move is one
nemesis op (``docs/history-format.md``): its invoke names the partition,
the replicas asked for and those found; its completion adds ``now``, the
partition as the controllers' metadata has it after the move.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc

from kqproto import metadata_pb2
from metadata.client import MetadataClient, Reassignment, TopicPartition, error_code
from metadata.errors import Errors

__all__ = [
    "ELECT",
    "REASSIGN",
    "REVERT",
    "LeaderMoves",
    "Move",
    "PartitionView",
    "plan_election",
    "plan_reassign",
    "plan_revert",
]

REASSIGN: Final = "reassign"
ELECT: Final = "elect-leader"
REVERT: Final = "revert"
"""The ``kind`` of the ``reassign`` that ends a reassignment."""

# How long a reassignment is given to finish before its op completes (it
# goes on in the background after that: the completion's ``now`` says how
# far it got).
_SETTLE_S: Final = 3.0


@dataclass(frozen=True, slots=True)
class PartitionView:
    """A partition as the controllers describe it."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    def to_json(self) -> dict[str, Any]:
        return {
            "leader": self.leader,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "adding": list(self.adding),
            "removing": list(self.removing),
        }


@dataclass(frozen=True, slots=True)
class Move:
    """One move: the history's ``f`` (``reassign`` or ``elect-leader``),
    ``kind`` (``revert`` for a reassignment back, else the ``f``), the
    partition, the ``replicas`` asked for, the ``previous`` ones and the
    leader found."""

    f: str
    kind: str
    topic: str
    partition: int
    replicas: tuple[int, ...]
    previous: tuple[int, ...]
    leader: int

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def value(self) -> dict[str, Any]:
        """The nemesis op's value."""
        out: dict[str, Any] = {
            "partition": self.name,
            "replicas": list(self.replicas),
            "previous": list(self.previous),
            "leader": self.leader,
        }
        if self.f == ELECT:
            out["preferred"] = self.replicas[0]
        if self.kind != self.f:
            out["kind"] = self.kind
        return out


def _candidates(partitions: Sequence[PartitionView], avoid: Collection[str]) -> list[PartitionView]:
    return sorted(
        (p for p in partitions if p.leader >= 0 and not p.reassigning and p.name not in avoid),
        key=lambda p: (p.topic, p.partition),
    )


def plan_reassign(
    partitions: Sequence[PartitionView],
    brokers: Collection[int],
    down: Collection[int],
    rng: random.Random,
    *,
    avoid: Collection[str] = (),
) -> Move | None:
    """A reassignment of one partition drawn with ``rng`` (none being
    reassigned, none in ``avoid``): its leader's replica moved to an up
    broker of ``brokers`` that holds none (put last, so that the first
    follower leads once the move is done), else its replicas reordered so
    that an up ISR member other than the leader comes first.  ``None`` if
    no partition allows either."""
    options = _candidates(partitions, avoid)
    rng.shuffle(options)
    for p in options:
        spare = sorted(b for b in brokers if b not in p.replicas and b not in down)
        if spare:
            target = (*(r for r in p.replicas if r != p.leader), rng.choice(spare))
            return Move(REASSIGN, REASSIGN, p.topic, p.partition, target, p.replicas, p.leader)
        reordered = _preferring_another(p, down, rng)
        if reordered is not None:
            return Move(REASSIGN, REASSIGN, p.topic, p.partition, reordered, p.replicas, p.leader)
    return None


def plan_revert(move: Move, now: PartitionView | None) -> Move:
    """The reassignment that takes ``move``'s partition back to the
    replicas ``move`` found (``now``: the partition as it is, for the
    record; ``move``'s target if unknown)."""
    return Move(
        REASSIGN,
        REVERT,
        move.topic,
        move.partition,
        move.previous,
        now.replicas if now is not None else move.replicas,
        now.leader if now is not None else -1,
    )


def plan_election(
    partitions: Sequence[PartitionView],
    down: Collection[int],
    rng: random.Random,
    *,
    avoid: Collection[str] = (),
) -> Move | None:
    """A preferred election of one partition drawn with ``rng``: an up ISR
    member other than its leader put first.  ``None`` if no partition has
    one (every follower out of the ISR or down)."""
    options = _candidates(partitions, avoid)
    rng.shuffle(options)
    for p in options:
        reordered = _preferring_another(p, down, rng)
        if reordered is not None:
            return Move(ELECT, ELECT, p.topic, p.partition, reordered, p.replicas, p.leader)
    return None


def _preferring_another(
    p: PartitionView, down: Collection[int], rng: random.Random
) -> tuple[int, ...] | None:
    """``p``'s replicas with an up ISR member other than the leader first,
    the others in their order (None if there is no such member)."""
    others = [r for r in p.isr if r != p.leader and r in p.replicas and r not in down]
    if not others:
        return None
    first = rng.choice(sorted(others))
    return (first, *(r for r in p.replicas if r != first))


def views(answer: metadata_pb2.DescribeTopicsResponse) -> list[PartitionView]:
    """The partitions of a DescribeTopics answer (topics in error left out)."""
    return [
        PartitionView(
            t.name,
            p.partition,
            p.leader,
            tuple(p.replicas),
            tuple(p.isr),
            tuple(p.adding_replicas),
            tuple(p.removing_replicas),
        )
        for t in answer.topics
        if error_code(t.error) is Errors.NONE
        for p in t.partitions
    ]


class LeaderMoves:
    """Plans and carries out moves of the partitions of ``topics`` through
    the controllers at ``addresses()`` (the admin certificate of
    ``credentials``); ``brokers`` are the cluster's broker ids.  Remembers
    the reassignment in force, which :meth:`plan` reverts when asked."""

    def __init__(
        self,
        addresses: Callable[[], Sequence[str]],
        credentials: grpc.ChannelCredentials | None,
        topics: Sequence[str],
        brokers: Sequence[int],
        rng: random.Random,
        *,
        timeout_s: float = 5.0,
    ) -> None:
        self.addresses = addresses
        self.credentials = credentials
        self.topics = list(topics)
        self.brokers = list(brokers)
        self.rng = rng
        self.timeout_s = timeout_s
        # The reassignment started and not reverted yet.
        self.in_force: Move | None = None

    def _client(self) -> MetadataClient:
        return MetadataClient(
            list(self.addresses()), timeout_s=self.timeout_s, credentials=self.credentials
        )

    async def describe(self) -> list[PartitionView]:
        """The queue's partitions as the active controller has them (empty
        if none answered)."""
        client = self._client()
        try:
            return views(await client.describe_topics(self.topics))
        except Exception:
            return []
        finally:
            await client.close()

    async def plan(self, kind: str, down: Collection[int]) -> Move | None:
        """The move of ``kind`` (``reassign``, ``revert`` or ``elect-leader``)
        with the nodes ``down`` avoided; ``None`` if none is possible now
        (no partition fits, a revert with no reassignment in force, or a
        second reassignment while one is)."""
        if kind == REVERT:
            if self.in_force is None:
                return None
            now = next((p for p in await self.describe() if p.name == self.in_force.name), None)
            return plan_revert(self.in_force, now)
        if kind == REASSIGN and self.in_force is not None:
            return None
        partitions = await self.describe()
        avoid = (self.in_force.name,) if self.in_force is not None else ()
        if kind == REASSIGN:
            return plan_reassign(partitions, self.brokers, down, self.rng, avoid=avoid)
        if kind == ELECT:
            return plan_election(partitions, down, self.rng, avoid=avoid)
        raise ValueError(f"unknown leadership move {kind!r}")

    async def apply(self, move: Move) -> tuple[str | None, PartitionView | None]:
        """Carry ``move`` out: the error name of a refusal (None if done)
        and the partition as the controllers have it afterwards.  A
        reassignment (not a reorder) is given a few seconds to finish
        before this returns."""
        client = self._client()
        try:
            answer = await client.alter_partition_reassignments(
                [Reassignment(move.topic, move.partition, move.replicas)]
            )
            error = _first_error(answer.results)
            if error is None and move.f == ELECT:
                elected = await client.elect_leaders(
                    metadata_pb2.PREFERRED, [TopicPartition(move.topic, move.partition)]
                )
                error = _first_error(elected.results)
            if move.f == REASSIGN and error is None:
                # A refused revert leaves the reassignment in force (ended
                # again at the end of the run); a done one ends it.
                self.in_force = None if move.kind == REVERT else move
            now = await self._settled(client, move) if error is None else None
            return error, now
        finally:
            await client.close()

    async def _settled(self, client: MetadataClient, move: Move) -> PartitionView | None:
        deadline = time.monotonic() + (_SETTLE_S if move.f == REASSIGN else 0.0)
        while True:
            answer = await client.describe_topics([move.topic])
            now = next((p for p in views(answer) if p.partition == move.partition), None)
            if now is None or not now.reassigning or time.monotonic() >= deadline:
                return now
            await asyncio.sleep(0.2)


def _first_error(results: Sequence[Any]) -> str | None:
    """The first refusal's error name among per-partition results."""
    for r in results:
        code = error_code(r.error)
        if code is not Errors.NONE and code is not Errors.ELECTION_NOT_NEEDED:
            return code.name
    return None
