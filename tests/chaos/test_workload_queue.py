"""The queue workload (chaos.workloads.queue): the outcome mapping from the
producer's answers, the ops it records against an in-memory broker (well
formed as the queue model), its final polls, the no-loss check firing on a
lost, moved or inconsistent record, and the run config's refusals."""

from __future__ import annotations

import asyncio
import gc
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.client.accumulator import ProduceAnswer
from broker.client.errors import DeliveryError, Outcome
from broker.client.producer_batch import RecordFuture
from broker.errors import Errors
from broker.grpc_client.errors import BrokerClientError, DeliveryFailedError, NoBrokerError
from broker.grpc_client.producer import RecordMetadata
from chaos.runner import RunConfig
from chaos.workloads.queue import (
    FINAL_POLL_BACKOFF_S,
    QueueWorkload,
    RecordOutcome,
    check_final_polls,
    error_word,
    record_outcome,
    send_outcome,
)
from chaos.workloads.queue_setup import QueueOptions
from history.files import HistoryWriter, read_history
from history.ops import Op, OpType, check_well_formed
from history.queue import KeyMap
from history.queue_checks import Cleanup
from tests.broker.client.producer_state import (
    make_kafka,
    resend_after_a_timeout,
    send,
    send_one,
    send_two,
)

# -- the outcome mapping ------------------------------------------------------------


def _done(result: Any = None, exc: BaseException | None = None) -> asyncio.Future[Any]:
    loop = asyncio.new_event_loop()
    try:
        f: asyncio.Future[Any] = loop.create_future()
        if exc is not None:
            f.set_exception(exc)
        else:
            f.set_result(result)
        return f
    finally:
        loop.close()


def _delivery(name: str, code: int, outcome: Outcome) -> DeliveryFailedError:
    return DeliveryFailedError(DeliveryError(name, code, "partition queue-0", outcome))


def test_error_words() -> None:
    assert error_word("NOT_ENOUGH_REPLICAS_AFTER_APPEND") == "not-enough-replicas-after-append"
    assert error_word("NETWORK_EXCEPTION") == "network-exception"
    assert error_word("") == "unknown"


@pytest.mark.parametrize(
    ("name", "code", "outcome", "expected"),
    [
        (
            "NOT_ENOUGH_REPLICAS",
            19,
            Outcome.FAIL,
            RecordOutcome("fail", None, "not-enough-replicas"),
        ),
        (
            "NOT_LEADER_OR_FOLLOWER",
            6,
            Outcome.INFO,
            RecordOutcome("info", None, "not-leader-or-follower"),
        ),
        (
            "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
            20,
            Outcome.INFO,
            RecordOutcome("info", None, "not-enough-replicas-after-append"),
        ),
        ("REQUEST_TIMED_OUT", 7, Outcome.INFO, RecordOutcome("info", None, "request-timed-out")),
        ("NETWORK_EXCEPTION", 13, Outcome.INFO, RecordOutcome("info", None, "network-exception")),
        ("TIMEOUT", -1, Outcome.FAIL, RecordOutcome("fail", None, "timeout")),
        ("TIMEOUT", -1, Outcome.INFO, RecordOutcome("info", None, "timeout")),
        ("MESSAGE_TOO_LARGE", 10, Outcome.FAIL, RecordOutcome("fail", None, "message-too-large")),
    ],
)
def test_a_failed_record_takes_the_clients_class_not_its_name(
    name: str, code: int, outcome: Outcome, expected: RecordOutcome
) -> None:
    assert record_outcome(_done(exc=_delivery(name, code, outcome))) == expected


def _outcome(record: RecordFuture) -> RecordOutcome:
    assert record.error is not None
    return record_outcome(_done(exc=DeliveryFailedError(record.error)))


