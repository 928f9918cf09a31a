"""Transactional offset commits under random interleavings: plain commits,
transactional commits of several producers, their COMMIT and ABORT
markers, offset deletions and group deletions, in two groups.  After every
step the shard's committed offsets and pending partitions are a simple
model's, computed from the log alone: a partition's committed offset is
the newest record in the log among plain commits, tombstones and the
records of committed transactions; it has a pending offset if an open
transaction wrote it after its last tombstone.  At the end the log
replayed whole, and (once every transaction has ended) compacted as
Kafka's cleaner leaves it, builds the same groups.  A failure prints its
seed (Hypothesis' falsifying example)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from broker.errors import Errors
from broker.group.api import (
    CommitPartition,
    OffsetCommitRequest,
    OffsetFetchRequest,
    TxnOffsetCommitRequest,
)
from broker.group.records import NO_PRODUCER_ID, OffsetCommitKey, OffsetCommitValue
from broker.group.shard import GroupCoordinatorShard
from broker.group.state import Groups
from tests.broker.group.harness import (
    Entry,
    Marker,
    TxnLog,
    compacted_txn,
    dump,
    new_shard,
    replayed,
)

GROUPS = ("g", "h")
PARTITIONS = (("t", 0), ("t", 1), ("u", 0))

Where = tuple[str, str, int]


def model(entries: list[Entry]) -> tuple[dict[Where, OffsetCommitValue], set[Where]]:
    """(committed offsets, partitions with a pending offset) after the log."""
    seq: dict[int, int] = {}
    ended: dict[tuple[int, int], bool] = {}
    # (group, topic, partition) -> [(offset, value or None, transaction or None)]
    events: dict[Where, list[tuple[int, OffsetCommitValue | None, tuple[int, int] | None]]] = {}
    for entry in entries:
        if isinstance(entry, Marker):
            pid = entry.producer_id
            ended[(pid, seq.get(pid, 0))] = entry.commit
            seq[pid] = seq.get(pid, 0) + 1
            continue
        key = entry.record.key
        assert isinstance(key, OffsetCommitKey)  # the runs write no group keys
        where = (key.group_id, key.topic, key.partition)
        value = entry.record.value
        assert value is None or isinstance(value, OffsetCommitValue)
        pid = entry.producer_id
        txn = None if pid == NO_PRODUCER_ID else (pid, seq.get(pid, 0))
        events.setdefault(where, []).append((entry.offset, value, txn))
    committed: dict[Where, OffsetCommitValue] = {}
    pending: set[Where] = set()
    for where, evs in events.items():
        visible = [e for e in evs if e[2] is None or ended.get(e[2]) is True]
        if visible:
            value = max(visible, key=lambda e: e[0])[1]
            if value is not None:
                committed[where] = value
        last_tombstone = max((e[0] for e in evs if e[1] is None), default=-1)
        if any(e[2] is not None and e[2] not in ended and e[0] > last_tombstone for e in evs):
            pending.add(where)
    return committed, pending


def observed(shard: GroupCoordinatorShard) -> tuple[dict[Where, OffsetCommitValue], set[Where]]:
    committed = {
        (group.group_id, topic, partition): value
        for group in shard.groups
        for (topic, partition), value in group.offsets.items()
    }
    pending = {
        (group_id, topic, partition)
        for group_id in GROUPS
        for parts in shard.groups.pending_offsets(group_id).values()
        for topic, partition in parts
    }
    return committed, pending


def check(shard: GroupCoordinatorShard, log: TxnLog) -> None:
    committed, pending = model(log.entries)
    assert observed(shard) == (committed, pending)
    for group_id in GROUPS:
        fetched = shard.fetch_offsets(OffsetFetchRequest(group_id, PARTITIONS, require_stable=True))
        for answer in fetched.offsets:
            where = (group_id, answer.topic, answer.partition)
            if where in pending:
                assert (answer.error, answer.offset) == (Errors.UNSTABLE_OFFSET_COMMIT, -1)
            else:
                value = committed.get(where)
                assert answer.error is Errors.NONE
                assert answer.offset == (-1 if value is None else value.offset)


def run(seed: int) -> None:
    rng = random.Random(seed)
    shard, log = new_shard(seed), TxnLog()
    # producer id -> its epoch (every marker bumps it: KIP-890's transaction version 2)
    producers = {1000 + i: 0 for i in range(rng.randint(1, 3))}
    next_offset = 0

    def parts() -> tuple[CommitPartition, ...]:
        nonlocal next_offset
        chosen = rng.sample(PARTITIONS, rng.randint(1, len(PARTITIONS)))
        next_offset += 1
        return tuple(CommitPartition(t, p, next_offset * 10 + i) for i, (t, p) in enumerate(chosen))

    for step in range(rng.randint(5, 60)):
        event, group_id, now = rng.random(), rng.choice(GROUPS), step
        if event < 0.3:
            result = shard.commit_offsets(OffsetCommitRequest(group_id, "", -1, parts()), now)
            log.write(shard, result)
        elif event < 0.65:
            pid = rng.choice(sorted(producers))
            request = TxnOffsetCommitRequest(
                f"tx-{pid}", group_id, pid, producers[pid], "", -1, parts()
            )
            result = shard.txn_commit_offsets(request, now)
            assert result.response.error is Errors.NONE
            log.write(shard, result, pid, producers[pid])
        elif event < 0.9:
            pid = rng.choice(sorted(producers))
            producers[pid] += 1
            log.marker(shard, pid, producers[pid], rng.random() < 0.6)
        elif event < 0.96:
            chosen = rng.sample(PARTITIONS, rng.randint(1, len(PARTITIONS)))
            log.write(shard, shard.delete_offsets(group_id, chosen))
        else:
            log.write(shard, shard.delete_groups([group_id]))
        check(shard, log)
    assert dump(replayed(log.entries)) == dump(shard.groups)
    for pid in sorted(producers):
        producers[pid] += 1
        log.marker(shard, pid, producers[pid], rng.random() < 0.5)
    check(shard, log)
    assert shard.groups.producers() == []
    assert dump(replayed(log.entries)) == dump(shard.groups)
    assert dump(replayed(compacted_txn(log.entries))) == dump(shard.groups)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_random_transactions(seed: int) -> None:
    note(f"seed {seed}")
    run(seed)


# -- the property fires ----------------------------------------------------------------


@contextmanager
def patched(name: str, broken: Callable[..., None]) -> Iterator[None]:
    original = getattr(Groups, name)
    setattr(Groups, name, broken)
    try:
        yield
    finally:
        setattr(Groups, name, original)


def _first_failing_seed() -> int | None:
    for seed in range(300):
        try:
            run(seed)
        except AssertionError:
            return seed
    return None


@pytest.mark.parametrize("bug", ["commit ignores the log order", "abort keeps the offsets"])
def test_the_property_fires(bug: str) -> None:
    original = Groups.replay_end_transaction_marker
    if bug == "commit ignores the log order":

        def broken(self: Groups, producer_id: int, producer_epoch: int, commit: bool) -> None:
            for group_id in GROUPS:
                group = self.get(group_id)
                pending = self.pending_offsets(group_id).get(producer_id, {})
                if commit and group is not None:
                    for where, offset in pending.items():
                        group.set_offset(where, offset.value, offset.record_offset)
            original(self, producer_id, producer_epoch, False)

    else:

        def broken(self: Groups, producer_id: int, producer_epoch: int, commit: bool) -> None:
            original(self, producer_id, producer_epoch, True)

    with patched("replay_end_transaction_marker", broken):
        seed = _first_failing_seed()
    print(f"{bug}: caught at seed {seed}")
    assert seed is not None
