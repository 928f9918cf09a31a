"""The queue workload's transactions (chaos.workloads.queue, ``txn`` ops)
against an in-memory broker whose transactional producer commits a
transaction's records to the logs at once and drops an aborted one's (a
read_committed view): each outcome (ok, fail when a record fails or the
producer is fenced before its commit, info when the commit's answer is
lost), the fenced producer replaced, the consumer sought back after a
failed transaction's polls, the history well formed and checked by the
reference checks, and the final check's aborted-read firing."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from pathlib import Path
from typing import Any

import pytest

from broker.client.errors import Outcome
from broker.grpc_client.errors import (
    BrokerClientError,
    ProducerFencedError,
    TransactionAbortableError,
)
from broker.grpc_client.producer import RecordMetadata
from chaos.workloads.queue import QueueWorkload, check_final_polls
from history.files import HistoryWriter, read_history
from history.ops import Op, check_well_formed
from history.queue import KeyMap
from history.queue_checks import check_queue
from tests.chaos.test_workload_queue import _Broker, _Consumer, _delivery


class _TxnProducer:
    """A transactional producer over ``_Broker``: records wait in the
    transaction and reach the logs at its commit; ``script`` says what each
    commit does ("ok", "abortable", "fenced-early": fenced while committing,
    "lost": the answer lost; "fenced-begin" fences it at the next begin)."""

    opened = 0

    def __init__(self, broker: _Broker, lane: int, script: list[str]) -> None:
        self.broker = broker
        self.lane = lane
        self.script = script
        self.pending: list[tuple[tuple[str, int], bytes, asyncio.Future[Any]]] = []
        self.fenced = False
        self.committed = False
        self.inits = 0
        _TxnProducer.opened += 1

    async def init_transactions(self, timeout_ms: int | None = None) -> None:
        self.inits += 1

    def begin_transaction(self) -> None:
        if self.script and self.script[0] == "fenced-begin":
            # Another producer of the id fenced this one between transactions.
            self.script.pop(0)
            self.fenced = True
        if self.fenced:
            raise ProducerFencedError(90, "fenced", "PRODUCER_FENCED")
        self.pending = []
        self.committed = False

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        assert partition is not None and value is not None
        f: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append(((topic, partition), value, f))
        return f

    async def commit_transaction(self, timeout_ms: int | None = None) -> None:
        step = self.script.pop(0) if self.script else "ok"
        if self.committed:
            # Asked again after a lost answer: it goes on where it stopped.
            if step in ("lost", "lost-aborted"):
                raise BrokerClientError(-1, "no answer", "TimeoutException")
            return
        if step == "abortable":
            for _, _, f in self.pending:
                f.set_exception(_delivery("NOT_ENOUGH_REPLICAS", 19, Outcome.FAIL))
            raise TransactionAbortableError(19, "a record failed", "NOT_ENOUGH_REPLICAS")
        if step == "fenced-early":
            self.fenced = True
            raise ProducerFencedError(90, "fenced before the commit", "PRODUCER_FENCED")
        for tp, value, f in self.pending:
            log = self.broker.logs.setdefault(tp, [])
            if step != "lost-aborted":
                log.append(value)
            f.set_result(RecordMetadata(tp[0], tp[1], len(log) - 1, 0))
        self.committed = True
        if step in ("lost", "lost-aborted"):
            raise BrokerClientError(-1, "no answer", "TimeoutException")

    async def abort_transaction(self, timeout_ms: int | None = None) -> None:
        self.pending = []

    async def close(self, timeout_s: float | None = None) -> None:
        return None


class _SeekingConsumer(_Consumer):
    def known_position(self, partition: Any) -> int | None:
        return self.positions.get((partition[0], partition[1]))

    def seek(self, partition: Any, offset: int) -> None:
        self.positions[(partition[0], partition[1])] = offset


def _run(tmp_path: Path, script: list[str], ops: int = 40) -> tuple[QueueWorkload, list[Op]]:
    broker = _Broker()
    writer = HistoryWriter(tmp_path / "history.jsonl")
    producers: list[_TxnProducer] = []

    def open_txn(lane: int) -> _TxnProducer:
        p = _TxnProducer(broker, lane, script)
        producers.append(p)
        return p

    w = QueueWorkload(
        writer,
        lambda: open_txn(-1),
        lambda: _SeekingConsumer(broker),
        random.Random(5),
        KeyMap((("queue", 3),)),
        concurrency=2,
        rate=400,
        final_time_s=5,
        final_round_s=1,
        open_txn_producer=open_txn,
        read_committed=True,
    )

    async def main() -> Any:
        await w.prepare()
        await w.run(30, op_limit=ops)
        verdict = await w.final()
        await w.close()
        return verdict

    verdict = asyncio.run(main())
    writer.close()
    assert verdict.ok, verdict.check
    return w, read_history(tmp_path / "history.jsonl")


def _txns(history: list[Op], type_: str) -> list[Op]:
    return [op for op in history if op.f == "txn" and op.type == type_]


def test_committed_aborted_fenced_and_unknown_transactions(tmp_path: Path) -> None:
    script = [
        "ok", "abortable", "ok", "fenced-begin", "ok", "fenced-early", "ok",
        "lost", "lost", "lost", "ok",
    ]  # fmt: skip
    w, history = _run(tmp_path, list(script))
    assert check_well_formed(history) == []
    ok, fail, info = _txns(history, "ok"), _txns(history, "fail"), _txns(history, "info")
    assert ok and fail and info
    errors = {op.error for op in fail}
    assert {"not-enough-replicas", "producer-fenced"} <= errors
    # A failed transaction names no offset; an ok one every send's.
    for op in fail:
        assert all(m[2][0] is None for m in op.value if m[0] == "send")
    for op in ok:
        assert all(m[2][0] is not None for m in op.value if m[0] == "send")
    # Fenced while committing, or the commit's answer lost: unknown; each
    # retired its process.
    assert {op.error for op in info} == {"producer-fenced", "timeoutexception"}
    assert w.stats.retired >= 2
    # The reference checks find nothing: committed records all read, no
    # aborted one read, no cycle.
    found = check_queue(history, isolation="read_committed")
    assert found.valid is True, found.all()


def test_a_failed_transactions_polls_are_undone(tmp_path: Path) -> None:
    _, history = _run(tmp_path, ["ok"] * 3 + ["abortable"] * 10, ops=60)
    # Every process's ok polls (plain and in ok transactions) go on from
    # where its last ok poll ended: the checks see no skip.
    found = check_queue(history, isolation="read_committed")
    assert not found.anomalies.get("poll-skip"), found.anomalies.get("poll-skip")
    assert found.valid is True, found.all()


def test_the_final_check_fires_on_an_aborted_record_read(tmp_path: Path) -> None:
    _, history = _run(tmp_path, ["ok", "abortable", "ok"])
    fail = _txns(history, "fail")
    sent = [(m[1], m[2][1]) for op in fail for m in op.value if m[0] == "send"]
    assert sent
    k, v = sent[0]
    # A final read that returned the aborted record.
    fake = Op(
        index=len(history),
        time=history[-1].time + 1,
        type="ok",
        process=0,
        f="poll",
        value=[["poll", {str(k): [[999, v]]}]],
    )
    check = check_final_polls([*history, fake], fake.index, read_committed=True)
    assert check["aborted_read"] == [{"key": k, "value": v, "offset": 999}]


def test_an_unknown_transactions_records_need_be_read_only_if_some_poll_saw_them() -> None:
    def op(index: int, type_: str, f: str, value: Any) -> Op:
        return Op(index=index, time=index, type=type_, process=0, f=f, value=value)  # type: ignore[arg-type]

    # An info transaction whose record was appended at offset 3 (then
    # perhaps aborted) and an info send with its offset: the send's record
    # must be read, the transaction's need not be.
    history = [
        op(0, "info", "txn", [["send", 0, [3, 7]]]),
        op(1, "info", "send", [["send", 0, [4, 8]]]),
        op(2, "ok", "poll", [["poll", {}]]),
    ]
    check = check_final_polls(history, 2, read_committed=True)
    assert check["lost"] == [{"key": 0, "value": 8, "offset": 4}]
    # Once a poll saw the transaction's record, it committed: it must stay.
    seen = [*history[:2], op(2, "ok", "poll", [["poll", {"0": [[3, 7]]}]])]
    seen.append(op(3, "ok", "poll", [["poll", {}]]))
    check = check_final_polls(seen, 3, read_committed=True)
    assert {(x["key"], x["value"]) for x in check["lost"]} == {(0, 7), (0, 8)}


class _Recording(_TxnProducer):
    """A transactional producer that records, per lane, the time and
    partition of each transaction's sends, and the partitions the workload
    assumed added (its ``transactions.assume_added``)."""

    sends: dict[int, list[list[tuple[float, tuple[str, int]]]]]
    assumed: list[tuple[str, int]]

    def __init__(self, broker: _Broker, lane: int, script: list[str]) -> None:
        super().__init__(broker, lane, script)
        self.transactions = self

    def assume_added(self, tp: Any) -> None:
        self.assumed.append((tp.topic, tp.partition))

    def begin_transaction(self) -> None:
        super().begin_transaction()
        self.sends.setdefault(self.lane, []).append([])

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        assert partition is not None
        self.sends[self.lane][-1].append((time.monotonic(), (topic, partition)))
        return await super().send(topic, value, key, partition)


def _recorded_run(tmp_path: Path, ops: int, **options: Any) -> type[_Recording]:
    """``ops`` ops of two lanes of :class:`_Recording` producers."""
    broker = _Broker()

    class Recording(_Recording):
        sends = {}
        assumed = []

    with HistoryWriter(tmp_path / "history.jsonl") as writer:
        w = QueueWorkload(
            writer,
            lambda: Recording(broker, -1, []),
            lambda: _SeekingConsumer(broker),
            random.Random(5),
            KeyMap((("queue", 3),)),
            concurrency=2,
            rate=400,
            open_txn_producer=lambda lane: Recording(broker, lane, []),
            **options,
        )
        asyncio.run(w.run(30, op_limit=ops))
    return Recording


def test_unadded_sends_skip_adding_some_partitions_of_their_transactions(tmp_path: Path) -> None:
    recorded = _recorded_run(tmp_path, 200, unadded_sends=0.5)
    sent = [tp for lane in recorded.sends.values() for txn in lane for _, tp in txn]
    # About half the sends, each to the partition it was sent to just after.
    assert 0.3 * len(sent) < len(recorded.assumed) < 0.7 * len(sent)
    assert set(recorded.assumed) <= set(sent)
    with HistoryWriter(tmp_path / "unused.jsonl") as writer:
        for bad in (-0.1, 1.0):
            with pytest.raises(ValueError, match="unadded_sends must be in"):
                QueueWorkload(
                    writer,
                    lambda: _Recording(_Broker(), -1, []),
                    lambda: _SeekingConsumer(_Broker()),
                    random.Random(5),
                    KeyMap((("queue", 3),)),
                    unadded_sends=bad,
                )


def test_the_zombie_lane_stalls_between_the_micro_ops_of_its_transactions(
    tmp_path: Path,
) -> None:
    recorded = _recorded_run(tmp_path, 60, zombie_pause_s=0.05)
    assert not recorded.assumed

    def gaps(lane: int) -> list[float]:
        return [b[0] - a[0] for sends in recorded.sends[lane] for a, b in itertools.pairwise(sends)]

    assert gaps(1) and min(gaps(1)) >= 0.05
    assert gaps(0) and min(gaps(0)) < 0.05
