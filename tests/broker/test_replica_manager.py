"""The replicas of a broker driven by metadata images (broker/replica_manager.py,
Kafka's ReplicaManager.applyDelta): several brokers' managers on in-memory
log directories, images replayed from the metadata layer's records, fetches
delivered at once by the test as the driver would."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from broker import replica_manager
from broker.errors import Errors
from broker.local_changes import local_changes
from broker.log_dirs import MemoryLogDirectory
from broker.log_manager import LogManager
from broker.replica import Role
from broker.replica_manager import FetchTarget, NotLeaderError, ReplicaManager
from metadata.image import TopicIdPartition
from metadata.records import NO_LEADER
from metadata.records import Record as MetadataRecord
from partition_log.batch import BatchScanner, build_batch, decode_records
from partition_log.log import PartitionLog
from partition_log.records import Record
from tests.broker.images import (
    EPOCHS,
    Metadata,
    change,
    fence,
    register,
    remove,
    topic,
    topic_config,
)
from tests.quorum.test_purity import impurities

ROOT = Path(__file__).resolve().parents[2]
A0 = TopicIdPartition("id-a", 0)


def batch(value: bytes) -> bytes:
    return build_batch([Record(0, 1000, b"k", value)])


class Cluster:
    """Brokers 1-3, each a ReplicaManager over its own log directory, fed
    every image of one metadata log."""

    def __init__(self) -> None:
        self.md = Metadata()
        self.dirs = {b: MemoryLogDirectory(f"broker-{b}") for b in (1, 2, 3)}
        self.brokers = {b: ReplicaManager(b, LogManager([self.dirs[b]])) for b in (1, 2, 3)}
        self.now = 0
        self.results = {b: self.brokers[b].apply_delta(self.md.image, 0) for b in self.brokers}

    def step(self, *records: MetadataRecord) -> None:
        self.now += 1
        self.md.step(*records)
        self.results = {
            b: manager.apply_delta(self.md.image, self.now) for b, manager in self.brokers.items()
        }

    def replicate(self, rounds: int = 3) -> None:
        """Every follower fetches from its leader ``rounds`` times."""
        for _ in range(rounds):
            self.now += 1
            for b, manager in self.brokers.items():
                for leader, requests in manager.next_fetch_requests(EPOCHS[b]).items():
                    for key, request in requests.items():
                        outcome = self.brokers[leader].step_fetch(key, request, self.now)
                        manager.step_fetch_answer(key, request, outcome.answer, self.now)

    def log(self, broker: int, key: TopicIdPartition = A0) -> PartitionLog:
        log = self.brokers[broker].replicas[key].log
        assert isinstance(log, PartitionLog)
        return log


def test_the_modules_are_pure() -> None:
    for name in ("replica_manager.py", "log_manager.py", "log_dirs.py", "local_changes.py"):
        path = ROOT / "broker" / name
        assert impurities(path.read_text(), f"broker/{name}") == [], name


def test_a_new_partition_is_led_and_followed_with_one_fetcher_per_leader() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2, 3), (2, 1, 3)))
    assert c.brokers[1].replicas[A0].role is Role.LEADER
    # Broker 3 follows both partitions: one fetcher to each leader.
    a1 = TopicIdPartition("id-a", 1)
    assert c.results[3].fetchers == {
        1: {A0: FetchTarget(1, 0, 0)},
        2: {a1: FetchTarget(2, 0, 0)},
    }
    assert c.results[3].started == {A0: FetchTarget(1, 0, 0), a1: FetchTarget(2, 0, 0)}
    assert c.results[1].fetchers == {2: {a1: FetchTarget(2, 0, 0)}}
    assert set(c.brokers[3].next_fetch_requests(300)) == {1, 2}


def test_produce_replicate_and_commit() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2, 3)))
    c.brokers[1].append(A0, batch(b"x"), -1, c.now)
    c.replicate()
    assert [c.log(b).log_end_offset for b in (1, 2, 3)] == [1, 1, 1]
    assert [c.log(b).high_watermark for b in (1, 2, 3)] == [1, 1, 1]


def test_leadership_moves_over_deltas_by_epoch_never_to_the_hw() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2, 3)))
    for value in (b"r0", b"r1"):
        c.brokers[1].append(A0, batch(value), 1, c.now)
    # One fetch: the followers have both records but learn the HW a round
    # late (KIP-101's setting).
    c.replicate(rounds=1)
    assert c.log(3).log_end_offset == 2 and c.log(3).high_watermark == 0
    # The old leader writes a record nobody fetches, then loses leadership.
    c.brokers[1].append(A0, batch(b"lost"), 1, c.now)
    c.step(change("id-a", 0, leader=2, isr=(2, 3)))
    # The new leader records its epoch at its LEO before accepting anything.
    assert c.log(2).epoch_cache.entries[-1].epoch == 1
    assert c.log(2).epoch_cache.entries[-1].start_offset == 2
    assert c.brokers[2].replicas[A0].role is Role.LEADER
    assert c.results[2].stopped == {A0}
    # Followers keep their logs (no truncation to the HW) and fetch from
    # the new leader at their LEO; broker 3 moved between leaders.
    assert c.log(3).log_end_offset == 2
    assert c.results[3].moved == {A0: (1, 2)}
    assert c.results[3].started == {A0: FetchTarget(2, 1, 2)}
    assert c.results[1].started == {A0: FetchTarget(2, 1, 3)}
    with pytest.raises(NotLeaderError) as caught:
        c.brokers[1].append(A0, batch(b"late"), 1, c.now)
    assert caught.value.code is Errors.NOT_LEADER_OR_FOLLOWER
    assert (caught.value.current_leader, caught.value.current_leader_epoch) == (2, 1)
    c.brokers[2].append(A0, batch(b"r2"), 1, c.now)
    c.replicate()
    # The old leader's unreplicated record went by epoch (it diverged).
    assert [c.log(b).log_end_offset for b in (1, 2, 3)] == [3, 3, 3]
    assert [c.log(b).epoch_cache.latest_epoch for b in (1, 2, 3)] == [1, 1, 1]
    # And back to broker 1 in a third epoch.
    c.step(change("id-a", 0, leader=1, isr=(1, 2, 3)))
    assert c.log(1).epoch_cache.entries[-1].epoch == 2
    assert c.results[1].stopped == {A0} and c.results[2].started == {A0: FetchTarget(1, 2, 3)}


def test_an_isr_change_does_not_restart_fetching() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2, 3)))
    c.step(change("id-a", 0, isr=(1, 2)))
    assert c.results[3].started == {} and c.results[3].stopped == frozenset()
    assert c.brokers[1].replicas[A0].partition_epoch == 1
    assert c.brokers[3].fetching == {A0: FetchTarget(1, 0, 0)}


def test_a_replica_moved_away_is_stopped_and_deleted() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2, 3)))
    c.step(change("id-a", 0, replicas=(1, 2), isr=(1, 2), leader=1))
    assert A0 not in c.brokers[3].replicas
    assert c.results[3].stopped == {A0} and c.results[3].fetchers == {}
    assert c.results[3].deleted == ("a-0.id-a-delete",)
    assert c.dirs[3].list() == ["a-0.id-a-delete"]


def test_a_deleted_and_recreated_topic_gets_a_new_replica() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2)))
    c.brokers[1].append(A0, batch(b"old"), 1, c.now)
    c.step(remove("id-a"), *topic("a", "id-a2", (1, 2)))
    new = TopicIdPartition("id-a2", 0)
    assert set(c.brokers[1].replicas) == {new}
    assert c.log(1, new).log_end_offset == 0
    assert c.dirs[1].list() == ["a-0", "a-0.id-a-delete"]
    assert c.results[2].started == {new: FetchTarget(1, 0, 0)}
    with pytest.raises(NotLeaderError) as caught:
        c.brokers[1].append(A0, batch(b"x"), 1, c.now)
    assert caught.value.code is Errors.UNKNOWN_TOPIC_OR_PARTITION


def test_a_fenced_broker_stops_serving_as_leader() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2)))
    c.brokers[1].append(A0, batch(b"x"), 1, c.now)
    c.step(fence(1))
    assert c.brokers[1].replicas[A0].role is Role.NONE
    with pytest.raises(NotLeaderError) as caught:
        c.brokers[1].append(A0, batch(b"y"), 1, c.now)
    assert caught.value.code is Errors.NOT_LEADER_OR_FOLLOWER
    # The log is kept.
    assert c.log(1).log_end_offset == 1


def test_an_offline_partition_stops_fetching_and_keeps_its_log() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2)))
    c.step(change("id-a", 0, leader=NO_LEADER, isr=(2,)))
    assert c.results[2].stopped == {A0} and c.brokers[2].fetching == {}
    assert c.brokers[2].replicas[A0].role is Role.NONE
    assert c.dirs[2].list() == ["a-0"]
    c.step(change("id-a", 0, leader=2, isr=(2,)))
    assert c.brokers[2].replicas[A0].role is Role.LEADER
    assert c.results[1].started == {A0: FetchTarget(2, 2, 0)}


def test_fetch_and_produce_routing_errors_carry_the_leader() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2)))
    request = c.brokers[2].next_fetch_requests(200)[1][A0]
    outcome = c.brokers[2].step_fetch(A0, request, c.now)
    assert outcome.answer.error is Errors.NOT_LEADER_OR_FOLLOWER
    assert (outcome.answer.current_leader, outcome.answer.current_leader_epoch) == (1, 0)
    unknown = c.brokers[1].step_fetch(TopicIdPartition("nope", 0), request, c.now)
    assert unknown.answer.error is Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert c.brokers[1].resolve("a", 0) == A0
    with pytest.raises(NotLeaderError, match="has no partition 5"):
        c.brokers[1].resolve("a", 5)
    with pytest.raises(NotLeaderError) as caught:
        c.brokers[3].append(A0, batch(b"x"), 1, c.now)
    assert caught.value.code is Errors.NOT_LEADER_OR_FOLLOWER
    assert caught.value.current_leader == 1


def test_restart_loads_the_logs_and_resumes() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2)))
    c.brokers[1].append(A0, batch(b"x"), -1, c.now)
    c.replicate()
    stopped = c.brokers[2].shutdown()
    assert stopped.stopped == {A0}
    logs = LogManager([c.dirs[2]])
    assert logs.load(c.md.image, 2, now_ms=c.now).loaded == (A0,)
    again = ReplicaManager(2, logs)
    result = again.apply_delta(c.md.image, c.now)
    assert result.started == {A0: FetchTarget(1, 0, 1)}
    assert again.replicas[A0].log.log_end_offset == 1


def test_a_foreign_topic_id_puts_only_that_partition_offline() -> None:
    md = Metadata(*topic("a", "id-a", (1,)))
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    first = ReplicaManager(1, logs)
    first.apply_delta(md.image, 0)
    first.shutdown()
    # Without load (which sets strays aside), the old directory is in the way.
    md.step(remove("id-a"), *topic("a", "id-new", (1,)), *topic("b", "id-b", (1,)))
    second = ReplicaManager(1, LogManager([d]))
    result = second.apply_delta(md.image, 0)
    new = TopicIdPartition("id-new", 0)
    assert set(result.failed) == {new}
    assert "holds topic id id-a, not id-new" in result.failed[new]
    assert second.replicas[TopicIdPartition("id-b", 0)].role is Role.LEADER
    with pytest.raises(NotLeaderError, match="offline here"):
        second.append(new, batch(b"x"), 1, 0)


def test_a_bad_topic_config_is_named_and_the_partition_offline() -> None:
    md = Metadata(*topic("a", "id-a", (1,)))
    md.step(topic_config("a", "segment.bytes", "20"))
    result = ReplicaManager(1, LogManager([MemoryLogDirectory()])).apply_delta(md.image, 0)
    assert "segment.bytes=20" in result.failed[A0]


def test_a_topic_config_change_reaches_the_open_logs() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2)))
    c.step(topic_config("a", "retention.ms", "1000"), topic_config("a", "min.insync.replicas", "2"))
    assert c.log(1).config.retention_ms == 1000
    assert c.brokers[1].replicas[A0].config.min_insync_replicas == 2


def test_isr_expiry_asks_for_an_alter_partition() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2)))
    c.brokers[1].append(A0, batch(b"x"), 1, c.now)
    assert c.brokers[1].tick_isr(c.now + 1) == []
    (key, request), *_ = c.brokers[1].tick_isr(c.now + 40_000)
    assert key == A0 and request.isr == (1,)


def test_isr_expiry_runs_every_half_lag_time() -> None:
    """Kafka's isr-expiration schedule (replica.lag.time.max.ms / 2, 15 s
    by default): a tick before it is due looks at no partition."""
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2)))
    c.brokers[1].append(A0, batch(b"x"), 1, c.now)
    assert c.brokers[1].tick_isr(c.now + 20_000) == []
    # Broker 2 has been behind for the 30 s lag time, but the expiration
    # ran at +20 s: the next is due at +35 s.
    assert c.brokers[1].tick_isr(c.now + 34_999) == []
    (key, request), *_ = c.brokers[1].tick_isr(c.now + 35_000)
    assert key == A0 and request.isr == (1,)


def test_a_shut_down_manager_refuses_images() -> None:
    c = Cluster()
    c.brokers[1].shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        c.brokers[1].apply_delta(c.md.image, 0)
    # A broker registering late: nothing hosted until it is in replicas.
    late = ReplicaManager(4, LogManager([MemoryLogDirectory()]))
    c.md.step(register(4))
    assert late.apply_delta(c.md.image, 0).changes.empty


def test_a_follower_of_an_unregistered_leader_does_not_fetch() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (4, 1)))
    # Broker 4 is named leader but not registered: broker 1 follows it
    # without fetching; once registered, fetching starts.
    assert c.brokers[1].replicas[A0].role is Role.FOLLOWER
    assert c.brokers[1].fetching == {}
    c.md.step(register(4))
    c.step(change("id-a", 0, isr=(4, 1)))
    assert c.results[1].started == {A0: FetchTarget(4, 0, 0)}


def committed_records(log: PartitionLog, end: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record below ``end``."""
    found: list[tuple[int, bytes]] = []
    if end <= 0:
        return found
    data = log.read(0, 1 << 30, max_offset=end)
    for scanned in BatchScanner(data, check_crc=False):
        for record in decode_records(data[scanned.position : scanned.end]):
            if record.offset < end:
                found.append((record.offset, record.value or b""))
    return found


