"""Properties of the group coordinator under random members: joins,
heartbeats, slow revocations, lost answers, leaves, static members that
leave for now and come back under a new member id, ended sessions and new
partitions.  After every step no partition has two owners, and each
client holds only what the coordinator counts as its member's; once the
members heartbeat undisturbed the group is stable, every subscribed
partition has exactly one owner and the assignment is balanced.  The log
written, replayed whole or compacted, builds the same groups."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.group.api import HeartbeatRequest
from broker.group.shard import GroupCoordinatorShard
from broker.group.state import GroupState
from tests.broker.group.harness import (
    Client,
    Log,
    MapTopics,
    compacted,
    dump,
    heartbeat,
    new_shard,
    owners_disjoint,
    rebuilt,
)

SESSION_MS = 1_000


def clients_within_owners(shard: GroupCoordinatorShard, clients: list[Client]) -> None:
    group = shard.groups.get("g")
    for client in clients:
        member = None if group is None or not client.member_id else group.member(client.member_id)
        if member is not None and client.epoch != 0:
            assert client.held <= member.owned(), (client.member_id, client.held, member.owned())


def run(seed: int) -> None:
    rng = random.Random(seed)
    shard, log = new_shard(seed, session_timeout_ms=SESSION_MS), Log()
    topics = MapTopics({"t": rng.randint(1, 8), "u": rng.randint(0, 4)})
    clients: list[Client] = []
    # Instance ids of static members that left for now (epoch -2).
    away: list[str] = []
    instances = 0
    now = 0
    for _ in range(rng.randint(10, 80)):
        event = rng.random()
        if event < 0.15 and len(clients) < 6:
            instance = None
            if away and rng.random() < 0.5:
                instance = away.pop(rng.randrange(len(away)))
            elif rng.random() < 0.3:
                instances += 1
                instance = f"i-{instances}"
            clients.append(
                Client("g", ("t", "u"), revoke_at_once=rng.random() < 0.6, instance_id=instance)
            )
        elif event < 0.75 and clients:
            client = rng.choice(clients)
            if rng.random() < 0.1 and client.epoch:
                # The answer is lost: the coordinator decided, the client
                # never heard.
                result = shard.consumer_group_heartbeat(client.request(), topics, now)
                log.apply(shard, result)
            else:
                heartbeat(shard, log, client, topics, now)
        elif event < 0.82 and clients:
            client = clients.pop(rng.randrange(len(clients)))
            if client.epoch:
                static = client.instance_id is not None
                result = shard.consumer_group_heartbeat(
                    HeartbeatRequest(
                        "g", client.member_id, -2 if static else -1, instance_id=client.instance_id
                    ),
                    topics,
                    now,
                )
                log.apply(shard, result)
            if client.instance_id is not None:
                # Its instance comes back later (one that never joined, or
                # whose join is still to come, included).
                away.append(client.instance_id)
        elif event < 0.95:
            now += rng.choice([10, 100, SESSION_MS // 2, SESSION_MS])
            log.apply(shard, shard.tick(now))
        else:
            name = rng.choice(["t", "u"])
            count = topics.by_name[name].partitions
            topics.set(name, count + rng.randint(1, 3))
        owners_disjoint(shard.groups)
        clients_within_owners(shard, clients)
    # Every static member away comes back (or its session ended: it joins
    # as a new member); then, undisturbed, every client heartbeats,
    # revoking at once.
    clients.extend(Client("g", ("t", "u"), instance_id=instance) for instance in away)
    for client in clients:
        client.revoke()
        client.revoke_at_once = True
    for _ in range(6):
        for client in clients:
            heartbeat(shard, log, client, topics, now)
            owners_disjoint(shard.groups)
            clients_within_owners(shard, clients)
        now += 10
    group = shard.groups.get("g")
    if clients:
        assert group is not None
        assert group.state() is GroupState.STABLE, group.state()
        held = [c.held for c in clients]
        every = frozenset(
            (topics.by_name[name].topic_id, p)
            for name in ("t", "u")
            for p in range(topics.by_name[name].partitions)
        )
        assert frozenset().union(*held) == every
        assert sum(len(h) for h in held) == len(every)  # one owner each
        counts = [len(h) for h in held]
        assert max(counts) - min(counts) <= 1, counts
    assert dump(rebuilt(log.records)) == dump(shard.groups)
    assert dump(rebuilt(compacted(log.records))) == dump(shard.groups)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_random_members(seed: int) -> None:
    run(seed)
