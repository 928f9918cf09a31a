"""Properties of the transaction coordinator under random producers of a
few transactional ids: inits (new instances and KIP-360 recoveries), adds,
ends, the runtime's completions (some stale), timeouts, expiry, lost
answers and zombies that keep sending with an old epoch.  After every
step: each record's transition is one Kafka allows; an id's epoch never
decreases under one producer id, and a new producer id is never one given
before; every end bumps the epoch by one, and a new instance's
InitProducerId answers an epoch no producer had; a fenced epoch's
AddPartitions and EndTxn are refused and write nothing; the log written,
replayed whole or compacted, rebuilds the same state."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import Errors
from broker.txn.api import PendingMarkers, Result
from broker.txn.coordinator import TransactionCoordinatorShard
from broker.txn.types import TopicPartition, TransactionState
from tests.broker.txn.harness import Log, compacted, new_shard, rebuilt

S = TransactionState
IDS = ("a", "b", "c")
PARTITIONS = [TopicPartition(t, p) for t in ("t", "u") for p in range(3)]


@dataclass
class Checked:
    """The shard, its log, and what the test knows of every id."""

    shard: TransactionCoordinatorShard
    log: Log = field(default_factory=Log)
    # tid -> every (producer id, epoch) the coordinator answered with.
    handed: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    # tid -> the pairs a later InitProducerId, fence or expiry fenced.
    fenced: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    # Every producer id any id has used.
    producer_ids: set[int] = field(default_factory=set)
    pending: list[PendingMarkers] = field(default_factory=list)

    def apply(self, result: Result[Any], *, fences: bool = False) -> None:
        """Replays ``result``'s records, checking each transition.
        ``fences``: the decision was an InitProducerId or a timeout, whose
        records fence every earlier (producer id, epoch) of their id."""
        for record in result.records:
            tid = record.key.transactional_id
            old = self.shard.transactions.get(tid)
            new = record.value
            handed = self.handed.setdefault(tid, set())
            if new is None:
                assert old is not None and S.DEAD.can_follow(old.state), (tid, old)
                self.fenced.setdefault(tid, set()).update(handed)
            else:
                previous = S.EMPTY if old is None else old.state
                assert new.state.can_follow(previous), (tid, previous, new.state)
                if old is not None and old.producer_id == new.producer_id:
                    assert new.producer_epoch >= old.producer_epoch, (tid, old, new)
                elif old is None or old.producer_id != new.producer_id:
                    assert new.producer_id not in self.producer_ids, (tid, new)
                    self.producer_ids.add(new.producer_id)
                if new.state.is_prepare and old is not None and not old.state.is_prepare:
                    # KIP-890 part 2: every end bumps the epoch by one.
                    assert (new.producer_id, new.producer_epoch) == (
                        old.producer_id,
                        old.producer_epoch + 1,
                    ), (tid, old, new)
                if fences:
                    current = (new.producer_id, new.producer_epoch)
                    self.fenced.setdefault(tid, set()).update(handed - {current})
            self.log.records.append(record)
            self.shard.replay(record)
        self.check_log()

    def hand(self, tid: str, producer_id: int, epoch: int) -> None:
        self.handed.setdefault(tid, set()).add((producer_id, epoch))

    def check_log(self) -> None:
        state = list(self.shard.transactions)
        assert list(rebuilt(self.log.records)) == state
        assert list(rebuilt(compacted(self.log.records))) == state


@dataclass
class Producer:
    tid: str
    pid: int = -1
    epoch: int = -1


def run(seed: int) -> None:
    rng = random.Random(seed)
    timeout = rng.choice([50, 200, 1_000])
    shard, _, _ = new_shard(transactional_id_expiration_ms=rng.choice([500, 5_000, 10**9]))
    checked = Checked(shard)
    producers: list[Producer] = []
    now = 0
    for _ in range(rng.randint(10, 120)):
        now += rng.choice([0, 1, 10, 100])
        event = rng.random()
        lost = rng.random() < 0.1
        if event < 0.15 or not producers:
            # A new instance, or an old one that recovers (KIP-360).
            if producers and rng.random() < 0.4:
                producer = rng.choice(producers)
            else:
                producer = Producer(rng.choice(IDS))
                producers.append(producer)
            result: Result[Any] = shard.init_producer_id(
                producer.tid, timeout, producer.pid, producer.epoch, now_ms=now
            )
            checked.apply(result, fences=True)
            response = result.response
            if response.pending is not None:
                checked.pending.append(response.pending)
            if response.error is Errors.NONE:
                answer = (response.producer_id, response.producer_epoch)
                if producer.pid == -1:
                    # A new instance's epoch is one no producer had: it
                    # fences them all.
                    assert answer not in checked.handed.get(producer.tid, set()), answer
                checked.hand(producer.tid, *answer)
                if not lost:
                    producer.pid, producer.epoch = answer
        elif event < 0.45:
            producer = rng.choice(producers)
            pair = (producer.pid, producer.epoch)
            meta = shard.transactions.get(producer.tid)
            current = meta is not None and (meta.producer_id, meta.producer_epoch) == pair
            was_fenced = pair in checked.fenced.get(producer.tid, set())
            added = rng.sample(PARTITIONS, rng.randint(1, 3))
            added_result = shard.add_partitions(
                producer.tid, producer.pid, producer.epoch, added, now
            )
            if not current or was_fenced:
                # Only the current producer adds partitions.
                assert added_result.records == (), (pair, meta, added_result)
                assert added_result.response.error is not Errors.NONE
            checked.apply(added_result)
        elif event < 0.65:
            producer = rng.choice(producers)
            pair = (producer.pid, producer.epoch)
            was_fenced = pair in checked.fenced.get(producer.tid, set())
            result = shard.end_txn(
                producer.tid, producer.pid, producer.epoch, rng.random() < 0.6, now
            )
            if was_fenced:
                assert result.records == () and result.response.error in (
                    Errors.PRODUCER_FENCED,
                    Errors.INVALID_PRODUCER_ID_MAPPING,
                ), (pair, shard.transactions.get(producer.tid), result)
            checked.apply(result)
            response = result.response
            if response.pending is not None:
                checked.pending.append(response.pending)
            if response.error is Errors.NONE:
                checked.hand(producer.tid, response.producer_id, response.producer_epoch)
                if not lost:
                    producer.pid, producer.epoch = response.producer_id, response.producer_epoch
        elif event < 0.85 and checked.pending:
            # The runtime wrote some transaction's markers (or a stale
            # transaction's, after the coordinator moved on).
            pending = checked.pending.pop(rng.randrange(len(checked.pending)))
            meta = shard.transactions.get(pending.transactional_id)
            result = shard.complete_txn(
                pending.transactional_id, pending.producer_id, pending.producer_epoch, now
            )
            if meta is None or not meta.state.is_prepare:
                # Markers written twice (the runtime retried): nothing more.
                assert result.records == () and result.response.error is not Errors.NONE
            checked.apply(result)
            if rng.random() < 0.2:
                checked.pending.append(pending)
        else:
            now += rng.choice([0, timeout // 2, timeout, 10 * timeout])
            ticked = shard.tick(now)
            checked.apply(ticked, fences=True)
            checked.pending.extend(ticked.response)
    # Whatever is still prepared is what a new coordinator must finish.
    loaded, _, _ = new_shard()
    for record in compacted(checked.log.records):
        loaded.replay(record)
    prepared = {p.transactional_id for p in loaded.become_loaded(now)}
    assert prepared == {m.transactional_id for m in shard.transactions if m.state.is_prepare}


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_random_producers(seed: int) -> None:
    run(seed)
