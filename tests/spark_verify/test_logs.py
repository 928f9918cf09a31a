"""Known answers for the node-export checks of ``spark_verify.logs``.

Two small multi-run datasets (one with every anomaly kind, each in its own
run; one clean, with a snapshot gap) are checked once each by
``check_exports``; the tests read those results.  Randomised logs and
changes are compared with the pure-Python rules of ``history.exports``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from history.exports import Change, LogEntry, check_changes, check_log, record_hash
from spark_verify.logs import (
    check_epochs,
    check_exports,
    check_high_watermark,
    check_lost_writes,
    check_phantom_writes,
    check_single_leader,
    first_per,
    op_witness,
    runs_of_models,
    versions_of,
)
from spark_verify.verdict import MAX_ANOMALIES, CheckResult

LOG_DDL = "run string, node long, seq long, offset long, epoch long, kind string, hash string"
CHANGES_DDL = "run string, node long, seq long, time long, epoch long, leader long, role string"
PAIRED_DDL = (
    "run string, key string, process string, f string, type string, index long, "
    "complete_index long, call long, ret long, value string, result string, error string, "
    "node long, offset long, epoch long"
)

NAMES = [
    "single-leader",
    "epoch-order",
    "log-agreement",
    "high-watermark",
    "lost-writes",
    "phantom-writes",
    "version-forks",
]

Line = tuple[str, int, int, int, int, str, str]


def h(record: str) -> str:
    return record_hash(record.encode())


def node_log(run: str, node: int, entries: Sequence[tuple[int, int, str, str]]) -> list[Line]:
    """LOG rows of one node: (offset, epoch, kind, record) in commit order."""
    return [(run, node, seq, o, e, k, h(r)) for seq, (o, e, k, r) in enumerate(entries)]


def node_changes(
    run: str, node: int, entries: Sequence[tuple[int, int | None, str]]
) -> list[tuple[Any, ...]]:
    """CHANGES rows of one node: (epoch, leader, role) in time order."""
    return [(run, node, seq, 1000 * seq, e, ld, r) for seq, (e, ld, r) in enumerate(entries)]


def op(
    run: str,
    index: int,
    f: str,
    type_: str,
    key: str,
    value: Any,
    *,
    result: Any = "same",
    offset: int | None = None,
    epoch: int | None = None,
    error: str | None = None,
) -> tuple[Any, ...]:
    """One PAIRED row (invoke at ``index``, completion right after it)."""
    res = value if result == "same" else result
    ret = None if type_ == "info" else 10 * index + 5
    return (
        run, key, str(index % 5), f, type_, index, index + 1, 10 * index, ret,
        None if value is None else json.dumps(value),
        None if res is None else json.dumps(res),
        error, 1, offset, epoch,
    )  # fmt: skip


def frames(
    spark: SparkSession,
    ops: list[tuple[Any, ...]],
    log: list[Line],
    changes: list[tuple[Any, ...]],
) -> tuple[DataFrame, DataFrame, DataFrame]:
    return (
        spark.createDataFrame(ops, schema=PAIRED_DDL),
        spark.createDataFrame(log, schema=LOG_DDL),
        spark.createDataFrame(changes, schema=CHANGES_DDL),
    )


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


# -- the dataset with every anomaly kind ---------------------------------------

DIRTY_MODELS = {"d-reg": "register", "d-logm": "log", "d-leaders": "kv"}


def dirty_rows() -> tuple[list[tuple[Any, ...]], list[Line], list[tuple[Any, ...]]]:
    log: list[Line] = []
    for n in (1, 2, 3):
        # d-reg: offset 1 was written in epoch 1 but every node has epoch 2
        # there (a lost write); offset 7 is a control record (a read naming
        # it is a phantom version); offset 20 is in no node's log.
        log += node_log(
            "d-reg",
            n,
            [
                (0, 2, "control", "c2"),
                (1, 2, "data", "other"),
                (4, 2, "data", "v2"),
                (7, 2, "control", "c7"),
                (8, 2, "data", "v8"),
            ],
        )
    for n in (1, 2):
        # d-logm: write ["a", "b"] at 1; offset 2 holds a record no one
        # wrote; offset 3 a record of a failed write.
        log += node_log(
            "d-logm",
            n,
            [(0, 1, "control", "c"), (1, 1, "data", "a"), (2, 1, "data", "B"), (3, 1, "data", "f")],
        )
    # d-log: two versions of offset 5 (epochs differ) and of offset 6 (hashes differ).
    log += node_log("d-log", 1, [(5, 2, "data", "x"), (6, 2, "data", "z")])
    log += node_log("d-log", 2, [(5, 2, "data", "x"), (6, 2, "data", "w")])
    log += node_log("d-log", 3, [(5, 3, "data", "y")])
    # d-hw: node 1 commits offset 1 twice, then again after 2; node 2's epoch goes down.
    log += node_log(
        "d-hw",
        1,
        [
            (0, 1, "data", "p"),
            (1, 1, "data", "q"),
            (1, 1, "data", "q"),  # committed twice
            (2, 1, "data", "r"),
            (1, 1, "data", "q"),  # the high watermark went back
        ],
    )
    log += node_log("d-hw", 2, [(10, 2, "data", "s"), (11, 1, "data", "t")])

    ops = [
        op("d-reg", 0, "write", "ok", "k1", "v1", offset=1, epoch=1),  # lost
        op("d-reg", 2, "write", "ok", "k2", "v2", offset=4, epoch=2),  # shares offset 4
        op("d-reg", 4, "cas", "ok", "k3", ["v0", "v3"], offset=4, epoch=2),  # with this one
        op("d-reg", 6, "write", "ok", "k1", "v8", offset=8, epoch=2),
        op("d-reg", 8, "write", "ok", "k4", "v20", offset=20, epoch=2),  # in a snapshot
        op("d-reg", 10, "read", "ok", "k1", None, result="v7", offset=7, epoch=2),  # phantom
        op("d-reg", 12, "read", "ok", "k4", None, result="v20", offset=20, epoch=2),  # unknown
        op("d-reg", 14, "read", "ok", "k1", None, result="v8", offset=8, epoch=2),
        op("d-logm", 0, "write", "ok", "log", ["a", "b"], offset=1, epoch=1),  # b lost
        op("d-logm", 2, "write", "fail", "log", ["f"], error="superseded"),  # yet committed
    ]
    changes: list[tuple[Any, ...]] = []
    # d-leaders: nodes 1 and 2 both lead epoch 3 (node 1 twice: its first
    # line is the witness); in epoch 4 node 3 follows 1 while node 2 follows 3.
    changes += node_changes(
        "d-leaders", 1, [(3, None, "candidate"), (3, 1, "leader"), (3, 1, "leader")]
    )
    changes += node_changes("d-leaders", 2, [(3, 2, "leader"), (4, 3, "follower")])
    changes += node_changes("d-leaders", 3, [(3, 2, "follower"), (4, 1, "follower")])
    # d-epochs: node 1's epoch goes 1, 2, 1, 2: one decrease.
    changes += node_changes(
        "d-epochs",
        1,
        [(1, None, "candidate"), (2, None, "candidate"), (1, None, "candidate"), (2, 1, "leader")],
    )
    return ops, log, changes


# -- the clean dataset ---------------------------------------------------------

CLEAN_MODELS = {"c-reg": "register", "c-log": "log", "c-topics": "topics"}


def clean_rows() -> tuple[list[tuple[Any, ...]], list[Line], list[tuple[Any, ...]]]:
    log: list[Line] = []
    full = [
        (0, 1, "control", "c1"),
        (1, 1, "data", "v1"),
        (2, 1, "data", "v2"),
        (3, 2, "control", "c2"),
        (4, 2, "data", "v3"),
        # offsets 10 and 11 are in no node's log: every node got them as a snapshot
        (12, 3, "control", "c3"),
    ]
    log += node_log("c-reg", 1, full)
    log += node_log("c-reg", 2, full)
    log += node_log("c-reg", 3, full[3:])  # offsets 0 to 2 came in a snapshot
    for n in (1, 2, 3):
        # offsets 4 to 6 are in no node's log (a snapshot): the write of "x", "y" at 5
        log += node_log(
            "c-log",
            n,
            [
                (0, 1, "control", "c"),
                (1, 1, "data", "a"),
                (2, 1, "data", "b"),
                (3, 1, "data", "c"),
                (7, 2, "control", "c2"),
            ],
        )
    ops = [
        op("c-reg", 0, "write", "ok", "k1", "v1", offset=1, epoch=1),
        op("c-reg", 2, "write", "ok", "k2", "v2", offset=2, epoch=1),
        op("c-reg", 4, "read", "ok", "k1", None, result="v1", offset=1, epoch=1),
        op("c-reg", 6, "cas", "ok", "k1", ["v1", "v3"], offset=4, epoch=2),
        op("c-reg", 8, "cas", "fail", "k2", ["v9", "v4"], offset=5, epoch=2, error="precondition"),
        op("c-reg", 10, "write", "info", "k2", "v5", error="timeout"),
        op("c-reg", 12, "write", "ok", "k3", "v9", offset=10, epoch=2),  # in the snapshot
        op("c-reg", 14, "read", "ok", "k3", None, result="v9", offset=10, epoch=2),
        op("c-reg", 16, "read", "ok", "k4", None, result=None),
        op("c-log", 0, "write", "ok", "log", ["a", "b"], offset=1, epoch=1),
        op("c-log", 2, "write", "info", "log", ["c"], error="indeterminate"),  # committed
        op("c-log", 4, "write", "fail", "log", ["d"], error="not-leader"),  # not committed
        op("c-log", 6, "write", "ok", "log", ["x", "y"], offset=5, epoch=1),  # in the snapshot
        op("c-topics", 0, "create-topic", "ok", "t1", {"partitions": 1, "replication_factor": 1}),
    ]
    changes: list[tuple[Any, ...]] = []
    changes += node_changes(
        "c-reg", 1, [(1, 2, "follower"), (2, None, "candidate"), (2, 1, "leader")]
    )
    changes += node_changes(
        "c-reg", 2, [(1, None, "candidate"), (1, 2, "leader"), (2, None, "unattached")]
    )
    changes += node_changes("c-reg", 3, [(1, 2, "follower"), (2, 1, "follower")])
    return ops, log, changes


@pytest.fixture(scope="module")
def dirty(spark: SparkSession) -> dict[str, CheckResult]:
    return by_name(check_exports(*frames(spark, *dirty_rows()), DIRTY_MODELS))


@pytest.fixture(scope="module")
def clean_frames(spark: SparkSession) -> tuple[DataFrame, DataFrame, DataFrame]:
    return frames(spark, *clean_rows())


@pytest.fixture(scope="module")
def clean(clean_frames: tuple[DataFrame, DataFrame, DataFrame]) -> dict[str, CheckResult]:
    return by_name(check_exports(*clean_frames, CLEAN_MODELS))


def kinds(result: CheckResult) -> list[tuple[str | None, str]]:
    return [(a.run, a.kind) for a in result.anomalies]


# -- pure helpers ---------------------------------------------------------------


def test_runs_of_models() -> None:
    assert runs_of_models("log", ["log"]) is None
    assert runs_of_models("kv", ["log"]) == []
    assert runs_of_models({"b": "kv", "a": "register", "c": "log"}, ["register", "kv"]) == [
        "a",
        "b",
    ]
    with pytest.raises(ValueError, match="model of run 'x' must be one of"):
        runs_of_models({"x": "jepsen-queue"}, ["log"])
    with pytest.raises(ValueError, match="model must be one of"):
        runs_of_models("Register", ["register"])


def test_op_witness_parses_value_and_result() -> None:
    values = op("r", 3, "cas", "ok", "k", ["a", None], offset=1, epoch=2)
    row = dict(zip(PAIRED_DDL_NAMES, values, strict=True))
    w = op_witness(row)
    assert w["value"] == ["a", None] and w["result"] == ["a", None]
    assert w["index"] == 3 and w["offset"] == 1
    with pytest.raises(ValueError, match="value of op 3 of run 'r' is not JSON"):
        op_witness({**row, "value": "a"})


def test_first_per_and_versions_of() -> None:
    lines = [
        dict(zip(LOG_NAMES, row, strict=True))
        for row in [
            ("r", 3, 0, 5, 2, "data", "x"),
            ("r", 1, 4, 5, 2, "data", "x"),
            ("r", 1, 2, 5, 2, "data", "x"),
            ("r", 2, 0, 5, 1, "data", "y"),
        ]
    ]
    assert [(d["node"], d["seq"]) for d in first_per(lines, ("epoch",), ("node", "seq"))] == [
        (2, 0),
        (1, 2),
    ]
    assert [(d["epoch"], d["node"], d["seq"], d["nodes"]) for d in versions_of(lines)] == [
        (1, 2, 0, [2]),
        (2, 1, 2, [1, 3]),
    ]
    with_null: list[dict[str, Any]] = [{"leader": None, "seq": 1}, {"leader": 2, "seq": 0}]
    assert [d["leader"] for d in first_per(with_null, ("leader",), ("seq",))] == [None, 2]


LOG_NAMES = [part.split()[0] for part in LOG_DDL.split(", ")]
PAIRED_DDL_NAMES = [part.split()[0] for part in PAIRED_DDL.split(", ")]


# -- known answers --------------------------------------------------------------


@pytest.mark.spark
def test_runs_every_check_in_order(dirty: dict[str, CheckResult]) -> None:
    assert list(dirty) == NAMES


@pytest.mark.spark
def test_clean_exports_pass_every_check(clean: dict[str, CheckResult]) -> None:
    assert {n: (r.valid, r.count) for n, r in clean.items()} == dict.fromkeys(NAMES, (True, 0))
    # Writes and a read of offsets every node got as a snapshot: not lost, not phantom.
    assert clean["lost-writes"].detail == {
        "applicable": True,
        "writes": 6,
        "checked": 4,
        "uncheckable": 2,
    }
    assert clean["phantom-writes"].detail == {
        "applicable": True,
        "data_records": 3,
        "reads": 2,
        "checked": 1,
        "uncheckable": 1,
    }


@pytest.mark.spark
def test_two_leaders_and_leader_disagreement(dirty: dict[str, CheckResult]) -> None:
    r = dirty["single-leader"]
    assert (r.valid, r.count) == (False, 2)
    assert r.detail == {"kinds": {"two-leaders": 1, "leader-disagreement": 1}}
    two, told = r.anomalies
    assert (two.run, two.kind) == ("d-leaders", "two-leaders")
    assert [(w["node"], w["seq"], w["epoch"], w["role"]) for w in two.witness] == [
        (1, 1, 3, "leader"),
        (2, 0, 3, "leader"),
    ]
    assert told.kind == "leader-disagreement"
    assert [(w["node"], w["epoch"], w["leader"]) for w in told.witness] == [(2, 4, 3), (3, 4, 1)]


@pytest.mark.spark
def test_epoch_going_down(dirty: dict[str, CheckResult]) -> None:
    r = dirty["epoch-order"]
    assert (r.valid, r.count, kinds(r)) == (False, 1, [("d-epochs", "epoch-order")])
    a = r.anomalies[0]
    assert a.node == 1
    assert [(w["seq"], w["epoch"]) for w in a.witness] == [(1, 2), (2, 1)]


@pytest.mark.spark
def test_committed_divergence(dirty: dict[str, CheckResult]) -> None:
    r = dirty["log-agreement"]
    assert (r.valid, r.count) == (False, 2)
    assert kinds(r) == [("d-log", "committed-divergence")] * 2
    at5, at6 = r.anomalies
    assert [(w["offset"], w["epoch"], w["hash"], w["nodes"]) for w in at5.witness] == [
        (5, 2, h("x"), [1, 2]),
        (5, 3, h("y"), [3]),
    ]
    assert sorted((w["hash"], tuple(w["nodes"])) for w in at6.witness) == [
        (h("w"), (2,)),
        (h("z"), (1,)),
    ]


@pytest.mark.spark
def test_high_watermark_back_and_epoch_down(dirty: dict[str, CheckResult]) -> None:
    r = dirty["high-watermark"]
    assert (r.valid, r.count) == (False, 3)
    assert r.detail == {"kinds": {"offset-order": 2, "epoch-order": 1}}
    assert [(a.run, a.node, a.kind) for a in r.anomalies] == [
        ("d-hw", 1, "offset-order"),
        ("d-hw", 1, "offset-order"),
        ("d-hw", 2, "epoch-order"),
    ]
    twice, back, down = r.anomalies
    assert [(w["seq"], w["offset"]) for w in twice.witness] == [(1, 1), (2, 1)]
    assert [(w["seq"], w["offset"]) for w in back.witness] == [(3, 2), (4, 1)]
    assert [(w["offset"], w["epoch"]) for w in down.witness] == [(10, 2), (11, 1)]


@pytest.mark.spark
def test_lost_writes_register_and_log(dirty: dict[str, CheckResult]) -> None:
    r = dirty["lost-writes"]
    assert (r.valid, r.count) == (False, 2)
    assert r.detail == {"applicable": True, "writes": 6, "checked": 5, "uncheckable": 1}
    assert [(a.run, a.kind, a.key) for a in r.anomalies] == [
        ("d-logm", "lost-write", "log"),
        ("d-reg", "lost-write", "k1"),
    ]
    logm, reg = r.anomalies
    # The log write's second record ("b", at offset 2) is not there.
    write, *lines = logm.witness
    assert (write["index"], write["value"]) == (0, ["a", "b"])
    assert [(w["node"], w["offset"], w["hash"]) for w in lines] == [
        (1, 2, h("B")),
        (2, 2, h("B")),
    ]
    write, *lines = reg.witness
    assert (write["value"], write["result"], write["offset"], write["epoch"]) == ("v1", "v1", 1, 1)
    assert [(w["node"], w["offset"], w["epoch"]) for w in lines] == [
        (1, 1, 2),
        (2, 1, 2),
        (3, 1, 2),
    ]


@pytest.mark.spark
def test_phantom_records_and_versions(dirty: dict[str, CheckResult]) -> None:
    r = dirty["phantom-writes"]
    assert (r.valid, r.count) == (False, 3)
    assert kinds(r) == [
        ("d-logm", "phantom-record"),
        ("d-logm", "failed-write-committed"),
        ("d-reg", "phantom-version"),
    ]
    record, failed, version = r.anomalies
    assert [(w["offset"], w["hash"], w["nodes"]) for w in record.witness] == [(2, h("B"), [1, 2])]
    failed_op, line = failed.witness
    assert (failed_op["type"], failed_op["value"], line["offset"], line["hash"]) == (
        "fail",
        ["f"],
        3,
        h("f"),
    )
    read, *lines = version.witness
    assert (read["f"], read["result"], read["offset"]) == ("read", "v7", 7)
    assert {(w["offset"], w["kind"]) for w in lines} == {(7, "control")}
    assert r.detail["uncheckable"] == 1  # the read of offset 20


@pytest.mark.spark
def test_shared_version(dirty: dict[str, CheckResult]) -> None:
    r = dirty["version-forks"]
    assert (r.valid, r.count, kinds(r)) == (False, 1, [("d-reg", "shared-version")])
    assert [(w["index"], w["key"], w["value"]) for w in r.anomalies[0].witness] == [
        (2, "k2", "v2"),
        (4, "k3", ["v0", "v3"]),
    ]


@pytest.mark.spark
def test_topics_runs_are_not_applicable(
    clean_frames: tuple[DataFrame, DataFrame, DataFrame],
) -> None:
    ops, log, _ = clean_frames
    for check in (check_lost_writes, check_phantom_writes):
        r = check(ops, log, "topics")
        assert (r.valid, r.count, r.detail) == (True, 0, {"applicable": False})


@pytest.mark.spark
def test_malformed_log_write_is_refused(spark: SparkSession) -> None:
    ops, log, _ = frames(spark, [op("m", 0, "write", "ok", "log", "a", offset=1, epoch=1)], [], [])
    with pytest.raises(ValueError, match="op 0 of run 'm'.*not a non-empty JSON list of strings"):
        check_lost_writes(ops, log, "log")


@pytest.mark.spark
def test_counts_beyond_the_kept_anomalies(spark: SparkSession) -> None:
    n = MAX_ANOMALIES + 50
    rows = node_log("many", 1, [(n - i, 1, "data", str(i)) for i in range(n + 1)])
    changes = node_changes("many", 1, [(1, 1, "leader")]) + node_changes(
        "many", 2, [(1, 2, "leader")]
    )
    _, log, ch = frames(spark, [], rows, changes)
    r = check_high_watermark(log)
    assert (r.valid, r.count, len(r.anomalies)) == (False, n, MAX_ANOMALIES)
    assert r.detail == {"kinds": {"offset-order": n}}
    assert [a.witness[1]["seq"] for a in r.anomalies] == list(range(1, MAX_ANOMALIES + 1))
    assert check_single_leader(ch).count == 1


# -- agreement with history.exports ------------------------------------------------


def random_logs(rng: random.Random, runs: int) -> Iterator[tuple[str, int, list[LogEntry]]]:
    for r in range(runs):
        for node in (1, 2, 3):
            offset, epoch, entries = 0, 1, []
            for _ in range(rng.randrange(0, 7)):
                offset += rng.choice([-2, -1, 0, 1, 1, 1, 3])
                epoch += rng.choice([-1, 0, 0, 1])
                entries.append(
                    LogEntry(node, max(offset, 0), max(epoch, 0), "data", h(str(rng.random())))
                )
            yield f"run-{r}", node, entries


def random_changes(rng: random.Random, runs: int) -> Iterator[tuple[str, int, list[Change]]]:
    for r in range(runs):
        for node in (1, 2, 3):
            epoch, out = 1, []
            for t in range(rng.randrange(0, 7)):
                epoch = max(0, epoch + rng.choice([-1, 0, 1, 1]))
                out.append(Change(node, t, epoch, None, "candidate"))
            yield f"run-{r}", node, out


@pytest.mark.spark
def test_agrees_with_chaos_exports(spark: SparkSession) -> None:
    rng = random.Random(20240611)
    logs = list(random_logs(rng, 5))
    changes = list(random_changes(rng, 5))
    want_log = {
        (run, node, p.index, p.kind)
        for run, node, entries in logs
        for p in check_log(entries, node)
        if p.kind in ("offset-order", "epoch-order")
    }
    want_changes = {
        (run, node, p.index, p.kind)
        for run, node, entries in changes
        for p in check_changes(entries, node)
        if p.kind == "epoch-order"
    }
    assert not {p.kind for _, node, es in logs for p in check_log(es, node)} - {
        "offset-order",
        "epoch-order",
    }
    assert want_log and want_changes and len(want_log) < MAX_ANOMALIES
    log_rows = [
        (run, node, seq, e.offset, e.epoch, e.kind, e.hash)
        for run, node, entries in logs
        for seq, e in enumerate(entries)
    ]
    change_rows = [
        (run, node, seq, c.time, c.epoch, c.leader, c.role)
        for run, node, entries in changes
        for seq, c in enumerate(entries)
    ]
    _, log, ch = frames(spark, [], log_rows, change_rows)
    got_log = check_high_watermark(log)
    got_changes = check_epochs(ch)
    assert {(a.run, a.node, a.witness[1]["seq"], a.kind) for a in got_log.anomalies} == want_log
    assert got_log.count == len(want_log)
    assert {
        (a.run, a.node, a.witness[1]["seq"], a.kind) for a in got_changes.anomalies
    } == want_changes
    assert got_changes.count == len(want_changes)