def test_out_of_order_sequence_number_is_fail_only_if_no_attempt_may_have_written() -> None:
    # Refused at once (at or below an acknowledged sequence), with no
    # earlier attempt that may be in the log: definitely not written.
    # The producer's bookkeeping as the workload runs it (Kafka's reading of
    # OUT_OF_ORDER_SEQUENCE_NUMBER, queue_setup), one record a batch.
    acc = make_kafka()
    (first, _), (a, b) = send_two(acc, (b"1", b"2"), topic="queue")
    acc.on_answer(a, ProduceAnswer(Errors.NOT_ENOUGH_REPLICAS), 1)  # before the append
    acc.on_answer(b, ProduceAnswer(base_offset=0), 1)
    (again,) = send(acc, 2, topic="queue")
    acc.on_answer(again, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 3)
    assert _outcome(first) == RecordOutcome("fail", None, "out-of-order-sequence-number")
    # Refused after an attempt whose answer was lost (timed out): that
    # attempt may be in the log, so the refusal of the next says nothing
    # definite about the record.
    acc = make_kafka()
    record, batch = send_one(acc, b"3", topic="queue")
    batch = resend_after_a_timeout(acc, batch, topic="queue")
    late = acc.config.delivery_timeout_ms + 1
    acc.on_answer(batch, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), late)
    assert _outcome(record) == RecordOutcome("info", None, "out-of-order-sequence-number")
    assert send_outcome([_outcome(first), _outcome(record)]) == (
        "info",
        "out-of-order-sequence-number",
    )


def test_ok_records_and_the_other_endings() -> None:
    assert record_outcome(_done(RecordMetadata("q", 0, 7, 0))) == RecordOutcome("ok", 7)
    # A duplicate whose offsets the broker no longer had: ok, offset unknown.
    assert record_outcome(_done(RecordMetadata("q", 0, -1, 0))) == RecordOutcome("ok", None)
    # The producer failed as a whole: it cannot say whether the batch went.
    fatal = BrokerClientError(-1, "sender died", "KafkaException")
    assert record_outcome(_done(exc=fatal)) == RecordOutcome("info", None, "kafkaexception")
    # Never queued (no broker answered the metadata request): never sent.
    assert record_outcome(None, NoBrokerError("none")) == RecordOutcome(
        "fail", None, "broker-not-available"
    )
    loop = asyncio.new_event_loop()
    try:
        pending: asyncio.Future[Any] = loop.create_future()
        assert record_outcome(pending) == RecordOutcome("info", None, "timeout")
    finally:
        loop.close()


def test_a_record_given_up_on_fails_later_without_a_never_retrieved_report() -> None:
    """The op ended ``info`` at its deadline; the retired producer's forced
    close fails the record later, and nobody is left to read that error."""
    reported: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        late: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        assert record_outcome(late) == RecordOutcome("info", None, "timeout")
        late.set_exception(_delivery("FORCE_CLOSED", -1, Outcome.INFO))
        await asyncio.sleep(0)  # the done callbacks run
        del late
        gc.collect()

    asyncio.run(scenario())
    assert reported == []


def test_send_outcome() -> None:
    ok, fail = RecordOutcome("ok", 1), RecordOutcome("fail", error="not-enough-replicas")
    info = RecordOutcome("info", error="request-timed-out")
    assert send_outcome([ok, ok]) == ("ok", None)
    assert send_outcome([fail, fail]) == ("fail", "not-enough-replicas")
    # Part written, part refused: the op as a whole is unknown.
    assert send_outcome([ok, fail]) == ("info", "not-enough-replicas")
    assert send_outcome([fail, info]) == ("info", "not-enough-replicas")
    assert send_outcome([ok, info]) == ("info", "request-timed-out")


# -- the workload against an in-memory broker ------------------------------------------


@dataclass(frozen=True)
class _Rec:
    topic: str
    partition: int
    offset: int
    value: bytes


class _Broker:
    """Partitions as lists; ``refuse``: a partition whose appends fail
    definitely; ``unknown``: whose appends land but answer info."""

    def __init__(self) -> None:
        self.logs: dict[tuple[str, int], list[bytes]] = {}
        self.refuse: set[tuple[str, int]] = set()
        self.unknown: set[tuple[str, int]] = set()
        self.log_start: dict[tuple[str, int], int] = {}
        # The record key of each value sent.
        self.record_keys: dict[bytes, bytes | None] = {}


