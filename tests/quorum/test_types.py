"""Value types: VoterSet/LeaderChange encodings and QuorumConfig validation."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from quorum.config import QuorumConfig
from quorum.types import Batch, BatchKind, LeaderChange, OffsetAndEpoch, SnapshotId, VoterSet

# -- VoterSet -------------------------------------------------------------------


@pytest.mark.parametrize("ids", [(0,), (1,), (3, 1, 2), (5, 4, 3, 2, 1), (7, 100, 2**40)])
def test_voter_set_round_trip(ids: tuple[int, ...]) -> None:
    vs = VoterSet.of(*ids)
    data = vs.encode()
    assert VoterSet.decode(data) == vs
    assert json.loads(data) == {"version": 0, "voters": sorted(ids)}
    assert vs.sorted() == sorted(ids)
    assert len(vs) == len(ids)


def test_voter_set_encoding_is_canonical() -> None:
    assert VoterSet.of(3, 1, 2).encode() == VoterSet.of(1, 2, 3).encode()


@pytest.mark.parametrize(("n", "majority"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4)])
def test_voter_set_majority(n: int, majority: int) -> None:
    assert VoterSet.of(*range(n)).majority() == majority


def test_voter_set_contains() -> None:
    vs = VoterSet.of(1, 2)
    assert 1 in vs
    assert 3 not in vs
    assert "1" not in vs


@pytest.mark.parametrize(
    ("ids", "match"),
    [((), "at least one voter"), ((1, -1), "non-negative"), ((-5,), "non-negative")],
)
def test_voter_set_rejects_bad_ids(ids: tuple[int, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VoterSet(frozenset(ids))


def _vs_json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# Input that must be refused with a ValueError naming the problem.
VOTER_SET_BAD: list[Any] = [
    pytest.param(b"", "malformed voter set record", id="empty"),
    pytest.param(b"{", "malformed voter set record", id="truncated-json"),
    pytest.param(b"not json", "malformed voter set record", id="garbage"),
    pytest.param(_vs_json({"version": 0}), "malformed voter set record", id="no-voters"),
    pytest.param(_vs_json({"version": 0, "voters": 3}), "malformed voter set record", id="int"),
    pytest.param(_vs_json({"version": 0, "voters": [None]}), "malformed", id="null-id"),
    pytest.param(_vs_json({"version": 0, "voters": []}), "at least one voter", id="empty-set"),
    pytest.param(_vs_json({"version": 0, "voters": [1, -2]}), "non-negative", id="negative"),
    pytest.param(_vs_json({"version": 1, "voters": [1]}), "unknown voter set version 1", id="v1"),
    pytest.param(
        _vs_json({"version": "0", "voters": [1]}), "unknown voter set version '0'", id="v-str"
    ),
    pytest.param(_vs_json({"voters": [1]}), "unknown voter set version None", id="no-version"),
    # Known bugs: these are accepted, or fail with an unrelated exception type
    # or message.  See the reasons.
    pytest.param(
        b"[1, 2]",
        "malformed voter set record",
        id="top-level-list",
    ),
    pytest.param(
        b"null",
        "malformed voter set record",
        id="top-level-null",
    ),
    pytest.param(
        _vs_json({"version": 0, "voters": "12"}),
        "malformed voter set record",
        id="string-voters",
    ),
    pytest.param(
        _vs_json({"version": 0, "voters": [1.7, 2]}),
        "malformed voter set record",
        id="float-id",
    ),
    pytest.param(
        _vs_json({"version": 0, "voters": [True, 2]}),
        "malformed voter set record",
        id="bool-id",
    ),
    pytest.param(
        _vs_json({"version": 0, "voters": ["x"]}),
        "malformed voter set record",
        id="non-numeric-id",
    ),
    pytest.param(
        b"\xff\xfe\x00",
        "malformed voter set record",
        id="not-utf8",
    ),
]


@pytest.mark.parametrize(("data", "match"), VOTER_SET_BAD)
def test_voter_set_decode_rejects(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VoterSet.decode(data)


# -- LeaderChange ----------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        LeaderChange(1, (1, 2, 3), (1, 2)),
        LeaderChange(0, (0,), (0,)),
        LeaderChange(7, (3, 5, 7, 9, 11), (7, 9, 11)),
        LeaderChange(2, (1, 2), ()),
    ],
)
def test_leader_change_round_trip(record: LeaderChange) -> None:
    data = record.encode()
    assert LeaderChange.decode(data) == record
    obj = json.loads(data)
    assert obj["version"] == 0
    assert obj["leader_id"] == record.leader_id
    assert data == LeaderChange.decode(data).encode()  # stable encoding


def _lc(**fields: Any) -> bytes:
    base: dict[str, Any] = {"version": 0, "leader_id": 1, "voters": [1, 2], "granting_voters": [1]}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not _DROP}).encode()


_DROP = object()

LEADER_CHANGE_BAD: list[Any] = [
    pytest.param(b"", "malformed leader-change record", id="empty"),
    pytest.param(b"{]", "malformed leader-change record", id="garbage"),
    pytest.param(_lc(leader_id=_DROP), "malformed leader-change record", id="no-leader"),
    pytest.param(_lc(voters=_DROP), "malformed leader-change record", id="no-voters"),
    pytest.param(_lc(granting_voters=_DROP), "malformed leader-change record", id="no-granting"),
    pytest.param(_lc(leader_id=None), "malformed leader-change record", id="null-leader"),
    pytest.param(_lc(voters=5), "malformed leader-change record", id="int-voters"),
    pytest.param(_lc(version=2), "unknown leader-change version 2", id="v2"),
    pytest.param(_lc(version=_DROP), "unknown leader-change version None", id="no-version"),
    pytest.param(
        b"[]",
        "malformed leader-change record",
        id="top-level-list",
    ),
    pytest.param(
        _lc(voters="12"),
        "malformed leader-change record",
        id="string-voters",
    ),
    pytest.param(
        _lc(leader_id="3"),
        "malformed leader-change record",
        id="string-leader",
    ),
]


@pytest.mark.parametrize(("data", "match"), LEADER_CHANGE_BAD)
def test_leader_change_decode_rejects(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LeaderChange.decode(data)


# -- small value types -------------------------------------------------------------


def test_batch_offsets_and_size() -> None:
    b = Batch(10, 2, (b"ab", b"", b"c"))
    assert (b.end_offset, b.last_offset, b.size_bytes) == (13, 12, 3 + 3 * 16)
    assert b.kind is BatchKind.DATA


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (OffsetAndEpoch(1, 100), OffsetAndEpoch(2, 0)),  # epoch first
        (OffsetAndEpoch(2, 5), OffsetAndEpoch(2, 6)),
    ],
)
def test_offset_and_epoch_order(a: OffsetAndEpoch, b: OffsetAndEpoch) -> None:
    assert a < b
    assert not b < a


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (SnapshotId(10, 9), SnapshotId(11, 0)),  # end offset first
        (SnapshotId(10, 1), SnapshotId(10, 2)),
    ],
)
def test_snapshot_id_order(a: SnapshotId, b: SnapshotId) -> None:
    assert a < b
    assert not b < a


# -- QuorumConfig ---------------------------------------------------------------------

POSITIVE = [
    "election_timeout_ms",
    "fetch_timeout_ms",
    "election_backoff_max_ms",
    "request_timeout_ms",
    "fetch_max_bytes",
    "snapshot_chunk_bytes",
]

CONFIG_BAD: list[Any] = [
    *(pytest.param({name: 0}, name, id=f"{name}=0") for name in POSITIVE),
    *(pytest.param({name: -1}, name, id=f"{name}=-1") for name in POSITIVE),
    pytest.param({"retry_backoff_ms": -1}, "retry_backoff_ms", id="retry_backoff_ms=-1"),
    pytest.param({"fetch_max_wait_ms": -1}, "fetch_max_wait_ms", id="fetch_max_wait_ms=-1"),
    pytest.param(
        {"fetch_max_wait_ms": 2000, "fetch_timeout_ms": 2000},
        r"fetch_max_wait_ms \(2000\) must be below fetch_timeout_ms \(2000\)",
        id="wait=timeout",
    ),
    pytest.param(
        {"fetch_max_wait_ms": 900, "fetch_timeout_ms": 800}, "fetch_max_wait_ms", id="wait>timeout"
    ),
    pytest.param(
        {"fetch_max_wait_ms": 500, "request_timeout_ms": 1500, "fetch_timeout_ms": 2000},
        r"fetch_max_wait_ms \+ request_timeout_ms \(500 \+ 1500\) must be below "
        r"fetch_timeout_ms \(2000\)",
        id="wait+request=timeout",
    ),
    pytest.param({"check_quorum_factor": 0.99}, "check_quorum_factor", id="factor<1"),
    pytest.param({"check_quorum_factor": -2.0}, "check_quorum_factor", id="factor<0"),
    pytest.param(
        {"check_quorum_factor": math.nan},
        "check_quorum_factor",
        id="factor=nan",
    ),
    pytest.param(
        {"check_quorum_factor": math.inf},
        "check_quorum_factor",
        id="factor=inf",
    ),
]


@pytest.mark.parametrize(("fields", "match"), CONFIG_BAD)
def test_quorum_config_rejects(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        QuorumConfig(**fields)


@pytest.mark.parametrize("name", POSITIVE)
def test_quorum_config_message_names_the_field_and_value(name: str) -> None:
    with pytest.raises(ValueError) as info:
        QuorumConfig(**{name: -7})
    assert str(info.value) == f"{name} must be positive, got -7"


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"retry_backoff_ms": 0, "fetch_max_wait_ms": 0},
        {"fetch_max_wait_ms": 999, "fetch_timeout_ms": 2000},
        {"fetch_max_wait_ms": 500, "request_timeout_ms": 1499, "fetch_timeout_ms": 2000},
        {"check_quorum_factor": 1.0},
        {"election_timeout_ms": 1, "fetch_max_bytes": 1, "snapshot_chunk_bytes": 1},
    ],
)
def test_quorum_config_accepts(fields: dict[str, Any]) -> None:
    cfg = QuorumConfig(**fields)
    for key, value in fields.items():
        assert getattr(cfg, key) == value


@pytest.mark.parametrize(
    ("factor", "fetch_timeout", "want"),
    [(1.5, 2000, 3000), (1.0, 2000, 2000), (1.125, 2000, 2250), (2.5, 3000, 7500)],
)
def test_check_quorum_timeout(factor: float, fetch_timeout: int, want: int) -> None:
    cfg = QuorumConfig(check_quorum_factor=factor, fetch_timeout_ms=fetch_timeout)
    assert cfg.check_quorum_timeout_ms == want
