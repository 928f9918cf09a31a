"""The queue workload's consumer-group mode against an in-memory broker and
group: the ops it records are well formed as the queue model (``subscribe``,
``commit``, polls with ``assigned`` and ``revoked``); each assignment starts
where the group's committed offset was; a commit's outcome is the client's
(``fail`` only when definitely not stored, ``info`` retires the process); a
crash keeps the member in the group; the options and flags carry the group."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.grpc_client.group import CommitError, CommitFailedError
from chaos.runner import RunConfig, _replay
from chaos.workloads.queue import QueueWorkload
from chaos.workloads.queue_setup import QueueOptions
from history.files import HistoryWriter, read_history
from history.ops import Op, check_well_formed
from history.queue import KeyMap
from tests.chaos.test_workload_queue import _Broker, _Consumer, _Producer, _Rec

KEYS = KeyMap((("queue", 4),))


class _Group:
    """One consumer group: live members in join order, keys shared out
    round-robin among them; committed offsets per key."""

    def __init__(self) -> None:
        self.members: list[_GroupConsumer] = []
        self.committed: dict[int, int] = {}
        # Members that left without leaving (crashed): still in the group.
        self.crashed: list[_GroupConsumer] = []
        self.refuse_commits: CommitError | None = None

    def share(self, member: _GroupConsumer) -> set[int]:
        live = [m for m in self.members if m.alive]
        if member not in live:
            return set()
        i = live.index(member)
        return {k for k in KEYS.keys if k % len(live) == i}


class _GroupConsumer(_Consumer):
    def __init__(self, broker: _Broker, group: _Group) -> None:
        super().__init__(broker)
        self.group = group
        self.listener: Any = None
        self.alive = True
        self.held: set[int] = set()

    def subscribe(self, topics: Any = None, *, pattern: Any = None, listener: Any = None) -> None:
        assert topics == ["queue"]
        self.listener = listener
        self.group.members.append(self)

    def known_position(self, partition: Any) -> int | None:
        return self.positions.get((partition[0], partition[1]))

    def committable(self) -> dict[Any, tuple[int, int]]:
        return {TopicPartition(t, p): (at, -1) for (t, p), at in self.positions.items()}

    async def commit(self, offsets: Any = None) -> None:
        if self.group.refuse_commits is not None:
            raise self.group.refuse_commits
        for tp, (offset, _) in offsets.items():
            self.group.committed[KEYS.key(tp.topic, tp.partition)] = offset

    async def poll(self, timeout_ms: int = 1_000, max_records: int | None = None) -> list[Any]:
        if self.listener is not None:
            target = self.group.share(self)
            gone, new = self.held - target, target - self.held
            if gone:
                self.listener.on_partitions_revoked(
                    [TopicPartition(*KEYS.topic_partition(k)) for k in sorted(gone)]
                )
                for k in gone:
                    self.positions.pop(KEYS.topic_partition(k), None)
            for k in sorted(new):
                # The committed offset, if any; else auto.offset.reset
                # places it later (earliest: 0), unknown at the callback.
                if k in self.group.committed:
                    self.positions[KEYS.topic_partition(k)] = self.group.committed[k]
            if new:
                self.listener.on_partitions_assigned(
                    [TopicPartition(*KEYS.topic_partition(k)) for k in sorted(new)]
                )
                for k in new:
                    self.positions.setdefault(KEYS.topic_partition(k), 0)
            self.held = target
        out: list[Any] = []
        for tp, at in self.positions.items():
            log = self.broker.logs.get(tp, [])
            out += [_Rec(tp[0], tp[1], o, log[o]) for o in range(at, min(len(log), at + 3))]
            self.positions[tp] = min(len(log), at + 3)
        await asyncio.sleep(0)
        return out

    async def close(self, timeout_ms: int = 30_000, *, leave_group: bool = True) -> None:
        self.alive = False
        if not leave_group:
            self.group.crashed.append(self)


def _workload(tmp_path: Path, group: _Group, **kwargs: Any) -> tuple[QueueWorkload, HistoryWriter]:
    broker = _Broker()
    writer = HistoryWriter(tmp_path / "history.jsonl")
    w = QueueWorkload(
        writer,
        lambda: _Producer(broker),
        lambda: _GroupConsumer(broker, group),
        random.Random(7),
        KEYS,
        concurrency=3,
        rate=400,
        final_time_s=5,
        final_round_s=1,
        group=True,
        **kwargs,
    )
    return w, writer


def _history(tmp_path: Path) -> list[Op]:
    return read_history(tmp_path / "history.jsonl")


def test_a_group_run_is_well_formed_and_each_assignment_starts_at_the_commit(
    tmp_path: Path,
) -> None:
    group = _Group()
    w, writer = _workload(tmp_path, group)

    async def main() -> Any:
        await w.prepare()
        # A count of ops, not a time: a loaded machine makes fewer per second.
        await w.run(60, op_limit=600)
        verdict = await w.final()
        await w.close()
        return verdict

    verdict = asyncio.run(main())
    writer.close()
    ops = _history(tmp_path)
    assert check_well_formed(ops, model="queue") == []
    fs = {op.f for op in ops}
    assert {"send", "poll", "subscribe", "commit", "crash"} <= fs
    assert verdict.ok, verdict
    assert all(op.value == {"keys": [0, 1, 2, 3]} for op in ops if op.f == "subscribe")
    # Replay the commits in history order: every assignment starts at the
    # key's committed offset then (0 with none), and its time is no later
    # than the poll that reports it.
    committed: dict[str, int] = {}
    assignments = revocations = 0
    for op in ops:
        if op.f == "commit" and op.type == "ok":
            committed.update(op.value[0][1])
        if op.f == "poll" and op.type == "ok" and op.assigned:
            for k, (start, at) in op.assigned.items():
                assert start == committed.get(k, 0), (op, committed)
                assert at <= op.time
                assignments += 1
        if op.f == "poll" and op.type == "ok" and op.revoked:
            revocations += 1
    assert assignments >= 4 and revocations >= 1
    # Crashes left members in the group (no leave), as a killed client does.
    assert group.crashed


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (CommitFailedError(int(Errors.STALE_MEMBER_EPOCH), "stale", definite=True), "fail"),
        (CommitError(int(Errors.NOT_COORDINATOR), "moved", definite=False), "info"),
        (CommitError(int(Errors.NOT_COORDINATOR), "moved", definite=True), "fail"),
    ],
    ids=["stale", "not-coordinator-after-write", "not-coordinator-first"],
)
def test_a_commit_takes_the_clients_class_and_info_retires_the_process(
    tmp_path: Path, error: CommitError, expected: str
) -> None:
    group = _Group()
    w, writer = _workload(tmp_path, group)

    async def main() -> None:
        await w.prepare()
        worker = w._workers[0]
        await w.subscribe(worker)
        await w.send(worker, [(0, 1)])
        await w.poll(worker)
        assert isinstance(worker.consumer, _GroupConsumer) and worker.consumer.committable()
        ok = await w.commit(worker)
        assert ok.type == "ok" and ok.value == [["commit", {"0": 1, "1": 0, "2": 0, "3": 0}]]
        group.refuse_commits = error
        failed = await w.commit(worker)
        assert failed.type == expected and failed.error == error.name.lower().replace("_", "-")
        # An info commit may be stored: its process retires, a new one subscribes.
        assert (worker.process == 0) is (expected == "fail")
        assert (worker.tracker is None) is (expected == "info")

    asyncio.run(main())
    writer.close()
    assert check_well_formed(_history(tmp_path), model="queue") == []


def test_the_group_option_reaches_the_config_and_the_replay() -> None:
    options = QueueOptions(group="g1")
    assert options.to_json()["group"] == "g1"
    assert " --group g1" in _replay(RunConfig(workload="queue", queue=options), 3)
    assert QueueOptions().to_json()["group"] is None
    with pytest.raises(ValueError, match="group"):
        QueueOptions(group=" ").check()
    with pytest.raises(ValueError, match="subscribe"):
        QueueWorkload(
            None,  # type: ignore[arg-type]
            lambda: None,  # type: ignore[arg-type,return-value]
            lambda: None,  # type: ignore[arg-type,return-value]
            random.Random(1),
            KEYS,
            weights={"assign": 1.0},
            group=True,
        )