@pytest.mark.parametrize("seed", range(12))
def test_random_leadership_changes_and_restarts_keep_committed_records(seed: int) -> None:
    """Produces (acks=1), partial replication, clean elections among the
    ISR and clean restarts of a follower, all through images: every record
    below the highest HW seen stays, at its offset, in every replica (a
    follower truncating to its HW when it follows a new leader breaks it
    for half of these seeds)."""
    rng = random.Random(seed)
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 2, 3)))
    committed: list[tuple[int, bytes]] = []
    written = 0
    for _ in range(40):
        leader = c.md.image.partition("id-a", 0).leader  # type: ignore[union-attr]
        action = rng.random()
        if action < 0.4:
            written += 1
            c.brokers[leader].append(A0, batch(b"v%d" % written), 1, c.now)
        elif action < 0.7:
            c.replicate(rounds=rng.randint(1, 2))
        elif action < 0.85:
            new_leader = rng.choice([b for b in (1, 2, 3) if b != leader])
            c.step(change("id-a", 0, leader=new_leader))
        else:
            follower = rng.choice([b for b in (1, 2, 3) if b != leader])
            c.brokers[follower].shutdown()
            logs = LogManager([c.dirs[follower]])
            logs.load(c.md.image, follower, now_ms=c.now)
            c.brokers[follower] = ReplicaManager(follower, logs)
            c.brokers[follower].apply_delta(c.md.image, c.now)
        high = max(c.log(b).high_watermark for b in (1, 2, 3))
        committed = committed_records(c.log(leader), high) if high > len(committed) else committed
        for b in (1, 2, 3):
            log = c.log(b)
            mine = committed_records(log, min(len(committed), log.log_end_offset))
            assert mine == committed[: len(mine)], (seed, b)
        # The leader holds every committed record.
        current = c.md.image.partition("id-a", 0).leader  # type: ignore[union-attr]
        assert committed_records(c.log(current), len(committed)) == committed
    c.replicate(rounds=3)
    ends = {c.log(b).log_end_offset for b in (1, 2, 3)}
    assert len(ends) == 1