class _Producer:
    def __init__(self, broker: _Broker) -> None:
        self.broker = broker

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        assert partition is not None and value is not None
        tp = (topic, partition)
        f: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if tp in self.broker.refuse:
            f.set_exception(_delivery("NOT_ENOUGH_REPLICAS", 19, Outcome.FAIL))
            return f
        log = self.broker.logs.setdefault(tp, [])
        log.append(value)
        self.broker.record_keys[value] = key
        if tp in self.broker.unknown:
            f.set_exception(_delivery("REQUEST_TIMED_OUT", 7, Outcome.INFO))
        else:
            f.set_result(RecordMetadata(topic, partition, len(log) - 1, 0))
        return f

    async def close(self, timeout_s: float | None = None) -> None:
        return None


class _Consumer:
    def __init__(self, broker: _Broker) -> None:
        self.broker = broker
        self.positions: dict[tuple[str, int], int] = {}

    def assign(self, partitions: Any) -> None:
        self.positions = {tp: self.positions.get(tp, 0) for tp in partitions}

    def seek_to_beginning(self, partitions: Any = None) -> None:
        for tp in partitions:
            self.positions[tp] = self.broker.log_start.get(tp, 0)

    async def poll(self, timeout_ms: int = 1_000, max_records: int | None = None) -> list[Any]:
        out = []
        for tp, at in self.positions.items():
            pos = max(at, self.broker.log_start.get(tp, 0))
            log = self.broker.logs.get(tp, [])
            out += [_Rec(tp[0], tp[1], o, log[o]) for o in range(pos, min(len(log), pos + 3))]
            self.positions[tp] = min(len(log), pos + 3)
        await asyncio.sleep(0)
        return out

    def log_start_offset(self, partition: Any) -> int:
        return self.broker.log_start.get((partition[0], partition[1]), 0)

    async def close(self, timeout_ms: int = 30_000, *, leave_group: bool = True) -> None:
        return None


def _workload(
    tmp_path: Path, broker: _Broker, **kwargs: Any
) -> tuple[QueueWorkload, HistoryWriter]:
    writer = HistoryWriter(tmp_path / "history.jsonl")
    w = QueueWorkload(
        writer,
        lambda: _Producer(broker),
        lambda: _Consumer(broker),
        random.Random(3),
        KeyMap((("queue", 3),)),
        concurrency=3,
        rate=400,
        final_time_s=5,
        final_round_s=1,
        **kwargs,
    )
    return w, writer


def _history(tmp_path: Path) -> list[Op]:
    return read_history(tmp_path / "history.jsonl")


def test_a_run_is_well_formed_and_the_final_polls_find_every_acknowledged_record(
    tmp_path: Path,
) -> None:
    broker = _Broker()
    broker.refuse.add(("queue", 1))
    w, writer = _workload(tmp_path, broker)

    async def main() -> Any:
        await w.prepare()
        await w.run(60, op_limit=400)  # a count, not a time: load makes fewer
        verdict = await w.final()
        await w.close()
        return verdict

    verdict = asyncio.run(main())
    writer.close()
    ops = _history(tmp_path)
    assert check_well_formed(ops, model="queue") == []
    fs = {op.f for op in ops}
    assert fs == {"send", "poll", "assign", "crash"}
    assert any(op.f == "send" and op.type == "fail" for op in ops)  # key 1 refuses
    assert verdict.ok, verdict
    final = verdict.check["final_polls"]
    assert final["complete"] and final["from_index"] > 0
    # The final phase: each worker crashes, assigns every key from the start, polls.
    tail = [op for op in ops if op.index >= final["from_index"] and op.type != "invoke"]
    assert {op.f for op in tail} == {"crash", "assign", "poll"}
    assert all(
        op.value == {"keys": [0, 1, 2], "seek_to_beginning": True}
        for op in tail
        if op.f == "assign"
    )
    assert verdict.check["lost"] == verdict.check["moved"] == []


def test_an_info_send_retires_its_process(tmp_path: Path) -> None:
    broker = _Broker()
    broker.unknown.add(("queue", 0))
    w, writer = _workload(tmp_path, broker)

    async def main() -> None:
        await w.prepare()
        worker = w._workers[0]
        op = await w.send(worker, [(0, 100)])
        assert op.type == "info" and op.error == "request-timed-out"
        assert op.value == [["send", 0, [None, 100]]]
        assert worker.process == 3 and worker.assigned == []
        op = await w.send(worker, [(2, 101), (0, 102)])
        assert op.type == "info" and op.value == [["send", 2, [0, 101]], ["send", 0, [None, 102]]]

    asyncio.run(main())
    writer.close()
    assert check_well_formed(_history(tmp_path), model="queue") == []


