"""Replica placement: which brokers hold the replicas of new partitions.

The algorithm is Kafka's rack-aware assignment
(``AdminUtils.assignReplicasToBrokers``, KIP-36), which the controller of
KIP-631 replaced by ``StripedReplicaPlacer`` with the same aims:

- Brokers are arranged in a rack-alternated list: racks sorted by name,
  brokers sorted by id within a rack, then one broker of each rack in turn
  (``a1, b1, c1, a2, b2, c2, ...``).  Without racks the list is the brokers
  by id.
- Partition ``p``'s first replica, its preferred leader, is the broker at
  ``(p + start) % n`` in that list: consecutive partitions take leaders in
  turn, so leadership is spread evenly over the brokers whatever their
  racks.
- The other replicas follow the leader at a shift that moves by one every
  ``n`` partitions; a broker is skipped while its rack already holds a
  replica of the partition and racks without one remain, so the replicas of
  a partition span ``min(replication factor, racks)`` racks.  With racks of
  equal size (or none), each round of ``n`` partitions (``p // n`` equal)
  makes every broker a follower ``replication factor - 1`` times, and a
  partial round at most that often.  Unequal racks load the brokers of
  smaller racks more, as in Kafka.
- ``start`` and the initial shift come from the caller's random source, so
  that topics do not all put their first leader on the same broker, and a
  seed replays a placement exactly.

Unlike Kafka's placer, fenced brokers are never used: a partition placed on
a fenced broker starts under-replicated, and may start with no leader.
Everything here is pure: no I/O, no clock, randomness only from the
caller's ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from metadata.errors import ApiError, Errors

__all__ = ["UsableBroker", "place", "rack_alternated", "validate_assignment"]


@dataclass(frozen=True, slots=True)
class UsableBroker:
    """A registered broker as the placer sees it."""

    id: int
    rack: str | None
    fenced: bool


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids)


def rack_alternated(brokers: Sequence[UsableBroker]) -> list[int]:
    """Broker ids interleaved by rack (Kafka's
    ``AdminUtils.getRackAlternatedBrokerList``): racks sorted by name,
    brokers by id within a rack, then the next broker of each rack in turn
    until every rack is used up.  Brokers without a rack form one rack."""
    by_rack: dict[str, list[int]] = {}
    for broker in brokers:
        by_rack.setdefault(broker.rack or "", []).append(broker.id)
    columns = [sorted(by_rack[rack]) for rack in sorted(by_rack)]
    depth = max((len(column) for column in columns), default=0)
    return [column[i] for i in range(depth) for column in columns if i < len(column)]


def place(
    start_partition: int,
    num_partitions: int,
    replication_factor: int,
    brokers: Sequence[UsableBroker],
    rng: random.Random,
) -> list[tuple[int, ...]]:
    """Replica lists for partitions ``start_partition`` up to
    ``start_partition + num_partitions - 1`` of a topic, the first replica
    of each the preferred leader.  Only unfenced brokers are used, and the
    result depends only on the arguments and the state of ``rng`` (not on
    the order of ``brokers``).

    Refusals: INVALID_REPLICATION_FACTOR for a replication factor below 1
    or above the number of unfenced brokers; INVALID_PARTITIONS for fewer
    than one partition; INVALID_REPLICA_ASSIGNMENT if some unfenced brokers
    have a rack and others do not (Kafka's "Not all brokers have rack
    information"), since rack-aware placement cannot place those.  A
    negative ``start_partition`` or a broker id listed twice is a bug of the
    caller: ValueError."""
    if replication_factor < 1:
        raise ApiError(
            Errors.INVALID_REPLICATION_FACTOR,
            f"replication factor must be at least 1, not {replication_factor}",
        )
    if num_partitions < 1:
        raise ApiError(
            Errors.INVALID_PARTITIONS,
            f"number of partitions must be at least 1, not {num_partitions}",
        )
    if start_partition < 0:
        raise ValueError(f"start_partition must not be negative, not {start_partition}")
    seen: set[int] = set()
    for broker in brokers:
        if broker.id in seen:
            raise ValueError(f"broker {broker.id} is listed twice")
        seen.add(broker.id)
    usable = [b for b in brokers if not b.fenced]
    if replication_factor > len(usable):
        raise ApiError(
            Errors.INVALID_REPLICATION_FACTOR,
            f"replication factor {replication_factor} is larger than the number of available"
            f" brokers ({len(usable)})",
        )
    without_rack = sorted(b.id for b in usable if b.rack is None)
    if without_rack and len(without_rack) < len(usable):
        if len(without_rack) == 1:
            who = f"broker {without_rack[0]} has"
        else:
            who = f"brokers {_ids(without_rack)} have"
        raise ApiError(
            Errors.INVALID_REPLICA_ASSIGNMENT,
            f"not all brokers have rack information: {who} no rack while the others have one",
        )

    arranged = rack_alternated(usable)
    rack_of = {b.id: b.rack for b in usable}
    n = len(arranged)
    num_racks = len(set(rack_of.values()))
    # Kafka draws both from one random source: the first leader's index and
    # the first shift of the followers.
    start_index = rng.randrange(n)
    shift = rng.randrange(n)
    result: list[tuple[int, ...]] = []
    for partition in range(start_partition, start_partition + num_partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start_index) % n
        replicas = [arranged[first]]
        racks = {rack_of[arranged[first]]}
        k = 0
        while len(replicas) < replication_factor:
            # The k-th candidate after the leader: every other broker once
            # per n - 1 candidates, so the search ends within that many
            # steps per replica.
            candidate = arranged[(first + 1 + (shift + k) % (n - 1)) % n]
            k += 1
            rack = rack_of[candidate]
            if candidate in replicas:
                continue
            if rack in racks and len(racks) < num_racks:
                continue
            replicas.append(candidate)
            racks.add(rack)
        result.append(tuple(replicas))
    return result


def validate_assignment(
    assignment: Sequence[Sequence[int]],
    brokers: Mapping[int, UsableBroker],
    *,
    start_partition: int = 0,
    replication_factor: int | None = None,
) -> None:
    """Checks a replica assignment given by hand (CreateTopics with explicit
    replicas, CreatePartitions, a reassignment): at least one partition,
    each with at least one replica, no broker twice in a partition, every
    broker registered (in ``brokers``; fenced ones are allowed: whether a
    partition can start with a leader is the caller's question), and every
    partition with as many replicas as the first or, if given, as
    ``replication_factor`` (new partitions of an existing topic).
    Partition numbers in messages count from ``start_partition``.  Refuses
    with INVALID_REPLICA_ASSIGNMENT."""
    if not assignment:
        raise ApiError(Errors.INVALID_REPLICA_ASSIGNMENT, "the replica assignment has no partition")
    expected = replication_factor
    for index, replicas in enumerate(assignment):
        partition = start_partition + index
        shown = "[" + _ids(replicas) + "]"
        if not replicas:
            raise ApiError(
                Errors.INVALID_REPLICA_ASSIGNMENT, f"partition {partition} has no replicas"
            )
        repeated = sorted({b for b in replicas if list(replicas).count(b) > 1})
        if repeated:
            raise ApiError(
                Errors.INVALID_REPLICA_ASSIGNMENT,
                f"partition {partition}'s replicas {shown} list broker"
                f"{'s' if len(repeated) > 1 else ''} {_ids(repeated)} more than once",
            )
        unknown = [b for b in replicas if b not in brokers]
        if unknown:
            raise ApiError(
                Errors.INVALID_REPLICA_ASSIGNMENT,
                f"partition {partition}'s replicas {shown} name"
                + (
                    f" broker {unknown[0]}, which is not registered"
                    if len(unknown) == 1
                    else f" brokers {_ids(unknown)}, which are not registered"
                ),
            )
        if expected is None:
            expected = len(replicas)
        elif len(replicas) != expected:
            if replication_factor is not None:
                reason = f"the topic's replication factor is {replication_factor}"
            else:
                reason = f"partition {start_partition} has {expected}"
            raise ApiError(
                Errors.INVALID_REPLICA_ASSIGNMENT,
                f"partition {partition} has {len(replicas)} replicas {shown} but {reason}: every"
                " partition of a topic needs the same number of replicas",
            )