def test_one_leader_s_fetch_looks_only_at_the_partitions_fetched_from_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each per-leader stream builds its fetch every round: it must not
    walk (or sort) the partitions fetched from the other leaders."""
    c = Cluster()
    c.step(*topic("a", "id-a", *[(1, 3)] * 3, *[(2, 3)] * 2))
    manager = c.brokers[3]
    asked: list[TopicIdPartition] = []
    for key, replica in manager.replicas.items():

        def spy(
            broker_epoch: int, key: TopicIdPartition = key, ask: Any = replica.next_fetch_request
        ) -> Any:
            asked.append(key)
            return ask(broker_epoch)

        monkeypatch.setattr(replica, "next_fetch_request", spy)
    from_1 = [TopicIdPartition("id-a", i) for i in range(3)]
    requests = manager.next_fetch_request(1, EPOCHS[3])
    assert list(requests) == from_1
    assert asked == from_1
    assert manager.next_fetch_request(4, EPOCHS[3]) == {}
    assert [manager.is_fetching_from(b) for b in (1, 2, 3)] == [True, True, False]
    assert manager.next_fetch_requests(EPOCHS[3]) == {
        1: requests,
        2: manager.next_fetch_request(2, EPOCHS[3]),
    }


def test_the_leaders_fetched_from_follow_each_image_and_the_shutdown() -> None:
    c = Cluster()
    c.step(*topic("a", "id-a", (1, 3), (2, 3)))
    manager = c.brokers[3]
    assert manager.fetchers() == c.results[3].fetchers
    c.step(change("id-a", 1, leader=3, isr=(3, 2)))
    # Broker 3 leads what it fetched from broker 2: that stream has nothing left.
    assert not manager.is_fetching_from(2) and manager.is_fetching_from(1)
    assert set(manager.next_fetch_requests(EPOCHS[3])) == {1}
    c.step(change("id-a", 0, leader=2, isr=(2, 1, 3)))
    assert not manager.is_fetching_from(1) and manager.is_fetching_from(2)
    assert list(manager.next_fetch_request(2, EPOCHS[3])) == [A0]
    manager.shutdown()
    assert not manager.is_fetching_from(2) and manager.fetchers() == {}


def test_the_local_changes_of_an_image_are_computed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker asks which logs an image creates, maybe again while it
    creates them in parts, then applies it: one computation of its local
    changes, and never one made against another image held."""
    computed: list[tuple[int, int]] = []

    def counting(previous: Any, image: Any, broker_id: int) -> Any:
        computed.append((previous.offset, image.offset))
        return local_changes(previous, image, broker_id)

    monkeypatch.setattr(replica_manager, "local_changes", counting)
    md = Metadata()
    manager = ReplicaManager(1, LogManager([MemoryLogDirectory()]))
    held = manager.image
    md.step(*topic("a", "id-a", (1,), (1,)))
    first = md.image
    assert len(manager.logs_to_create(first)) == 2
    assert len(manager.logs_to_create(first)) == 2
    manager.apply_delta(first, 0)
    assert computed == [(held.offset, first.offset)]
    # Another image asked about, then a third applied: the second's changes
    # were against the first held and are computed again against the third.
    md.step(*topic("b", "id-b", (1,)))
    second = md.image
    assert [key.topic_id for key, _ in manager.logs_to_create(second)] == ["id-b"]
    md.step(*topic("c", "id-c", (1,)))
    manager.apply_delta(md.image, 0)
    assert manager.logs_to_create(second) == []
    assert computed[1:] == [
        (first.offset, second.offset),
        (first.offset, md.image.offset),
        (md.image.offset, second.offset),
    ]