def test_record_keys_recur_while_values_stay_unique(tmp_path: Path) -> None:
    broker = _Broker()
    w, writer = _workload(tmp_path, broker, record_keys=2)

    async def main() -> None:
        await w.prepare()
        await w.run(60, op_limit=200)
        await w.close()

    asyncio.run(main())
    writer.close()
    ops = _history(tmp_path)
    assert check_well_formed(ops, model="queue") == []
    sent = broker.record_keys
    assert len(sent) > 4
    # Each value names its send; its record key is value mod 2.
    assert all(key == str(int(value) % 2).encode() for value, key in sent.items())
    assert set(sent.values()) == {b"0", b"1"}


def test_the_final_polls_keep_the_highest_log_start_and_let_retention_remove_records(
    tmp_path: Path,
) -> None:
    broker = _Broker()
    w, writer = _workload(tmp_path, broker, retains=True)

    async def main() -> Any:
        await w.prepare()
        worker = w._workers[0]
        for v in range(4):
            await w.send(worker, [(0, v)])
        # Retention removed offsets 0 and 1 of key 0 before the final polls.
        log = broker.logs[("queue", 0)]
        broker.log_start[("queue", 0)] = 2
        log[0] = log[1] = b"removed"
        verdict = await w.final()
        await w.close()
        return verdict

    verdict = asyncio.run(main())
    writer.close()
    final = verdict.check["final_polls"]
    assert final["log_start"] == {"0": 2, "1": 0, "2": 0}
    assert verdict.check["lost"] == [] and verdict.check["moved"] == []
    # Without retention the same records count as moved (another value there).
    ops = _history(tmp_path)
    plain = check_final_polls(ops, final["from_index"])
    assert [m["value"] for m in plain["moved"] + plain["lost"]] == [0, 1]
    below = check_final_polls(ops, final["from_index"], Cleanup({"0": 1}))
    assert [m["value"] for m in below["moved"] + below["lost"]] == [1]


@pytest.mark.parametrize("retains", [True, False])
def test_final_polls_end_when_retention_removed_every_record(tmp_path: Path, retains: bool) -> None:
    broker = _Broker()
    w, writer = _workload(tmp_path, broker, retains=retains)

    async def main() -> Any:
        await w.prepare()
        for v in range(3):
            await w.send(w._workers[0], [(1, v)])
        # Every segment was old enough: the whole log went.
        broker.log_start[("queue", 1)] = 3
        verdict = await w.final()
        await w.close()
        return verdict

    verdict = asyncio.run(main())
    writer.close()
    final = verdict.check["final_polls"]
    # Nothing is left to read up to offset 2: reached, with retention only.
    assert final["complete"] is retains and verdict.ok is retains
    assert final["missing"] == ({} if retains else {"1": 2})
    assert verdict.check["lost"] == (
        []
        if retains
        else [
            {"key": 1, "value": 0, "offset": 0},
            {"key": 1, "value": 1, "offset": 1},
            {"key": 1, "value": 2, "offset": 2},
        ]
    )


def _op(index: int, type_: OpType, f: str, value: Any, process: int = 0) -> Op:
    return Op(
        index,
        index,
        type_,
        process,
        f,
        value=value,
        error=None if type_ in ("invoke", "ok") else "x",
    )


def _final(index: int, records: dict[str, list[list[int]]]) -> list[Op]:
    return [
        _op(index, "invoke", "poll", [["poll"]], 9),
        _op(index + 1, "ok", "poll", [["poll", records]], 9),
    ]


