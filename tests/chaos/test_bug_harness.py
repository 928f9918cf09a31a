"""B18 of the catalogue, a harness bug: the queue workload records a send
answered NOT_LEADER_OR_FOLLOWER after sending (its records may be in the
log, KAFKA-13574) as ``fail``. A poll then sees a value whose send failed,
and Jepsen's G1a fires; with the bug off the send is ``info`` and the
history is valid."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import bugs
from broker.client.errors import Outcome
from bugs import Bug
from chaos.workloads.queue import QueueWorkload, RecordOutcome, record_outcome
from history.files import HistoryWriter, read_history
from history.ops import check_well_formed
from history.queue import KeyMap
from history.queue_checks import QueueResult, check_queue
from tests.chaos.test_workload_queue import _Broker, _Consumer, _delivery, _done, _Producer


def test_b18_not_leader_after_sending_is_recorded_as_fail() -> None:
    answer = _done(exc=_delivery("NOT_LEADER_OR_FOLLOWER", 6, Outcome.INFO))
    assert record_outcome(answer) == RecordOutcome("info", None, "not-leader-or-follower")
    with bugs.injected(Bug.HARNESS_NOT_LEADER_AS_FAIL):
        assert record_outcome(answer) == RecordOutcome("fail", None, "not-leader-or-follower")
        # Only that answer: another unknown outcome stays info.
        timed_out = _done(exc=_delivery("REQUEST_TIMED_OUT", 7, Outcome.INFO))
        assert record_outcome(timed_out).type == "info"


class _NotLeaderProducer(_Producer):
    """Key 0's appends land, and the answer is NOT_LEADER_OR_FOLLOWER (the
    leader lost its leadership while acks=all waited; the new leader has
    the records)."""

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        future = await super().send(topic, value, key, partition)
        if partition != 0:
            return future
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answered.set_exception(_delivery("NOT_LEADER_OR_FOLLOWER", 6, Outcome.INFO))
        return answered


def _run(tmp_path: Path) -> QueueResult:
    broker = _Broker()
    writer = HistoryWriter(tmp_path / "history.jsonl")
    w = QueueWorkload(
        writer,
        lambda: _NotLeaderProducer(broker),
        lambda: _Consumer(broker),
        random.Random(3),
        KeyMap((("queue", 3),)),
        concurrency=3,
        rate=400,
        final_time_s=5,
        final_round_s=1,
    )

    async def main() -> None:
        await w.prepare()
        await w.run(60, op_limit=400)  # a count, not a time: load makes fewer
        await w.final()
        await w.close()

    asyncio.run(main())
    writer.close()
    ops = read_history(tmp_path / "history.jsonl")
    assert check_well_formed(ops, model="queue") == []
    assert any(op.f == "send" and op.error == "not-leader-or-follower" for op in ops)
    return check_queue(ops)


def test_with_the_bug_off_the_history_is_valid(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.fired == [] and result.valid is True


def test_b18_a_poll_sees_a_failed_send_and_g1a_fires(tmp_path: Path) -> None:
    with bugs.injected(Bug.HARNESS_NOT_LEADER_AS_FAIL):
        result = _run(tmp_path)
    assert "G1a" in result.fired, result.fired
    assert all(a.key == "0" for a in result.anomalies["G1a"]), result.anomalies["G1a"]
