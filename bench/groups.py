"""The consumer groups' benchmark: rebalance time, commit latency and
coordinator failover, on a local cluster of 3 controllers and 3 brokers
(``kq cluster up``, mutual TLS, the admin's certificate; the cluster, the
presets' shape, the arguments and the output are ``bench/brokers.py``'s),
driven by kq's gRPC client library. The brokers run with
``group.session_timeout_ms`` and ``group.heartbeat_interval_ms`` of the
preset (6 s and 500 ms: Kafka's defaults, 45 s and 5 s, would make the
vanished member's figure mostly waiting), set at ``kq cluster up``; every
topic has replication factor 3 and ``min.insync.replicas`` 2.

* ``rebalance``: a group of ``members`` consumers in this process (auto-commit
  off), each subscribed to one topic of ``partitions`` partitions and polling
  all the time. The time from an event to every partition of the topic being
  owned by exactly one of the members present, the members' shares differing
  by at most one (the uniform assignor's balance), read from each consumer's
  ``assignment()`` every 5 ms: *join* (one more consumer subscribes),
  *leave* (the oldest member closes: a graceful leave), *vanish* (a member in
  a process of its own, ``bench/broker_load.py member``, is SIGKILLed: the
  coordinator frees its partitions once its session expires).
* ``commit``: sequential ``await consumer.commit({tp: offset})`` (the
  coordinator answers once the offsets partition's high watermark passes
  the record: acks=all, min ISR 2), beside the same run's peer, taking turns
  a slice at a time so both see the same load: a sequential acks=all
  idempotent produce to a topic of replication factor 3 of one record whose
  key and value have the sizes of the commit's record's key and value (the
  coordinator's own encoding of that OffsetCommit record,
  ``broker.group.codec``).
* ``failover``: a member commits; its group's coordinator (FindCoordinator)
  is SIGKILLed; the time from the kill to the first commit answered OK, the
  commit retried in a loop as a user's would (necessarily answered by the
  new coordinator: only the offsets partition's leader answers OK); the
  broker is restarted and every offsets partition is back to a full ISR
  before the next trial. Peer, in the same run: ``bench/brokers.py``'s
  partition-leader failover (the first acknowledged produce after its
  leader's SIGKILL). Both wait for the controller to fence the dead broker
  (``controller.broker_session_timeout_ms``).

```sh
.venv/bin/python bench/groups.py --preset full [--only rebalance,commit] [--json]
.venv/bin/python bench/groups.py --preset small   # about a minute
```
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import brokers as bench
from bench.brokers import Cluster, _ms, fully_replicated, now
from bench.harness import latency_summary, make_value, percentile
from broker.client.producer_batch import Acks, TopicPartition
from broker.errors import Errors
from broker.group.codec import encode_key, encode_value
from broker.group.placement import OFFSETS_TOPIC
from broker.group.records import OffsetCommitKey, OffsetCommitValue
from broker.grpc_client.consumer import Consumer
from broker.grpc_client.errors import BrokerClientError
from broker.grpc_client.group_admin import GroupAdmin
from kqproto import groups_pb2

SECTIONS = ("rebalance", "commit", "failover")
# How often the members' assignments are read while a rebalance runs.
WATCH_S = 0.005


@dataclass(frozen=True)
class Preset:
    members: int  # the group's size before a join and after a leave
    partitions: int  # of the one topic they subscribe to
    rebalance_trials: int  # joins, and as many leaves
    vanish_trials: int
    commits: int  # per series
    commit_slices: int  # the two series take turns this many times
    failover_trials: int  # coordinator failovers, and as many leader failovers
    group_session_timeout_ms: int  # the brokers' group.session_timeout_ms
    heartbeat_interval_ms: int  # the brokers' group.heartbeat_interval_ms
    # The controllers' broker.session.timeout.ms: how long a killed broker
    # leads its partitions (coordinates its groups) before it is fenced.
    session_timeout_ms: int


PRESETS = {
    "small": Preset(
        members=10,
        partitions=20,
        rebalance_trials=2,
        vanish_trials=1,
        commits=40,
        commit_slices=2,
        failover_trials=2,
        group_session_timeout_ms=6_000,
        heartbeat_interval_ms=500,
        session_timeout_ms=3_000,
    ),
    "full": Preset(
        members=10,
        partitions=20,
        rebalance_trials=20,
        vanish_trials=5,
        commits=2_000,
        commit_slices=10,
        failover_trials=20,
        group_session_timeout_ms=6_000,
        heartbeat_interval_ms=500,
        # Kafka's default, as bench/brokers.py's full preset.
        session_timeout_ms=9_000,
    ),
}


def broker_settings(preset: Preset) -> dict[str, object]:
    return {
        "group.session_timeout_ms": preset.group_session_timeout_ms,
        "group.heartbeat_interval_ms": preset.heartbeat_interval_ms,
    }


def settled(
    owned: Sequence[Iterable[TopicPartition]], everything: frozenset[TopicPartition]
) -> bool:
    """Every partition of ``everything`` owned by exactly one of the members
    whose assignments are ``owned``, nothing else owned, and the members'
    shares within one of each other (as the uniform assignor balances a
    single topic)."""
    sizes = []
    seen: set[TopicPartition] = set()
    for assignment in owned:
        parts = set(assignment)
        if parts & seen or not parts <= everything:
            return False
        seen |= parts
        sizes.append(len(parts))
    return seen == everything and bool(sizes) and max(sizes) - min(sizes) <= 1


def _trials(seconds: Sequence[float]) -> dict[str, Any]:
    return {
        "trials": len(seconds),
        "p50_ms": percentile(seconds, 50) * 1e3 if seconds else None,
        "p99_ms": percentile(seconds, 99) * 1e3 if seconds else None,
        "max_ms": max(seconds) * 1e3 if seconds else None,
        "per_trial_ms": [round(s * 1e3, 1) for s in seconds],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


# --------------------------------------------------------------------------
# Members


class Member:
    """A consumer of the group in this process, polling until stopped."""

    def __init__(
        self, cluster: Cluster, group: str, topic: str, request_timeout_ms: int = 30_000
    ) -> None:
        self.consumer = Consumer(
            cluster.brokers,
            credentials=cluster.credentials(),
            group_id=group,
            enable_auto_commit=False,
            request_timeout_ms=request_timeout_ms,
        )
        self.consumer.subscribe([topic])
        self._stop = asyncio.Event()
        self._task = asyncio.ensure_future(self._polls())

    async def _polls(self) -> None:
        while not self._stop.is_set():
            await self.consumer.poll(timeout_ms=100)

    def check(self) -> None:
        """Raise what ended the member's polling, if anything did."""
        if self._task.done() and not self._task.cancelled():
            error = self._task.exception()
            if error is not None:
                raise RuntimeError(f"a member's poll failed: {error!r}") from error

    def assignment(self) -> frozenset[TopicPartition]:
        return self.consumer.assignment()

    async def stop_polling(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            await self._task

    async def close(self) -> None:
        await self.stop_polling()
        await self.consumer.close(timeout_ms=10_000)


class MemberProcess:
    """A member in a process of its own (``bench/broker_load.py member``),
    its assignment as it last printed it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.owned: frozenset[int] | None = None
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, cluster: Cluster, group: str, topic: str) -> MemberProcess:
        proc = await asyncio.create_subprocess_exec(
            *bench.load_command("member", "--cluster-dir", str(cluster.dir),
                                "--group", group, "--topic", topic),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            with contextlib.suppress(ValueError, KeyError):
                self.owned = frozenset(json.loads(line)["assigned"])

    def check(self) -> None:
        if self.proc.returncode is not None:
            raise RuntimeError(f"the member process exited ({self.proc.returncode})")

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


async def wait_settled(
    members: Sequence[Member],
    everything: frozenset[TopicPartition],
    timeout_s: float,
    outside: MemberProcess | None = None,
) -> float:
    """The instant the members' (and ``outside``'s) assignments are
    :func:`settled`."""
    deadline = now() + timeout_s
    topic = next(iter(everything)).topic
    while True:
        owned: list[Iterable[TopicPartition]] = [m.assignment() for m in members]
        if outside is not None:
            outside.check()
            owned.append({TopicPartition(topic, p) for p in outside.owned or ()})
        if settled(owned, everything):
            return now()
        for m in members:
            m.check()
        if now() > deadline:
            sizes = sorted(len(o) for o in map(set, owned))
            raise RuntimeError(
                f"the group's assignment did not settle within {timeout_s} s (shares {sizes})"
            )
        await asyncio.sleep(WATCH_S)


# --------------------------------------------------------------------------
# Rebalance time


async def rebalance(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    topic, group = "bench-groups-rebalance", "bench-rebalance"
    await cluster.create_topic(topic, preset.partitions)
    await cluster.wait_topics([topic], 60, fully_replicated)
    everything = frozenset(TopicPartition(topic, p) for p in range(preset.partitions))
    members: list[Member] = []
    joins: list[float] = []
    leaves: list[float] = []
    vanishes: list[float] = []
    try:
        members.extend(Member(cluster, group, topic) for _ in range(preset.members))
        await wait_settled(members, everything, 120)
        for _ in range(preset.rebalance_trials):
            t0 = now()
            members.append(Member(cluster, group, topic))
            joins.append(await wait_settled(members, everything, 120) - t0)
            # The oldest leaves: its poll returns first, then it closes, as
            # a user's loop would (the consumer is used by one task).
            leaving = members.pop(0)
            await leaving.stop_polling()
            t0 = now()
            closing = asyncio.ensure_future(leaving.consumer.close(timeout_ms=10_000))
            leaves.append(await wait_settled(members, everything, 120) - t0)
            await closing
        for _ in range(preset.vanish_trials):
            other = await MemberProcess.start(cluster, group, topic)
            try:
                await wait_settled(members, everything, 120, outside=other)
                await other.kill()
                t0 = now()
                vanishes.append(await wait_settled(members, everything, 120) - t0)
            finally:
                await other.kill()
    finally:
        await asyncio.gather(*(m.close() for m in members), return_exceptions=True)
    return {
        "members": preset.members,
        "partitions": preset.partitions,
        "group_session_timeout_ms": preset.group_session_timeout_ms,
        "heartbeat_interval_ms": preset.heartbeat_interval_ms,
        "watch_ms": WATCH_S * 1e3,
        "join": _trials(joins),
        "leave": _trials(leaves),
        "vanish": _trials(vanishes),
    }


# --------------------------------------------------------------------------
# Commit latency, beside an acks=all produce of the same size


def commit_record_sizes(group: str, tp: TopicPartition, offset: int) -> tuple[int, int]:
    """The key and value sizes of the record a commit of ``offset`` for
    ``tp`` writes to the offsets topic (no metadata, as the benchmark's
    commits; the commit time is an int64 whatever its value)."""
    key = encode_key(OffsetCommitKey(group, tp.topic, tp.partition))
    value = encode_value(OffsetCommitValue(offset, -1, "", 0))
    return len(key), len(value)


async def wait_assigned(
    member: Member, wanted: frozenset[TopicPartition], timeout_s: float
) -> None:
    deadline = now() + timeout_s
    while member.assignment() != wanted:
        member.check()
        if now() > deadline:
            raise RuntimeError(f"the member was not assigned {sorted(wanted)} in {timeout_s} s")
        await asyncio.sleep(0.05)


async def commit(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    group, topic, peer_topic = "bench-commits", "bench-groups-commit", "bench-groups-produce"
    for name in (topic, peer_topic):
        await cluster.create_topic(name, 1)
    await cluster.wait_topics([topic, peer_topic], 60, fully_replicated)
    tp = TopicPartition(topic, 0)
    key_size, value_size = commit_record_sizes(group, tp, 1)
    key, value = b"k" * key_size, make_value(value_size)
    member = Member(cluster, group, topic)
    producer = bench.sequential_producer(cluster, Acks.ALL)
    latencies: dict[str, list[float]] = {"commit": [], "produce": []}
    errors = {"commit": 0, "produce": 0}
    offset = 0

    async def one(series: str) -> None:
        nonlocal offset
        if series == "commit":
            offset += 1
            await member.consumer.commit({tp: offset})
        else:
            await (await producer.send(peer_topic, value, key=key, partition=0))

    try:
        await wait_assigned(member, frozenset({tp}), 60)
        for series in latencies:  # warm-up: channels, coordinator, producer id
            for _ in range(10):
                await asyncio.wait_for(one(series), 30)
        per_slice = max(1, preset.commits // preset.commit_slices)
        for _ in range(preset.commit_slices):
            for series, got in latencies.items():
                for _ in range(per_slice):
                    t0 = time.perf_counter()
                    try:
                        await asyncio.wait_for(one(series), 10)
                    except Exception:
                        errors[series] += 1
                        continue
                    got.append(time.perf_counter() - t0)
        committed = await member.consumer.committed([tp])
    finally:
        await producer.close(timeout_s=10)
        await member.close()
    out: dict[str, Any] = {
        "record_key_bytes": key_size,
        "record_value_bytes": value_size,
        "last_committed": _offset_of(committed[tp]),
        "last_offset": offset,
    }
    for series, got in latencies.items():
        out[series] = {"writes": len(got), "errors": errors[series], **latency_summary(got)}
    out["ratio_p50"] = _ratio(out["commit"]["p50_ms"], out["produce"]["p50_ms"])
    out["ratio_p99"] = _ratio(out["commit"]["p99_ms"], out["produce"]["p99_ms"])
    return out


# --------------------------------------------------------------------------
# Coordinator failover, beside the partition leader's


async def find_coordinator(
    cluster: Cluster, admin: GroupAdmin, group: str, timeout_s: float
) -> int:
    """The group's coordinator (FindCoordinator), asking each broker in turn
    (one of them may be dead) until one names it."""
    client = admin.coordinator(group)
    deadline = now() + timeout_s
    request = groups_pb2.FindCoordinatorRequest(group_ids=[group])
    while True:
        for address in cluster.brokers:
            with contextlib.suppress(grpc.aio.AioRpcError):
                answer = await client.stub_at(address).FindCoordinator(request, timeout=2)
                found = answer.coordinators[0] if answer.coordinators else None
                if answer.error == Errors.NONE and found is not None and found.error == Errors.NONE:
                    return int(found.node_id)
        if now() > deadline:
            raise RuntimeError(f"no broker named the coordinator of {group} within {timeout_s} s")
        await asyncio.sleep(0.1)


async def failover(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    group, topic = "bench-failover-group", "bench-groups-failover"
    await cluster.create_topic(topic, 1)
    await cluster.wait_topics([topic], 60, fully_replicated)
    tp = TopicPartition(topic, 0)
    trials: list[dict[str, Any]] = []
    # Each commit call is retried inside the client (another coordinator,
    # a lost connection) for 10 s at most, then again by the loop below.
    member = Member(cluster, group, topic, request_timeout_ms=10_000)
    offset = 0
    try:
        await wait_assigned(member, frozenset({tp}), 60)
        async with GroupAdmin(cluster.brokers, credentials=cluster.credentials()) as admin:
            for trial in range(preset.failover_trials):
                await cluster.wait_topics([OFFSETS_TOPIC, topic], 300, fully_replicated)
                killed = await find_coordinator(cluster, admin, group, 60)
                offset += 1
                await member.consumer.commit({tp: offset})  # answered by ``killed``
                cluster.kill_broker(killed)
                t_kill = now()
                failed: dict[str, int] = {}
                while True:
                    offset += 1
                    try:
                        await member.consumer.commit({tp: offset})
                        break
                    except BrokerClientError as error:
                        name = _error_name(error.code)
                        failed[name] = failed.get(name, 0) + 1
                        if now() - t_kill > 120:
                            raise RuntimeError(
                                f"no commit answered OK within 120 s of the kill of broker "
                                f"{killed}, the coordinator: {failed}"
                            ) from error
                t_ok = now()
                trials.append(
                    {
                        "trial": trial,
                        "killed": killed,
                        "coordinator_after": await find_coordinator(cluster, admin, group, 60),
                        "commit_s": t_ok - t_kill,
                        "failed_commits": failed,
                    }
                )
                await cluster.restart_broker(killed)
        await cluster.wait_topics([OFFSETS_TOPIC, topic], 300, fully_replicated)
        committed = await member.consumer.committed([tp])
    finally:
        await member.close()
    peer_preset = dataclasses.replace(
        bench.PRESETS["small"],
        failover_trials=preset.failover_trials,
        session_timeout_ms=preset.session_timeout_ms,
    )
    peer = await bench.failover(cluster, peer_preset)
    recovered = [t["commit_s"] for t in trials]
    p50 = percentile(recovered, 50) * 1e3 if recovered else None
    p99 = percentile(recovered, 99) * 1e3 if recovered else None
    return {
        "trials": len(trials),
        "session_timeout_ms": preset.session_timeout_ms,
        "commit_p50_ms": p50,
        "commit_p99_ms": p99,
        "commit_max_ms": max(recovered) * 1e3 if recovered else None,
        "last_committed": _offset_of(committed[tp]),
        "last_offset": offset,
        "per_trial": trials,
        "leader_failover": {k: v for k, v in peer.items() if k != "per_trial"},
        "ratio_p50": _ratio(p50, peer["ack_p50_ms"]),
        "ratio_p99": _ratio(p99, peer["ack_p99_ms"]),
    }


def _offset_of(committed: tuple[int, int] | None) -> int | None:
    return None if committed is None else committed[0]


def _error_name(code: int) -> str:
    try:
        return Errors(code).name
    except ValueError:
        return str(code)


# --------------------------------------------------------------------------
# Running and reporting

RUNNERS = {"rebalance": rebalance, "commit": commit, "failover": failover}


async def run(preset_name: str, only: Sequence[str], directory: Path | None) -> dict[str, Any]:
    preset = PRESETS[preset_name]
    return await bench.run_sections(
        "groups",
        preset_name,
        preset,
        RUNNERS,
        only,
        directory,
        preset.session_timeout_ms,
        broker_settings(preset),
    )


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_text(doc: dict[str, Any]) -> str:
    lines, s = bench.text_head("groups", doc)
    if "rebalance" in s:
        r = s["rebalance"]
        lines.append(
            f"== rebalance of a {r['members']}-member group over {r['partitions']} partitions "
            f"(p50 / p99 ms; brokers' group session timeout {r['group_session_timeout_ms']} ms, "
            f"heartbeat interval {r['heartbeat_interval_ms']} ms)"
        )
        for event in ("join", "leave", "vanish"):
            t = r[event]
            lines.append(
                f"   {event:<7} {_ms(t['p50_ms']):>9} / {_ms(t['p99_ms']):>9}"
                f"   ({t['trials']} trials, max {_ms(t['max_ms'])})"
            )
    if "commit" in s:
        r = s["commit"]
        lines.append(
            f"== commit latency (p50 / p99 ms), peer: an acks=all produce of a record of the "
            f"commit record's size (key {r['record_key_bytes']} B, value "
            f"{r['record_value_bytes']} B)"
        )
        for series in ("commit", "produce"):
            t = r[series]
            lines.append(
                f"   {series:<8} {_ms(t['p50_ms']):>8} / {_ms(t['p99_ms']):>8}"
                f"   ({t['writes']} writes, {t['errors']} errors)"
            )
        lines.append(f"   ratio    {_x(r['ratio_p50']):>8} / {_x(r['ratio_p99']):>8}")
    if "failover" in s:
        r = s["failover"]
        peer = r["leader_failover"]
        lines.append(
            f"== coordinator failover ({r['trials']} trials, controllers' broker session "
            f"timeout {r['session_timeout_ms']} ms): kill -> first OK commit p50 "
            f"{_ms(r['commit_p50_ms'])}, p99 {_ms(r['commit_p99_ms'])} ms"
        )
        lines.append(
            f"   peer, partition leader failover ({peer['recovered']}/{peer['trials']} trials): "
            f"kill -> first ack p50 {_ms(peer['ack_p50_ms'])}, p99 {_ms(peer['ack_p99_ms'])} ms"
        )
        lines.append(f"   ratio p50 {_x(r['ratio_p50'])}, p99 {_x(r['ratio_p99'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = bench.bench_parser(__doc__.split("\n\n")[0], list(PRESETS), SECTIONS)
    args = bench.parse_bench_args(parser, argv)
    doc = asyncio.run(run(args.preset, args.only, args.dir))
    return bench.report(args, doc, format_text)


if __name__ == "__main__":
    sys.exit(main())