def test_the_no_loss_check_fires_on_lost_moved_and_inconsistent_records() -> None:
    sends = [
        _op(0, "invoke", "send", [["send", 0, 1], ["send", 0, 2]]),
        _op(1, "ok", "send", [["send", 0, [0, 1]], ["send", 0, [1, 2]]]),
        _op(2, "invoke", "send", [["send", 1, 3]], 1),
        _op(3, "info", "send", [["send", 1, [None, 3]]], 1),
        _op(4, "invoke", "poll", [["poll"]], 2),
        _op(5, "ok", "poll", [["poll", {"1": [[0, 3]]}]], 2),
    ]
    clean = check_final_polls([*sends, *_final(6, {"0": [[0, 1], [1, 2]], "1": [[0, 3]]})], 6)
    assert clean == {"lost": [], "moved": [], "inconsistent": []}
    # The acknowledged value 2 is gone, and the info value 3 a poll saw too.
    lost = check_final_polls([*sends, *_final(6, {"0": [[0, 1]]})], 6)
    assert lost["lost"] == [
        {"key": 0, "value": 2, "offset": 1},
        {"key": 1, "value": 3, "offset": 0},
    ]
    moved = check_final_polls([*sends, *_final(6, {"0": [[0, 1], [2, 2]], "1": [[0, 3]]})], 6)
    assert moved["moved"] == [{"key": 0, "value": 2, "offset": 1, "found": 2}]
    two = [*sends, *_final(6, {"0": [[0, 1], [1, 2]], "1": [[0, 3]]}), *_final(8, {"0": [[1, 9]]})]
    assert check_final_polls(two, 6)["inconsistent"] == [{"key": 0, "offset": 1, "values": [2, 9]}]
    # An info send no poll saw may be lost: nothing to report.
    unseen = [s for s in sends if s.f != "poll"]
    assert check_final_polls([*unseen, *_final(6, {"0": [[0, 1], [1, 2]]})], 6)["lost"] == []


# -- the run config -------------------------------------------------------------------


