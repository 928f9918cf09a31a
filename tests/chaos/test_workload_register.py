"""The register workload against a real in-process 3-node quorum, and its
recording rules against scripted clients."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from chaos.workloads.register import (
    CONFIG_REGISTER_KEYS,
    Completion,
    ConfigRegisterClient,
    KvRegisterClient,
    RegisterWorkload,
    config_value,
)
from history.files import HistoryRecorder, HistoryWriter, Op, check_well_formed, read_history
from tests.driver.cluster_util import run, running
from tests.metadata.metadata_cluster import running_metadata


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 1000
        return self.now


def memory_recorder() -> tuple[HistoryRecorder, list[Op]]:
    ops: list[Op] = []
    return HistoryRecorder(Clock(), ops.append), ops


class Scripted:
    """A RegisterClient that answers from a list of completions."""

    def __init__(self, answers: list[Completion], delay_s: float = 0.0) -> None:
        self.answers = answers
        self.delay_s = delay_s
        self.closed = False

    async def _next(self) -> Completion:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self.answers.pop(0)

    async def read(self, key: str) -> Completion:
        return await self._next()

    async def write(self, key: str, value: str) -> Completion:
        return await self._next()

    async def cas(self, key: str, expected: str | None, new: str) -> Completion:
        return await self._next()

    async def close(self) -> None:
        self.closed = True


# -- recording rules (no cluster) ---------------------------------------------


def test_info_retires_the_process_and_opens_a_new_client() -> None:
    async def go() -> None:
        rec, ops = memory_recorder()
        clients = [
            Scripted([Completion("info", "indeterminate")]),  # lane 0
            Scripted([]),  # lane 1
            Scripted([]),  # lane 2
            Scripted([Completion("ok", offset=4, epoch=1), Completion("fail", "timeout")]),
        ]
        it = iter(clients)
        wl = RegisterWorkload(rec, lambda: next(it), random.Random(1), concurrency=3)
        await wl.execute(0, "write", "k", "v0-1")
        assert clients[0].closed
        assert wl.processes[0] == 3
        done = await wl.execute(0, "write", "k", "v3-1")
        assert (done.type, done.process, done.offset, done.epoch) == ("ok", 3, 4, 1)
        read = await wl.execute(0, "read", "k")
        assert (read.type, read.error, read.value) == ("fail", "timeout", None)
        assert [(o.type, o.process) for o in ops] == [
            ("invoke", 0),
            ("info", 0),
            ("invoke", 3),
            ("ok", 3),
            ("invoke", 3),
            ("fail", 3),
        ]
        assert check_well_formed(ops, model="register") == []

    asyncio.run(go())


def test_an_op_the_client_does_not_answer_in_time() -> None:
    async def go() -> None:
        rec, ops = memory_recorder()
        wl = RegisterWorkload(
            rec,
            lambda: Scripted([Completion("ok")] * 5, delay_s=1.0),
            random.Random(1),
            concurrency=1,
            op_timeout_s=0.05,
        )
        read = await wl.execute(0, "read", "k")
        assert (read.type, read.error) == ("fail", "timeout")
        cas = await wl.execute(0, "cas", "k", [None, "v0-1"])
        assert (cas.type, cas.error, cas.value) == ("info", "timeout", [None, "v0-1"])
        assert wl.processes == [1]
        assert check_well_formed(ops, model="register") == []

    asyncio.run(go())


def test_cancelled_ops_stay_in_flight_for_the_recorder_to_close() -> None:
    async def go() -> None:
        rec, ops = memory_recorder()
        wl = RegisterWorkload(
            rec,
            lambda: Scripted([Completion("ok", offset=1, epoch=1)] * 50, delay_s=10.0),
            random.Random(2),
            concurrency=2,
            rate=1000,
        )
        task = asyncio.create_task(wl.run(30))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(rec.in_flight()) == 2
        rec.close_open()
        assert {o.error for o in ops if o.type == "info"} == {"run-ended"}
        assert check_well_formed(ops, model="register") == []

    asyncio.run(go())


def test_bad_arguments() -> None:
    rec, _ = memory_recorder()
    with pytest.raises(ValueError):
        RegisterWorkload(rec, lambda: Scripted([]), random.Random(), concurrency=0)
    with pytest.raises(ValueError):
        RegisterWorkload(rec, lambda: Scripted([]), random.Random(), keys=["a", "a"])
    with pytest.raises(ValueError):
        RegisterWorkload(rec, lambda: Scripted([]), random.Random(), weights={"delete": 1})


# -- a real quorum -------------------------------------------------------------


def _check(ops: list[Op]) -> None:
    assert check_well_formed(ops, model="register") == []
    for op in ops:
        if op.type == "ok" and (op.f != "read" or op.value is not None):
            assert op.offset is not None and op.epoch is not None, op


def test_register_workload_on_a_quorum(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path / "c") as cluster:
            await cluster.wait_leader()
            with HistoryWriter(tmp_path / "history.jsonl") as writer:
                wl = RegisterWorkload(
                    writer,
                    lambda: KvRegisterClient(cluster.voters, timeout_s=1.0),
                    random.Random(7),
                    concurrency=4,
                    keys=["k0", "k1"],
                    rate=150,
                    op_timeout_s=2.0,
                )
                stats = await wl.run(2.0)
                # A cas refused because the value differs: fail/precondition.
                await wl.execute(0, "write", "k0", "v-fixed")
                refused = await wl.execute(0, "cas", "k0", ["v-not-there", "v-never"])
                assert (refused.type, refused.error) == ("fail", "precondition")
                assert refused.offset is not None and refused.epoch is not None
                finals = await wl.final_reads()
                await wl.close()
            assert [o.key for o in finals] == ["k0", "k1"]
            assert all(o.type == "ok" for o in finals)
            ops = read_history(tmp_path / "history.jsonl")
            _check(ops)
            kinds = Counter((o.f, o.type) for o in ops)
            for f in ("read", "write", "cas"):
                assert kinds[(f, "ok")] > 0, kinds
            assert stats.invokes > 50
            assert all(o.node in cluster.voters for o in ops if o.type == "ok")

    run(go())


@pytest.mark.slow
def test_register_workload_survives_a_leader_stop(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path / "c") as cluster:
            leader = await cluster.wait_leader()
            with HistoryWriter(tmp_path / "history.jsonl") as writer:
                wl = RegisterWorkload(
                    writer,
                    lambda: KvRegisterClient(cluster.voters, timeout_s=1.0),
                    random.Random(11),
                    concurrency=5,
                    keys=["k0", "k1", "k2"],
                    rate=200,
                    weights={"read": 1, "write": 2, "cas": 2},
                    op_timeout_s=2.0,
                )
                main = asyncio.create_task(wl.run(3.0))
                await asyncio.sleep(0.8)
                # Stop the leader while writes are in flight to it.
                await cluster.wait_for(
                    lambda: sum(o.f != "read" for o in writer.in_flight().values()) >= 2
                )
                await cluster.stop(leader.config.node_id, resign=False)
                await main
                await wl.final_reads()
                await wl.close()
            ops = read_history(tmp_path / "history.jsonl")
            _check(ops)
            assert any(o.type in ("info", "fail") for o in ops)
            processes = {o.process for o in ops}
            assert any(isinstance(p, int) and p >= 5 for p in processes), processes
            assert wl.stats.retired > 0

    run(go())


def test_register_workload_on_the_metadata_controllers_configs(tmp_path: Path) -> None:
    """The registers are cluster configs, written by conditional AlterConfigs
    and read by linearizable DescribeConfigs."""

    async def go() -> None:
        async with running_metadata(tmp_path / "c") as cluster:
            await cluster.wait_leader()
            keys = list(CONFIG_REGISTER_KEYS[:3])
            with HistoryWriter(tmp_path / "history.jsonl") as writer:
                wl = RegisterWorkload(
                    writer,
                    lambda: ConfigRegisterClient(cluster.voters, timeout_s=1.0),
                    random.Random(3),
                    concurrency=4,
                    keys=keys,
                    rate=150,
                    op_timeout_s=2.0,
                    make_value=config_value,
                )
                stats = await wl.run(2.0)
                written = await wl.execute(0, "write", keys[0], config_value(0, 999_999))
                assert written.type == "ok" and written.offset is not None
                read = await wl.execute(1, "read", keys[0])
                assert (read.type, read.value) == ("ok", config_value(0, 999_999))
                # A refused condition is a definite fail that wrote nothing.
                refused = await wl.execute(0, "cas", keys[0], ["1", config_value(0, 999_998)])
                assert (refused.type, refused.error) == ("fail", "precondition")
                assert refused.offset is None
                swapped = await wl.execute(
                    2, "cas", keys[0], [config_value(0, 999_999), config_value(2, 999_999)]
                )
                assert swapped.type == "ok"
                assert swapped.offset is not None and swapped.offset > written.offset
                finals = await wl.final_reads()
                await wl.close()
            assert [o.key for o in finals] == keys and all(o.type == "ok" for o in finals)
            ops = read_history(tmp_path / "history.jsonl")
            assert check_well_formed(ops, model="register") == []
            kinds = Counter((o.f, o.type) for o in ops)
            for f in ("read", "write", "cas"):
                assert kinds[(f, "ok")] > 0, kinds
            assert stats.invokes > 50
            writes = [o for o in ops if o.type == "ok" and o.f in ("write", "cas")]
            # Every acknowledged write says where it committed, and no two
            # share a record.
            assert all(o.offset is not None and o.epoch is not None for o in writes)
            assert len({o.offset for o in writes}) == len(writes)

    run(go())


def test_config_values_are_unique_longs() -> None:
    values = {config_value(p, n) for p in (0, 1, 7, 12) for n in (1, 2, 999_999)}
    assert len(values) == 12 and all(v.isdigit() for v in values)
    with pytest.raises(ValueError, match="millionth"):
        config_value(0, 1_000_000)
