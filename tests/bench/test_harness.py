"""The kq-versus-etcd benchmark harness (bench/harness.py) against a fake
in-memory Target: percentiles, the four workloads, reporting, and the etcd
interface description's field numbers.  Needs no etcd and no kq cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench import harness, vs_etcd
from bench.harness import Params, Target


class FakeTarget:
    """Three in-memory "members"; a write takes ``latency_s`` and commits only
    if a leader existed when it was sent.  Killing the leader leaves the
    cluster leaderless for ``election_s`` (forever if not ``recover``)."""

    name = "fake"

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        election_s: float = 0.05,
        recover: bool = True,
        fail_all: bool = False,
    ) -> None:
        self.latency_s = latency_s
        self.election_s = election_s
        self.recover = recover
        self.fail_all = fail_all
        self.store: dict[bytes, bytes] = {}
        self.requests = 0
        self.pids = [101, 102, 103]
        self.leader: int | None = 0
        self.killed: list[int] = []
        self.kills = 0
        self.restarts = 0
        self.closed = False

    async def _commit(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        self.requests += 1
        if self.fail_all or self.leader is None:
            raise ConnectionError("no leader")
        await asyncio.sleep(self.latency_s)
        self.store.update(items)

    async def put(self, key: bytes, value: bytes) -> None:
        await self._commit([(key, value)])

    async def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        await self._commit(items)

    async def leader_pid(self) -> int:
        if self.leader is None:
            raise ConnectionError("no leader")
        return self.pids[self.leader]

    def _elect(self) -> None:
        self.leader = next(i for i in range(3) if i not in self.killed)

    async def kill_leader(self) -> int:
        assert self.leader is not None, "killed while leaderless"
        killed = self.leader
        self.killed.append(killed)
        self.leader = None
        self.kills += 1
        if self.recover:
            asyncio.get_running_loop().call_later(self.election_s, self._elect)
        return self.pids[killed]

    async def restart_killed(self) -> None:
        for i in self.killed:
            self.pids[i] += 10  # a restarted member has a new pid
        self.killed.clear()
        self.restarts += 1
        if self.leader is None:
            self._elect()

    async def close(self) -> None:
        self.closed = True


def small_params(**changes: Any) -> Params:
    p = Params(
        value_size=16,
        request_timeout_s=2.0,
        max_errors=10,
        seq_writes=50,
        seq_max_s=5.0,
        conc_writers=4,
        conc_warmup_s=0.05,
        conc_duration_s=0.2,
        batch_records=10,
        batch_producers=2,
        batch_warmup_s=0.05,
        batch_duration_s=0.2,
        failover_trials=3,
        failover_load_writers=2,
        failover_probe_interval_s=0.005,
        failover_request_timeout_s=0.5,
        failover_settle_s=0.05,
        failover_max_wait_s=1.0,
        failover_max_total_s=30.0,
    )
    return dataclasses.replace(p, **changes)


# -- percentiles


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert harness.percentile(values, 0) == 1.0
    assert harness.percentile(values, 100) == 4.0
    assert harness.percentile(values, 50) == pytest.approx(2.5)
    assert harness.percentile(values, 99) == pytest.approx(3.97)
    assert harness.percentile(list(map(float, range(1, 101))), 50) == pytest.approx(50.5)
    assert harness.percentile([7.0], 99) == 7.0


def test_percentile_rejects_no_values_and_bad_q() -> None:
    with pytest.raises(ValueError):
        harness.percentile([], 50)
    for q in (-1.0, 100.5, math.nan):
        with pytest.raises(ValueError):
            harness.percentile([1.0], q)


def test_latency_summary_in_milliseconds() -> None:
    summary = harness.latency_summary([0.001, 0.002, 0.003])
    assert summary["p50_ms"] == pytest.approx(2.0)
    assert summary["min_ms"] == pytest.approx(1.0)
    assert summary["max_ms"] == pytest.approx(3.0)
    assert summary["mean_ms"] == pytest.approx(2.0)
    assert set(harness.latency_summary([]).values()) == {None}


# -- workloads


def test_fake_is_a_target() -> None:
    target: Target = FakeTarget()  # checked by mypy
    assert target.name == "fake"


def test_sequential_writes_one_at_a_time() -> None:
    target = FakeTarget()
    result = asyncio.run(harness.sequential(target, small_params()))
    assert result["writes"] == 50
    assert result["errors"] == 0
    assert len(target.store) == 50
    assert all(len(v) == 16 for v in target.store.values())
    assert result["commits_per_s"] > 0
    assert result["p50_ms"] <= result["p99_ms"]


def test_a_failed_write_is_counted_and_its_error_kept() -> None:
    class FlakyTarget(FakeTarget):
        async def put(self, key: bytes, value: bytes) -> None:
            if self.requests == 3:
                self.requests += 1
                raise ConnectionError("member 2 went away")
            await super().put(key, value)

    result = asyncio.run(harness.sequential(FlakyTarget(), small_params()))
    assert result["writes"] == 49 and result["errors"] == 1
    assert result["last_error"] == "ConnectionError: member 2 went away"
    shown = harness.format_table("flaky", {"sequential": result})
    assert "sequential: 1 failed writes (last: ConnectionError: member 2 went away)" in shown
    clean = asyncio.run(harness.sequential(FakeTarget(), small_params()))
    assert clean["errors"] == 0 and clean["last_error"] is None


def test_sequential_gives_up_after_too_many_errors() -> None:
    target = FakeTarget(fail_all=True)
    with pytest.raises(harness.TooManyErrors):
        asyncio.run(harness.sequential(target, small_params()))
    assert target.requests == 11


def test_concurrent_counts_only_the_measurement_window() -> None:
    target = FakeTarget(latency_s=0.002)
    p = small_params()
    result = asyncio.run(harness.concurrent(target, p))
    assert result["writers"] == 4
    assert result["errors"] == 0
    # Warm-up writes and writes cut by the end of the window are committed
    # but not counted.
    assert 0 < result["writes"] < target.requests
    assert result["commits_per_s"] == pytest.approx(result["writes"] / p.conc_duration_s)
    assert result["p50_ms"] >= 2.0
    keys = {k.split(b"/")[2] for k in target.store}
    assert keys == {b"0", b"1", b"2", b"3"}


def test_batched_counts_records() -> None:
    target = FakeTarget(latency_s=0.002)
    result = asyncio.run(harness.batched(target, small_params()))
    assert result["records_per_batch"] == 10
    assert result["records"] == 10 * result["batches"]
    assert result["records"] > 0
    assert result["records_per_s"] == pytest.approx(result["records"] / 0.2)


def test_failover_times_kill_to_first_commit_sent_after_it() -> None:
    # Writes in flight at the kill still commit 20 ms later: they must not
    # count as the recovery.
    target = FakeTarget(latency_s=0.02, election_s=0.15)
    result = asyncio.run(harness.failover(target, small_params()))
    assert result["trials"] == 3
    assert result["recovered"] == 3
    assert result["failed"] == 0
    assert target.kills == 3
    assert target.restarts == 3
    for trial in result["trial_results"]:
        assert trial["recovered"]
        assert 0.15 <= trial["recovery_s"] < 0.15 + 0.02 + 0.2
        assert trial["load_writes_before_kill"] > 0
        assert trial["new_leader_pid"] != trial["killed_pid"]
    assert 150 <= result["p50_ms"] <= result["p99_ms"] < 400


def test_failover_without_recovery_is_a_failed_trial_and_bounded() -> None:
    target = FakeTarget(recover=False)
    p = small_params(failover_trials=2, failover_max_wait_s=0.2)
    result = asyncio.run(asyncio.wait_for(harness.failover(target, p), 10.0))
    assert result["trials"] == 2
    assert result["failed"] == 2
    assert result["p50_ms"] is None
    assert target.restarts == 2


def test_run_all_and_reports() -> None:
    target = FakeTarget()
    result = asyncio.run(harness.run_all(target, small_params(failover_trials=1)))
    assert set(result) == {"sequential", "concurrent", "batched", "failover"}
    table = harness.format_table("fake", result)
    assert "sequential commits/s" in table and "failover p99 ms" in table
    plain = [harness.Security.PLAINTEXT]
    one_round = {"etcd": {"plaintext": result}, "kq": {"plaintext": result}}
    doc = harness.result_document([one_round], small_params(), "test", plain)
    ratios = doc["rounds"][0]["ratios_kq_over_etcd"]["plaintext"]
    assert ratios["sequential commits/s"] == pytest.approx(1.0)
    assert "kq/etcd" in harness.format_ratios(ratios)
    alone = harness.result_document([{"etcd": {"plaintext": result}}], small_params(), "x", plain)
    assert "ratios_kq_over_etcd" not in alone["rounds"][0]


def test_ratios_tolerate_missing_figures() -> None:
    kq = {"sequential": {"commits_per_s": 300.0, "p50_ms": None}}
    etcd = {"sequential": {"commits_per_s": 100.0, "p50_ms": 1.0}}
    r = harness.ratios(kq, etcd)
    assert r["sequential commits/s"] == pytest.approx(3.0)
    assert r["sequential p50 ms"] is None
    assert r["batched records/s"] is None


def test_fsync_probe(tmp_path: Path) -> None:
    summary = harness.fsync_probe(tmp_path, count=5)
    assert summary["p50_ms"] is not None and summary["p50_ms"] >= 0
    assert list(tmp_path.iterdir()) == []


# -- the CLI's registry


def test_missing_system_module_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(vs_etcd.SYSTEMS, "kq", "bench.cluster_not_there")
    with pytest.raises(vs_etcd.SystemUnavailable, match="kq target not available yet"):
        vs_etcd.load_system("kq")
    assert vs_etcd.main(["--systems", "kq"]) == 2
    with pytest.raises(vs_etcd.SystemUnavailable, match="unknown system"):
        vs_etcd.load_system("zookeeper")


# -- the etcd interface description


def test_etcd_proto_has_etcds_field_numbers() -> None:
    pb2, pb2_grpc = harness.load_proto(harness.BENCH_DIR / "etcd" / "etcd_kv.proto")

    def number(message: str, field: str) -> int:
        return int(pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].number)

    assert pb2.DESCRIPTOR.package == "etcdserverpb"
    assert number("PutRequest", "key") == 1 and number("PutRequest", "value") == 2
    assert number("RangeRequest", "serializable") == 7
    assert number("Compare", "range_end") == 64
    assert number("RequestOp", "request_put") == 2
    assert number("TxnResponse", "responses") == 3
    assert number("StatusResponse", "leader") == 4
    assert number("StatusResponse", "raftAppliedIndex") == 7
    assert number("ResponseHeader", "member_id") == 2
    services = pb2.DESCRIPTOR.services_by_name
    assert set(services["KV"].methods_by_name) == {"Range", "Put", "Txn"}
    assert set(services["Maintenance"].methods_by_name) == {"Status"}
    assert hasattr(pb2_grpc, "KVStub") and hasattr(pb2_grpc, "MaintenanceStub")


def test_first_success_returns_with_the_first_success_and_cancels_the_rest() -> None:
    cancelled: list[str] = []

    async def fails() -> None:
        raise RuntimeError("refused")

    async def succeeds() -> None:
        await asyncio.sleep(0.01)

    async def hangs() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append("hangs")
            raise

    async def scenario() -> None:
        await harness.first_success([fails(), succeeds(), hangs()], "none")
        await asyncio.sleep(0)
        assert cancelled == ["hangs"]
        with pytest.raises(RuntimeError, match="no member committed"):
            await harness.first_success([fails(), fails()], "no member committed")

    asyncio.run(asyncio.wait_for(scenario(), 10))