def test_both_backends_take_the_queue_workload() -> None:
    RunConfig(backend="docker", workload="queue").check()
    RunConfig(backend="local", workload="queue").check()
    assert RunConfig(workload="register").brokers == 0
    assert RunConfig(workload="queue").brokers == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (QueueOptions(replication_factor=4), "needs at least as many brokers"),
        (QueueOptions(min_isr=4, brokers=4, replication_factor=3), "above the replication"),
        (QueueOptions(acks="2"), "acks must be one of"),
        (QueueOptions(partitions=0), "partitions must be at least 1"),
        (QueueOptions(replica_lag_ms=10), "replica_lag_ms must be in"),
        (QueueOptions(cleanup_policy="forever"), "cleanup_policy must be one of"),
        (QueueOptions(retention_ms=-2), "retention_ms must be -1"),
        (QueueOptions(retention_bytes=-5), "retention_bytes must be -1"),
        (QueueOptions(segment_bytes=10), "segment_bytes must be at least 14"),
        (QueueOptions(record_keys=-1), "record_keys must be 0 or more"),
    ],
)
def test_bad_queue_options_are_refused(options: QueueOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig(workload="queue", queue=options).check()


def test_the_topics_cleanup_options() -> None:
    plain = QueueOptions()
    assert plain.topic_configs() == {"min.insync.replicas": "2"}
    assert plain.topic_flags() == "" and not plain.compacts and not plain.retains
    retained = QueueOptions(retention_ms=2_000, segment_bytes=1_024)
    assert retained.topic_configs() == {
        "min.insync.replicas": "2",
        "retention.ms": "2000",
        "segment.bytes": "1024",
    }
    assert retained.retains and not retained.compacts
    assert retained.topic_flags() == " --retention-ms 2000 --segment-bytes 1024"
    # -1 is Kafka's no limit: nothing to let go.
    assert not QueueOptions(retention_ms=-1).retains
    compacted = QueueOptions(cleanup_policy="compact", retention_ms=10, record_keys=4)
    assert compacted.compacts and not compacted.retains
    assert compacted.topic_configs()["cleanup.policy"] == "compact"
    assert compacted.topic_flags() == " --cleanup-policy compact --retention-ms 10 --record-keys 4"
    both = QueueOptions(cleanup_policy="compact,delete", retention_bytes=0)
    assert both.compacts and both.retains
    assert compacted.to_json()["record_keys"] == 4 and plain.to_json()["retention_ms"] is None


def test_the_docker_backend_factory_makes_brokers_after_the_controllers(tmp_path: Path) -> None:
    from chaos.docker import DockerCluster
    from chaos.runner import BACKENDS

    cluster = BACKENDS["docker"].make(3, tmp_path, False, True, brokers=3)
    assert isinstance(cluster, DockerCluster)
    assert list(cluster.nodes) == [1, 2, 3, 4, 5, 6]
    assert (list(cluster.controllers), list(cluster.brokers)) == ([1, 2, 3], [4, 5, 6])
    with pytest.raises(ValueError, match="brokers must be in 0..20"):
        BACKENDS["docker"].make(3, tmp_path, False, True, brokers=21)


def test_faults_aimed_at_partitions_need_the_queue_workload() -> None:
    from chaos.runner import expand_nemesis

    kinds = expand_nemesis(["kill-partition-leader", "isolate-follower"], 6)
    assert kinds == ["isolate-follower", "kill-partition-leader"]
    with pytest.raises(ValueError, match="they need brokers"):
        RunConfig(workload="register", faults=tuple(kinds)).check()
    RunConfig(workload="queue", faults=tuple(kinds)).check()


def test_a_partition_fault_resolves_to_the_leader_it_finds_and_ends_on_it(tmp_path: Path) -> None:
    from chaos.nemesis import Action
    from chaos.runner import PartitionReplicas, _Nemesis

    class Backend:
        nodes = [1, 2, 3, 4, 5, 6]
        done: list[tuple[str, tuple[int, ...]]] = []

        async def kill(self, node: int) -> None:
            self.done.append(("kill", (node,)))

        async def restart(self, node: int) -> None:
            self.done.append(("start", (node,)))

        async def partition(self, groups: Any) -> None:
            self.done.append(("partition", tuple(len(g) for g in groups)))

    writer = HistoryWriter(tmp_path / "h.jsonl")
    nemesis = _Nemesis(Backend(), writer, lambda line: None)  # type: ignore[arg-type]

    async def replicas() -> list[PartitionReplicas]:
        return [PartitionReplicas("queue-0", 5, (5, 4, 6), (5, 4, 6))]

    nemesis.replicas = replicas

    async def main() -> None:
        kind = "kill-partition-leader"
        how, done = await nemesis.act(Action(0, "kill", kind=kind, target="partition-leader"))
        assert how == "ok" and done.nodes == (5,)
        how, done = await nemesis.act(Action(1, "start", kind=kind, target="partition-leader"))
        assert how == "ok" and done.nodes == (5,)
        how, done = await nemesis.act(
            Action(2, "partition", kind="isolate-follower", target="follower")
        )
        assert how == "ok" and done.groups in (((4,), (1, 2, 3, 5, 6)), ((6,), (1, 2, 3, 4, 5)))
        how, _ = await nemesis.act(Action(3, "start", kind=kind, target="partition-leader"))
        assert how == "skipped"  # nothing in force to end

    asyncio.run(main())
    writer.close()
    assert [d[0] for d in Backend.done] == ["kill", "start", "partition"]
    ops = read_history(tmp_path / "h.jsonl")
    assert [op.value for op in ops if op.type == "ok"][:2] == [
        {"nodes": [5], "kind": "kill-partition-leader"},
        {"nodes": [5], "kind": "kill-partition-leader"},
    ]


def test_partition_exports_skip_deleted_and_stray_directories(tmp_path: Path) -> None:
    from chaos.node_exports import partition_exports

    logs = tmp_path / "logs"
    for name in ("queue-0", "queue-1.abc-delete", "queue-2-stray"):
        (logs / name).mkdir(parents=True)
    (logs / "meta.properties").write_text("x")
    (logs / "queue-0" / "replication-offset-checkpoint").write_text("0\n")
    records, states = partition_exports(5, [logs, tmp_path / "missing"])
    assert records == []
    [state] = states
    assert (state["node"], state["topic"], state["partition"]) == (5, "queue", 0)
    assert state["log_end_offset"] == 0
    # A directory that is not a log is said, not hidden.
    assert "not a partition directory" in str(state["stopped_at"])


def test_client_failures_end_the_op_not_the_run(tmp_path: Path) -> None:
    class BadProducer(_Producer):
        async def send(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
            raise ValueError("no")

    class BadConsumer(_Consumer):
        async def poll(self, timeout_ms: int = 1_000, max_records: int | None = None) -> list[Any]:
            raise RuntimeError("a bug reading an answer")

    broker = _Broker()
    writer = HistoryWriter(tmp_path / "history.jsonl")
    w = QueueWorkload(
        writer,
        lambda: BadProducer(broker),
        lambda: BadConsumer(broker),
        random.Random(1),
        KeyMap((("queue", 1),)),
        concurrency=1,
    )

    async def main() -> None:
        await w.prepare()
        worker = w._workers[0]
        op = await w.send(worker, [(0, 1), (0, 2)])
        assert (op.type, op.error) == ("fail", "valueerror")
        await w.assign(worker, [0], True)
        op = await w.poll(worker)
        assert (op.type, op.error) == ("fail", "runtimeerror")

    asyncio.run(main())
    writer.close()
    assert check_well_formed(_history(tmp_path), model="queue") == []


def test_a_final_reader_pauses_after_a_failed_poll(tmp_path: Path) -> None:
    """A failed poll comes back at once (no leader, a broker down): the final
    readers wait a consumer's retry backoff before the next one, so a partition
    that stays unreadable costs tens of failed polls, not thousands."""

    class DownConsumer(_Consumer):
        async def poll(self, timeout_ms: int = 1_000, max_records: int | None = None) -> list[Any]:
            await asyncio.sleep(0)
            raise NoBrokerError("no leader for queue-0")

    broker = _Broker()
    final_s = 1.0
    w, writer = _workload(tmp_path, broker)
    w.open_consumer = lambda: DownConsumer(broker)
    w.final_time_s, w.final_round_s = final_s, 0.5

    async def main() -> dict[str, Any]:
        await w.prepare()
        await w.send(w._workers[0], [(0, 1)])
        final = await w.final_polls()
        await w.close()
        return final

    final = asyncio.run(main())
    writer.close()
    assert final["complete"] is False and final["missing"] == {"0": 0}
    ops = _history(tmp_path)
    failed = [op for op in ops if op.f == "poll" and op.type == "fail"]
    assert failed and {op.error for op in failed} == {"broker-not-available"}
    # Each reader polls at most once per backoff, plus once per round.
    bound = w.concurrency * (final_s / FINAL_POLL_BACKOFF_S + final["rounds"] + 1)
    assert len(failed) <= bound, (len(failed), bound)


def test_the_local_backend_counts_brokers_as_nodes_on_their_own_addresses(
    tmp_path: Path,
) -> None:
    from chaos.local import LocalCluster, node_dscp

    cluster = LocalCluster(tmp_path / "c", 3, brokers=2, network_faults=False)
    assert list(cluster.nodes) == [1, 2, 3, 4, 5]
    assert (list(cluster.controllers), list(cluster.brokers)) == ([1, 2, 3], [4, 5])
    assert [cluster.host(n) for n in cluster.nodes] == [
        "127.0.0.11",
        "127.0.0.12",
        "127.0.0.13",
        "127.0.1.4",
        "127.0.1.5",
    ]
    # Each marks its packets with its own DSCP value, so partitions cut by
    # (mark, address) pairs whatever the node is.
    assert len({node_dscp(n) for n in cluster.nodes}) == 5
    assert list(LocalCluster(tmp_path / "d", 3).nodes) == [1, 2, 3]
    with pytest.raises(ValueError, match="brokers must be in 0..20"):
        LocalCluster(tmp_path / "e", 3, brokers=21)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "queue", "--min-isr", "4"], "above the replication factor"),
        (["--workload", "queue", "--acks", "2"], "invalid choice"),
        (["--nemesis", "isolate-follower"], "they need brokers"),
        (["--workload", "queue", "--brokers", "0"], "must be at least 1"),
    ],
)
def test_queue_flags_refused_as_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from kq.cli import main

    code: object
    try:
        code = main(["chaos", "run", "--runs-dir", str(tmp_path), *args])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no run started


def test_a_queue_runs_replay_names_its_flags() -> None:
    from chaos.runner import _replay

    config = RunConfig(workload="queue", queue=QueueOptions(partitions=2, acks="1", min_isr=1))
    replay = _replay(config, 7)
    assert "--workload queue" in replay and "--seed 7" in replay
    assert "--partitions 2 " in replay and "--acks 1 " in replay and "--min-isr 1 " in replay
    assert "--brokers" not in _replay(RunConfig(), 7)
