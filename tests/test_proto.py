"""The generated protobuf/gRPC modules exist, work, and match proto/."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from tools import gen_proto

STALE = "generated code is stale: re-run the install step (scripts/bootstrap)"
RPCS = ("Vote", "BeginQuorumEpoch", "EndQuorumEpoch", "Fetch", "FetchSnapshot", "FetchStream")
PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"


def _generated(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"kqproto.{name}")
    except ImportError as exc:
        pytest.fail(f"{STALE} (cannot import kqproto.{name}: {exc})")


def test_generated_code_is_current() -> None:
    recorded = _generated("_proto_digest").PROTO_DIGEST
    assert recorded == gen_proto.proto_digest(PROTO_ROOT), STALE


def test_fetch_response_round_trip() -> None:
    raft_pb2 = _generated("raft_pb2")
    batch = raft_pb2.RecordBatch(
        base_offset=10,
        epoch=3,
        kind=raft_pb2.LEADER_CHANGE,
        records=[b"a", b"", b"\x00\xff"],
        crc32c=0xDEADBEEF,
    )
    response = raft_pb2.FetchResponse(
        src=1,
        dst=2,
        error=raft_pb2.NONE,
        epoch=3,
        leader_id=1,
        fetch_offset=10,
        high_watermark=12,
        log_start_offset=0,
        batches=[batch],
        diverging=raft_pb2.OffsetAndEpoch(offset=9, epoch=2),
    )

    parsed = raft_pb2.FetchResponse.FromString(response.SerializeToString())

    assert parsed == response
    assert list(parsed.batches[0].records) == [b"a", b"", b"\x00\xff"]
    assert parsed.batches[0].kind == raft_pb2.LEADER_CHANGE
    assert parsed.batches[0].crc32c == 0xDEADBEEF
    assert parsed.HasField("diverging")
    assert (parsed.diverging.offset, parsed.diverging.epoch) == (9, 2)
    assert not parsed.HasField("snapshot_id")


def test_absent_leader_is_minus_one_by_convention() -> None:
    raft_pb2 = _generated("raft_pb2")
    parsed = raft_pb2.VoteResponse.FromString(
        raft_pb2.VoteResponse(src=2, dst=1, epoch=4, leader_id=-1).SerializeToString()
    )
    assert parsed.leader_id == -1


def test_enums_mirror_the_core() -> None:
    raft_pb2 = _generated("raft_pb2")
    assert dict(raft_pb2.BatchKind.items()) == {"DATA": 0, "LEADER_CHANGE": 1}
    try:
        from quorum.messages import ErrorCode
        from quorum.types import BatchKind
    except ImportError as exc:  # the core is optional for this test
        pytest.skip(f"quorum core not importable: {exc}")
    assert dict(raft_pb2.ErrorCode.items()) == {e.name: e.value for e in ErrorCode}
    assert dict(raft_pb2.BatchKind.items()) == {k.name: k.value for k in BatchKind}


def test_every_rpc_exists() -> None:
    raft_pb2 = _generated("raft_pb2")
    grpc_module = _generated("raft_pb2_grpc")
    service = raft_pb2.DESCRIPTOR.services_by_name["RaftService"]
    assert sorted(m.name for m in service.methods) == sorted(RPCS)
    for rpc in RPCS:
        assert callable(getattr(grpc_module.RaftServiceServicer, rpc))
    assert callable(grpc_module.add_RaftServiceServicer_to_server)
    # Making a channel and a stub sends nothing; only a call would connect.
    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        stub = grpc_module.RaftServiceStub(channel)
        for rpc in RPCS:
            assert callable(getattr(stub, rpc))
    finally:
        channel.close()
