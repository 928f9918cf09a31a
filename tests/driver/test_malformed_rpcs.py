"""Malformed and hostile requests against running nodes.

A seeded generator sends a bounded number of requests to the five
RaftService RPCs and the KvService RPCs of an in-process 3-node cluster:
out-of-range fields (negative ids, offsets and epochs), wrong addressees,
odd but well-formed values (huge offsets, waits and sizes, unknown snapshot
ids, epochs from the past and the future), empty and oversize keys and
values, PutMany with no puts or too many, Cas with both ``expected`` and
``expect_absent``.  Every request must get either a normal response or a gRPC
error status whose details name the problem; afterwards no node has failed,
the cluster elects a leader, serves writes and linearizable reads, keeps every
write it acknowledged during the fuzzing, and its nodes converge on the same
state.

The seed is printed; set KQ_FUZZ_SEED to replay a run (and KQ_FUZZ_COUNT to
send more requests).

Well-formed requests that no correct peer could send each have a test of
their own below (an epoch at the int32 limit, BeginQuorumEpoch and
EndQuorumEpoch from a non-voter, requests whose sender is the receiver
itself): each is refused by name and leaves the cluster working.  A forged
request that
contradicts the quorum's state (a second leader for an epoch, a node told it
won an election it did not run) stops the node by design (SafetyError) and is
not sent either; nor are Fetch requests forged in a voter's name, which could
move the high watermark (kq does not authenticate peers: Raft assumes no
Byzantine members).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from kqproto import kv_pb2, kv_pb2_grpc, quorum_pb2, quorum_pb2_grpc, raft_pb2, raft_pb2_grpc
from kvstore.client import KvClient
from kvstore.state_machine import MAX_KEY_BYTES, MAX_VALUE_BYTES
from quorum.config import QuorumConfig
from quorum.driver.node import NodeOptions
from quorum.types import Role
from server.controller import kv_of
from tests.driver.cluster_util import CLUSTER_ID, Cluster, run, running

I32_MAX = 2**31 - 1
I64_MAX = 2**63 - 1
MAX_PUTS = 64
OPTIONS = NodeOptions(
    quorum=QuorumConfig(
        election_timeout_ms=150, fetch_timeout_ms=400, fetch_max_wait_ms=100, request_timeout_ms=150
    ),
    # Snapshots, so that FetchSnapshot can name a real one.
    snapshot_every_offsets=25,
    max_batch_records=MAX_PUTS,
)
RPC_TIMEOUT_S = 3.0


def cluster_of_3(root: Path) -> AbstractAsyncContextManager[Cluster]:
    return running(root, voters=3, options=OPTIONS)


# -- expectations ---------------------------------------------------------------


@dataclass
class Expect:
    """What a request must get: a normal response, or a gRPC error status with
    ``code`` whose details contain every one of ``words``."""

    code: grpc.StatusCode | None = None
    words: tuple[str, ...] = ()
    # For a normal raft response: the sender (our target) and the receiver.
    src: int | None = None
    dst: int | None = None
    # Either a normal response or this error is fine (an ambiguous request).
    either: bool = False


@dataclass
class Tally:
    ok: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    by_rpc: dict[str, int] = field(default_factory=dict)
    # Answers of the key-value RPCs by KvError name; raft answers by ErrorCode.
    kv_errors: dict[str, int] = field(default_factory=dict)
    raft_errors: dict[str, int] = field(default_factory=dict)
    acked: int = 0


# -- raft requests ---------------------------------------------------------------

# (proto field, name in the error message, bits, node id or non-negative)
_COMMON = [("src", "src", 32, "node"), ("dst", "dst", 32, "node"), ("epoch", "epoch", 32, "num")]
RAFT_FIELDS: dict[str, list[tuple[str, str, int, str]]] = {
    "Vote": [
        *_COMMON,
        ("last_epoch", "last_epoch", 32, "num"),
        ("end_offset", "end_offset", 64, "num"),
    ],
    "BeginQuorumEpoch": [*_COMMON, ("leader_id", "leader_id", 32, "node")],
    "EndQuorumEpoch": [
        *_COMMON,
        ("leader_id", "leader_id", 32, "node"),
        ("preferred_successors", "preferred_successors", 32, "list"),
    ],
    "Fetch": [
        *_COMMON,
        ("fetch_offset", "fetch_offset", 64, "num"),
        ("last_fetched_epoch", "last_fetched_epoch", 32, "num"),
        ("max_wait_ms", "max_wait_ms", 32, "num"),
        ("max_bytes", "max_bytes", 32, "num"),
    ],
    "FetchSnapshot": [
        *_COMMON,
        ("snapshot_id.end_offset", "snapshot end_offset", 64, "num"),
        ("snapshot_id.epoch", "snapshot epoch", 32, "num"),
    ],
}
RAFT_REQUESTS = {
    "Vote": raft_pb2.VoteRequest,
    "BeginQuorumEpoch": raft_pb2.BeginQuorumEpochRequest,
    "EndQuorumEpoch": raft_pb2.EndQuorumEpochRequest,
    "Fetch": raft_pb2.FetchRequest,
    "FetchSnapshot": raft_pb2.FetchSnapshotRequest,
}
RAFT_RESPONSES: dict[str, Any] = {
    "Vote": raft_pb2.VoteResponse,
    "BeginQuorumEpoch": raft_pb2.BeginQuorumEpochResponse,
    "EndQuorumEpoch": raft_pb2.EndQuorumEpochResponse,
    "Fetch": raft_pb2.FetchResponse,
    "FetchSnapshot": raft_pb2.FetchSnapshotResponse,
}


def _negative(rng: random.Random, bits: int) -> int:
    low = -(2 ** (bits - 1))
    return rng.choice([-1, -2, low, rng.randint(low, -1)])


def _any(rng: random.Random, bits: int) -> int:
    # The top int32 is not a valid epoch (a node must be able to start the
    # next one), so valid 32-bit values stop one short of it.
    high = 2 ** (bits - 1) - (2 if bits == 32 else 1)
    return rng.choice([0, 1, rng.randint(0, 100), rng.randint(0, high), high])


class Fuzzer:
    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.voters = sorted(cluster.voters)
        # Epochs of forged "newer epoch" requests only grow, and start well
        # above any epoch the cluster reaches by itself meanwhile, so that no
        # forged claim can meet a real leader of the same epoch.
        self.forged_epoch = 0
        self.seq = 0
        self.acked: dict[str, bytes] = {}

    def epoch_of(self, node: int) -> int:
        return self.cluster.servers[node].node.core.epoch

    def fresh_epoch(self) -> int:
        top = max(s.node.core.epoch for s in self.cluster.servers.values())
        self.forged_epoch = max(self.forged_epoch, top) + self.rng.randint(50, 200)
        assert self.forged_epoch < 2**30  # far from the int32 limit
        return self.forged_epoch

    def non_voter(self) -> int:
        return self.rng.choice([4, 99, self.rng.randint(4, I32_MAX), I32_MAX])

    # A well-formed request of each kind, addressed to ``dst``.

    def good_raft(self, rpc: str, dst: int) -> Any:
        rng = self.rng
        cur = self.epoch_of(dst)
        req: Any = RAFT_REQUESTS[rpc](cluster_id=CLUSTER_ID, dst=dst)
        if rpc == "Vote":
            req.pre_vote = rng.random() < 0.5
            if rng.random() < 0.5:
                # A (pre-)vote from a voter: a candidate of a near epoch.
                req.src = rng.choice(self.voters)
                req.epoch = max(0, cur + rng.randint(-2, 3))
            else:
                # From a non-voter: refused whatever its epoch.
                req.src = self.non_voter()
                req.epoch = _any(rng, 32)
            req.last_epoch = rng.choice([0, cur, _any(rng, 32)])
            req.end_offset = _any(rng, 64)
        elif rpc in ("BeginQuorumEpoch", "EndQuorumEpoch"):
            leader = rng.choice([v for v in self.voters if v != dst])
            req.src = req.leader_id = leader
            real = self.cluster.leader()
            roll = rng.random()
            if cur > 0 and roll < (0.4 if rpc == "BeginQuorumEpoch" else 0.8):
                req.epoch = rng.randint(0, cur - 1)  # stale: fenced
                req.src = rng.choice(self.voters)
            elif rpc == "BeginQuorumEpoch" and real and real.config.node_id != dst and roll < 0.85:
                # A copy of the real leader's announcement.
                req.epoch = real.node.core.epoch
                req.src = req.leader_id = real.config.node_id
            else:
                # A newer epoch than anyone's: an election the receiver missed.
                req.epoch = self.fresh_epoch()
            if rpc == "EndQuorumEpoch":
                req.preferred_successors.extend(
                    rng.sample(self.voters, rng.randint(0, len(self.voters)))
                    + [self.non_voter() for _ in range(rng.randint(0, 2))]
                )
        elif rpc == "Fetch":
            current = self.cluster.leader()
            end = current.node.core.status().log_end_offset if current else 0
            req.src = self.non_voter()
            req.epoch = rng.choice([cur, cur, _any(rng, 32)])
            req.fetch_offset = rng.choice([0, rng.randint(0, end), end, _any(rng, 64)])
            req.last_fetched_epoch = rng.choice([0, cur, _any(rng, 32)])
            req.max_wait_ms = rng.choice([0, 50, _any(rng, 32)])
            req.max_bytes = rng.choice([0, 1, 4096, _any(rng, 32)])
            req.request_id = rng.randint(0, 2**64 - 1)
        else:  # FetchSnapshot
            latest = self.cluster.servers[dst].storage.snapshots.latest()
            req.src = self.non_voter()
            req.epoch = rng.choice([cur, cur, _any(rng, 32)])
            if latest is not None and rng.random() < 0.6:
                req.snapshot_id.end_offset = latest.end_offset
                req.snapshot_id.epoch = latest.epoch
            else:
                req.snapshot_id.end_offset = _any(rng, 64)
                req.snapshot_id.epoch = _any(rng, 32)
            req.position = rng.choice(
                [0, 0, 1, rng.randint(0, 200), -1, rng.randint(-(2**63), I64_MAX), I64_MAX]
            )
            req.max_bytes = rng.choice([0, -5, 1, 65536, _any(rng, 32)])
            req.request_id = rng.randint(0, 2**64 - 1)
        return req

    def raft_request(self, rpc: str, dst: int) -> tuple[Any, Expect]:
        rng = self.rng
        req = self.good_raft(rpc, dst)
        roll = rng.random()
        if roll < 0.45:
            # One field out of range: refused, naming the field and value.
            proto_field, label, bits, kind = rng.choice(RAFT_FIELDS[rpc])
            bad = _negative(rng, bits)
            if "epoch" in label and rng.random() < 0.3:
                bad = I32_MAX  # no epoch may follow it
            if kind == "list":
                req.preferred_successors.append(bad)
            elif "." in proto_field:
                outer, inner = proto_field.split(".")
                setattr(getattr(req, outer), inner, bad)
            else:
                setattr(req, proto_field, bad)
            return req, Expect(grpc.StatusCode.INVALID_ARGUMENT, (f"{label} must", str(bad)))
        if roll < 0.55:
            # Addressed to another node (any id but ours).
            other = rng.choice([v for v in [*self.voters, 0, 4, I32_MAX] if v != dst])
            req.dst = other
            return req, Expect(grpc.StatusCode.INVALID_ARGUMENT, (f"node {other}", f"node {dst}"))
        if roll < 0.6:
            # Another cluster (checked before anything else).
            req.cluster_id = rng.choice(["", "other-cluster", CLUSTER_ID + "x", "é"])
            return req, Expect(
                grpc.StatusCode.FAILED_PRECONDITION, (repr(req.cluster_id), repr(CLUSTER_ID))
            )
        return req, Expect(src=dst, dst=req.src)

    # -- key-value requests --------------------------------------------------

    def key(self, prefix: str) -> tuple[str, str | None]:
        """A key, and the problem it has (None if valid)."""
        rng = self.rng
        self.seq += 1
        roll = rng.random()
        if roll < 0.12:
            return "", "key must be a non-empty"
        if roll < 0.2:
            return "k" * (MAX_KEY_BYTES + rng.randint(1, 100)), f"longer than {MAX_KEY_BYTES}"
        if roll < 0.25:
            # Few characters, too many bytes.
            return "é" * (MAX_KEY_BYTES // 2 + 1), f"longer than {MAX_KEY_BYTES}"
        if roll < 0.3:
            return f"{prefix}{self.seq}-".ljust(MAX_KEY_BYTES, "x"), None  # the longest
        if roll < 0.35:
            return f"{prefix}{self.seq}\x00é\n", None
        return f"{prefix}{self.seq}", None

    def value(self) -> tuple[bytes, str | None]:
        rng = self.rng
        roll = rng.random()
        if roll < 0.06:
            return b"v" * (
                MAX_VALUE_BYTES + rng.choice([1, 1000])
            ), f"longer than {MAX_VALUE_BYTES}"
        if roll < 0.09:
            return b"m" * MAX_VALUE_BYTES, None  # the largest
        if roll < 0.2:
            return b"", None
        return rng.randbytes(rng.randint(1, 64)), None

    def kv_request(self) -> tuple[str, Any, Expect, dict[str, bytes]]:
        """(rpc, request, expectation, what it writes if acknowledged)."""
        rng = self.rng
        rpc = rng.choice(["Put", "PutMany", "Cas", "Delete", "Get"])
        bad = grpc.StatusCode.INVALID_ARGUMENT
        if rpc == "Put":
            key, key_problem = self.key("p")
            value, value_problem = self.value()
            problem = key_problem or value_problem
            req: Any = kv_pb2.PutRequest(key=key, value=value)
            if problem:
                return rpc, req, Expect(bad, (problem,)), {}
            return rpc, req, Expect(), {key: value}
        if rpc == "PutMany":
            roll = rng.random()
            if roll < 0.15:
                return rpc, kv_pb2.PutManyRequest(), Expect(bad, ("at least one put",)), {}
            count = MAX_PUTS + rng.randint(1, 50) if roll < 0.3 else rng.randint(1, 6)
            puts, writes, problems = [], {}, []
            for _ in range(count):
                key, key_problem = self.key("m") if count <= MAX_PUTS else (f"m{self.seq}", None)
                self.seq += 1
                value, value_problem = self.value() if count <= MAX_PUTS else (b"x", None)
                puts.append(kv_pb2.PutRequest(key=key, value=value))
                writes[key] = value
                problem = key_problem or value_problem
                if problem:
                    problems.append(problem)
            req = kv_pb2.PutManyRequest(puts=puts)
            if count > MAX_PUTS:
                return rpc, req, Expect(bad, (f"{count} puts", f"at most {MAX_PUTS}")), {}
            if problems:
                return rpc, req, Expect(bad, (problems[0],)), {}
            return rpc, req, Expect(), writes
        if rpc == "Cas":
            key, key_problem = self.key("c")
            value, value_problem = self.value()
            expect_absent = rng.random() < 0.5
            expected = rng.choice([b"", b"x", rng.randbytes(8)])
            req = kv_pb2.CasRequest(
                key=key, expected=expected, expect_absent=expect_absent, value=value
            )
            if key_problem or value_problem:
                return rpc, req, Expect(bad, ((key_problem or value_problem) or "",)), {}
            if expect_absent and expected:
                # Both forms of the expectation: refusing it (naming the
                # clash) or honouring one form are both answers.
                return rpc, req, Expect(bad, ("expect",), either=True), {}
            return rpc, req, Expect(), {}
        if rpc == "Delete":
            key, key_problem = self.key("d")
            req = kv_pb2.DeleteRequest(key=key)
            if key_problem:
                return rpc, req, Expect(bad, (key_problem,)), {}
            return rpc, req, Expect(), {}
        key, _ = self.key("g")
        req = kv_pb2.GetRequest(key=key, linearizable=rng.random() < 0.5)
        if not key:
            return rpc, req, Expect(bad, ("key must be non-empty",)), {}
        return rpc, req, Expect(), {}


def _check_raft_reply(rpc: str, reply: Any, expect: Expect) -> None:
    assert isinstance(reply, RAFT_RESPONSES[rpc]), type(reply)
    assert reply.src == expect.src and reply.dst == expect.dst, reply
    assert reply.error in raft_pb2.ErrorCode.values(), reply
    assert reply.epoch >= 0


async def _call(stub: Any, rpc: str, req: Any, expect: Expect, what: str, tally: Tally) -> Any:
    try:
        reply = await getattr(stub, rpc)(req, timeout=RPC_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        details = exc.details() or ""
        assert expect.code is not None, f"{what}: refused ({exc.code().name}: {details})"
        assert exc.code() == expect.code, f"{what}: {exc.code().name}: {details}"
        for word in expect.words:
            assert word in details, f"{what}: details {details!r} do not name {word!r}"
        tally.refused[exc.code().name] = tally.refused.get(exc.code().name, 0) + 1
        return None
    assert expect.code is None or expect.either, f"{what}: answered {reply!r}"
    tally.ok += 1
    return reply


def _describe(req: Any) -> str:
    text = " ".join(str(req).split())
    return text if len(text) < 300 else text[:300] + "..."


async def _fuzz(cluster: Cluster, rng: random.Random, count: int) -> Tally:
    fuzzer = Fuzzer(cluster, rng)
    tally = Tally()
    channels = {n: grpc.aio.insecure_channel(a) for n, a in cluster.voters.items()}
    try:
        for i in range(count):
            if rng.random() < 0.65:
                rpc = rng.choice(list(RAFT_REQUESTS))
                dst = rng.choice(fuzzer.voters)
                leader = cluster.leader()
                if rpc.startswith("Fetch") and leader is not None and rng.random() < 0.6:
                    dst = leader.config.node_id  # the replication paths of a leader
                req, expect = fuzzer.raft_request(rpc, dst)
                what = f"request {i} {rpc} to node {dst}: {_describe(req)}"
                raft_stub = raft_pb2_grpc.RaftServiceStub(channels[dst])
                reply = await _call(raft_stub, rpc, req, expect, what, tally)
                if reply is not None:
                    _check_raft_reply(rpc, reply, expect)
                    name = raft_pb2.ErrorCode.Name(reply.error)
                    tally.raft_errors[name] = tally.raft_errors.get(name, 0) + 1
            else:
                rpc, req, expect, writes = fuzzer.kv_request()
                # Give the cluster a moment to elect after the raft requests
                # above shook it (bounded: a write to a non-leader is answered
                # NOT_LEADER, which is fine too).
                with contextlib.suppress(AssertionError):
                    await cluster.wait_for(lambda: cluster.leader() is not None, 1.0)
                leader = cluster.leader()
                node = leader.config.node_id if leader and rng.random() < 0.8 else None
                node = node or rng.choice(fuzzer.voters)
                what = f"request {i} {rpc} to node {node}: {_describe(req)}"
                kv_stub = kv_pb2_grpc.KvServiceStub(channels[node])
                reply = await _call(kv_stub, rpc, req, expect, what, tally)
                if reply is not None:
                    assert reply.error in kv_pb2.KvError.values(), what
                    assert reply.error != kv_pb2.INVALID_REQUEST, f"{what}: {reply.message}"
                    name = kv_pb2.KvError.Name(reply.error)
                    tally.kv_errors[name] = tally.kv_errors.get(name, 0) + 1
                    if rpc != "Get" and reply.error == kv_pb2.OK:
                        fuzzer.acked.update(writes)
            tally.by_rpc[rpc] = tally.by_rpc.get(rpc, 0) + 1
            for server in cluster.servers.values():
                assert server.node.failure is None, (
                    f"after {what}: node {server.config.node_id} failed: {server.node.failure}"
                )
    finally:
        for channel in channels.values():
            await channel.close()
    tally.acked = len(fuzzer.acked)
    await _still_serves(cluster, fuzzer.acked)
    return tally


async def _still_serves(cluster: Cluster, acked: dict[str, bytes]) -> None:
    for server in cluster.servers.values():
        assert server.node.failure is None, server.node.failure
    await cluster.wait_leader(timeout_s=15)
    async with KvClient(list(cluster.voters.values()), timeout_s=10.0) as client:
        position = await client.put("after-the-fuzz", b"still here")
        got = await client.get("after-the-fuzz")
        assert got.value == b"still here" and got.version == position
        for key, value in acked.items():
            got = await client.get(key)
            assert got.present and got.value == value, f"acknowledged write of {key!r} lost"
    nodes = list(cluster.servers.values())
    await cluster.wait_for(
        lambda: (
            all(kv_of(s).get("after-the-fuzz") is not None for s in nodes)
            and len({(s.state_machine.applied_offset, s.state_machine.digest()) for s in nodes})
            == 1
        ),
        timeout_s=15,
    )


def test_fuzzed_raft_and_kv_requests_are_answered_or_refused_by_name(tmp_path: Path) -> None:
    seed = int(os.environ.get("KQ_FUZZ_SEED", random.randrange(2**32)))
    count = int(os.environ.get("KQ_FUZZ_COUNT", "300"))
    print(f"fuzz seed: {seed} (replay with KQ_FUZZ_SEED={seed})")
    rng = random.Random(seed)

    async def go() -> None:
        async with cluster_of_3(tmp_path) as cluster:
            await cluster.wait_leader()
            # Enough writes for a snapshot on every node.
            async with KvClient(list(cluster.voters.values())) as client:
                for i in range(60):
                    await client.put(f"seed{i}", b"%d" % i)
            await cluster.wait_for(
                lambda: all(s.storage.snapshots.latest() for s in cluster.servers.values())
            )
            started = time.monotonic()
            epoch = max(s.node.core.epoch for s in cluster.servers.values())
            tally = await _fuzz(cluster, rng, count)
            print(
                f"{count} requests in {time.monotonic() - started:.1f} s: {tally.ok} answered "
                f"(raft {tally.raft_errors}, kv {tally.kv_errors}), refused {tally.refused}; "
                f"by RPC {tally.by_rpc}; {tally.acked} keys written; epoch {epoch} -> "
                f"{max(s.node.core.epoch for s in cluster.servers.values())}"
            )
            assert tally.ok > count // 5 and sum(tally.refused.values()) > count // 5

    asyncio.run(asyncio.wait_for(go(), 170))


# -- specific requests -----------------------------------------------------------


def test_a_request_for_another_cluster_names_both_cluster_ids(tmp_path: Path) -> None:
    async def go() -> None:
        async with cluster_of_3(tmp_path) as cluster:
            await cluster.wait_leader()
            node, address = 1, cluster.voters[1]
            async with grpc.aio.insecure_channel(address) as channel:
                stub = raft_pb2_grpc.RaftServiceStub(channel)
                for rpc, request_type in RAFT_REQUESTS.items():
                    for foreign in ("", "another-cluster-id"):
                        # Otherwise valid, and also malformed: the cluster
                        # check comes first either way.
                        for src in (2, -7):
                            request = request_type(cluster_id=foreign, src=src, dst=node)
                            with pytest.raises(grpc.aio.AioRpcError) as err:
                                await getattr(stub, rpc)(request, timeout=RPC_TIMEOUT_S)
                            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                            details = err.value.details() or ""
                            assert repr(foreign) in details, details
                            assert repr(CLUSTER_ID) in details, details
            # No harm done.
            async with KvClient(list(cluster.voters.values())) as client:
                await client.put("k", b"v")

    run(go())


def test_cas_with_both_expected_and_expect_absent_is_refused_or_consistent(
    tmp_path: Path,
) -> None:
    """The request holds two contradicting expectations.  Refusing it, naming
    the clash, is best; if it is accepted, one form must win consistently."""

    async def go() -> None:
        async with cluster_of_3(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            async with grpc.aio.insecure_channel(leader.config.address) as channel:
                kv = kv_pb2_grpc.KvServiceStub(channel)
                both = kv_pb2.CasRequest(key="c", expected=b"x", expect_absent=True, value=b"new")
                # Absent key: "absent" holds, "x" does not.
                try:
                    absent = await kv.Cas(both, timeout=RPC_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert "expect" in (exc.details() or "")
                    return
                await kv.Put(kv_pb2.PutRequest(key="c2", value=b"x"), timeout=RPC_TIMEOUT_S)
                both.key = "c2"
                present = await kv.Cas(both, timeout=RPC_TIMEOUT_S)
            outcomes = (absent.error, present.error)
            # expect_absent wins: OK then PRECONDITION_FAILED; expected wins:
            # the other way round.
            assert outcomes in (
                (kv_pb2.OK, kv_pb2.PRECONDITION_FAILED),
                (kv_pb2.PRECONDITION_FAILED, kv_pb2.OK),
            ), outcomes

    run(go())


# -- known bugs ------------------------------------------------------------------------


async def _serves_within(cluster: Cluster, seconds: float) -> None:
    for server in cluster.servers.values():
        assert server.node.failure is None, (server.config.node_id, server.node.failure)
    async with KvClient(list(cluster.voters.values()), timeout_s=seconds) as client:
        await client.put("afterwards", b"ok")
        assert (await client.get("afterwards")).value == b"ok"


def test_an_epoch_at_the_int32_limit_does_not_kill_the_cluster(tmp_path: Path) -> None:
    async def go() -> None:
        async with cluster_of_3(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            voter = next(n for n in cluster.voters if n != leader.config.node_id)
            async with grpc.aio.insecure_channel(cluster.voters[voter]) as channel:
                stub = raft_pb2_grpc.RaftServiceStub(channel)
                request = raft_pb2.VoteRequest(
                    cluster_id=CLUSTER_ID,
                    src=leader.config.node_id,
                    dst=voter,
                    epoch=I32_MAX,
                    last_epoch=0,
                    end_offset=0,
                )
                try:
                    await stub.Vote(request, timeout=RPC_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    # Refusing the epoch is a fix too.
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
            # Let the elections that follow play out, then the cluster must
            # still have every node and serve.
            await asyncio.sleep(3.0)
            await _serves_within(cluster, 5.0)

    run(go())


@pytest.mark.parametrize("rpc", ["BeginQuorumEpoch", "EndQuorumEpoch"])
def test_voter_only_requests_from_a_non_voter_are_refused(tmp_path: Path, rpc: str) -> None:
    async def go() -> None:
        async with cluster_of_3(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            voter = next(n for n in cluster.voters if n != leader.config.node_id)
            target = cluster.servers[voter]
            await cluster.wait_for(lambda: target.node.core.leader_id == leader.config.node_id)
            epoch = target.node.core.epoch
            request = RAFT_REQUESTS[rpc](
                cluster_id=CLUSTER_ID, src=77, dst=voter, epoch=epoch + 1, leader_id=77
            )
            async with grpc.aio.insecure_channel(cluster.voters[voter]) as channel:
                stub = raft_pb2_grpc.RaftServiceStub(channel)
                reply = await getattr(stub, rpc)(request, timeout=RPC_TIMEOUT_S)
            assert reply.error == raft_pb2.INCONSISTENT_VOTER_SET, reply
            assert target.node.core.epoch == epoch
            assert target.node.core.leader_id == leader.config.node_id

    run(go())


def test_a_fetch_from_the_leaders_own_id_leaves_it_leading(tmp_path: Path) -> None:
    async def go() -> None:
        async with cluster_of_3(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            node, epoch = leader.config.node_id, leader.node.core.epoch
            request = raft_pb2.FetchRequest(
                cluster_id=CLUSTER_ID, src=node, dst=node, epoch=epoch, max_bytes=4096
            )
            async with grpc.aio.insecure_channel(leader.config.address) as channel:
                with_self: Any = None
                try:
                    await raft_pb2_grpc.RaftServiceStub(channel).Fetch(
                        request, timeout=RPC_TIMEOUT_S
                    )
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
                with_self = await quorum_pb2_grpc.QuorumServiceStub(channel).DescribeQuorum(
                    quorum_pb2.DescribeQuorumRequest(), timeout=RPC_TIMEOUT_S
                )
            ids = [r.node_id for r in with_self.replicas]
            assert sorted(ids) == sorted(set(ids)), f"replicas listed twice: {ids}"
            # Several fetch timeouts (400 ms) later it still leads the same epoch.
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                assert leader.node.core.role is Role.LEADER, leader.node.core.role
                assert leader.node.core.epoch == epoch
                await asyncio.sleep(0.01)

    run(go())


def test_a_begin_quorum_epoch_naming_the_leader_itself_leaves_it_leading(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with cluster_of_3(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            node, epoch = leader.config.node_id, leader.node.core.epoch
            request = raft_pb2.BeginQuorumEpochRequest(
                cluster_id=CLUSTER_ID, src=node, dst=node, epoch=epoch, leader_id=node
            )
            async with grpc.aio.insecure_channel(leader.config.address) as channel:
                try:
                    await raft_pb2_grpc.RaftServiceStub(channel).BeginQuorumEpoch(
                        request, timeout=RPC_TIMEOUT_S
                    )
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
            assert leader.node.core.role is Role.LEADER, (
                f"node {node} is now {leader.node.core.role.value} of leader "
                f"{leader.node.core.leader_id} in epoch {leader.node.core.epoch}"
            )

    run(go())


# -- bytes that are no request at all -------------------------------------------------

GARBAGE = (b"\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x08", b"\x12\x05ab")


def _unparsable(message: Any) -> list[bytes]:
    """The garbage payloads that ``message`` cannot parse."""
    out = []
    for data in GARBAGE:
        try:
            message.FromString(data)
        except Exception:
            out.append(data)
    return out


def test_bytes_that_are_no_request_get_invalid_argument_and_one_quiet_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every unary method of every service on a node: unparsable bytes are
    refused INVALID_ARGUMENT naming the message, change nothing, and are
    logged once per peer and method (WARNING), never as tracebacks."""
    services = [
        raft_pb2.DESCRIPTOR.services_by_name["RaftService"],
        quorum_pb2.DESCRIPTOR.services_by_name["QuorumService"],
        kv_pb2.DESCRIPTOR.services_by_name["KvService"],
    ]
    modules = {"kq.raft": raft_pb2, "kq.quorum": quorum_pb2, "kq.kv": kv_pb2}

    async def go() -> None:
        async with cluster_of_3(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            async with KvClient(list(cluster.voters.values())) as client:
                await client.put("before", b"1")
            before = {n: s.state_machine.applied_offset for n, s in cluster.servers.items()}
            sent: dict[str, int] = {}
            caplog.clear()
            with caplog.at_level(logging.INFO):
                async with grpc.aio.insecure_channel(leader.config.address) as channel:
                    for service in services:
                        module = modules[service.file.package]
                        for method in service.methods:
                            request_type = getattr(module, method.input_type.name)
                            path = f"/{service.full_name}/{method.name}"
                            call = channel.unary_unary(
                                path,
                                request_serializer=lambda b: b,
                                response_deserializer=lambda b: b,
                            )
                            for data in _unparsable(request_type) * 3:
                                with pytest.raises(grpc.aio.AioRpcError) as refused:
                                    await call(data, timeout=RPC_TIMEOUT_S)
                                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                                details = refused.value.details() or ""
                                assert "malformed request" in details, details
                                assert method.input_type.full_name in details, details
                                sent[path] = sent.get(path, 0) + 1
            assert len(sent) == sum(len(s.methods) for s in services), sent
            assert all(count >= 3 for count in sent.values()), sent
            records = [r for r in caplog.records if "malformed" in r.getMessage()]
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
                r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
            ]
            # One line per method from this one peer, however many it sent.
            assert len(records) == len(sent), [r.getMessage() for r in records]
            assert all(r.levelno == logging.WARNING for r in records)
            # Nothing changed: no write, and the cluster still serves.
            await asyncio.sleep(0.3)
            for n, s in cluster.servers.items():
                assert kv_of(s).get("before") is not None
                assert s.state_machine.applied_offset >= before[n]
            await _serves_within(cluster, 5.0)

    run(go())
