"""Pairing in Spark gives what a sequential pass over the reference reader's ops
gives: the same operations, the same problems, the same fault intervals."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from history.files import NEMESIS, NEMESIS_ENDS, Op, check_well_formed, read_history, write_history
from spark_verify.load import find_runs, load_history
from spark_verify.ops import PAIRED_COLUMNS
from spark_verify.pairing import NEMESIS_COLUMNS, pair_ops
from tests.spark_verify.test_load import HISTORY_MODELS, doc_history, write_run

pytestmark = pytest.mark.spark

PAIRING_KINDS = (
    "unmatched-completion",
    "concurrent-invoke",
    "completion-mismatch",
    "open-invoke",
    "invoke-after-info",
    "nemesis-unended",
)


def reference_pairs(ops: list[Op], run: str) -> list[tuple[Any, ...]]:
    """PAIRED rows by a sequential pass: a completion answers the op its
    process has in flight (the one a later invoke replaced is dropped)."""
    in_flight: dict[object, Op] = {}
    out = []
    for op in ops:
        if op.type == "invoke":
            in_flight[op.process] = op
            continue
        inv = in_flight.pop(op.process, None)
        if inv is None or (inv.f, inv.key) != (op.f, op.key) or op.process == NEMESIS:
            continue
        ret = None if op.type == "info" else op.time
        out.append(
            (run, op.key, str(op.process), op.f, op.type, inv.index, op.index, inv.time, ret)
            + (inv.value, op.value, op.error, op.node, op.offset, op.epoch)
        )
    return out


def reference_faults(ops: list[Op], run: str) -> list[tuple[Any, ...]]:
    """(run, f, start, end, index, type) of each fault that started: per
    target, the first later ok op that ends it; the fault ends with the
    last of its targets."""
    in_flight: dict[object, Op] = {}
    done: list[tuple[Op, Op]] = []
    for op in ops:
        if op.process != NEMESIS:
            continue
        if op.type == "invoke":
            in_flight[op.process] = op
        elif (inv := in_flight.pop(op.process, None)) is not None and inv.f == op.f:
            done.append((inv, op))
    out = []
    for i, (inv, comp) in enumerate(done):
        if inv.f not in NEMESIS_ENDS or comp.type == "fail":
            continue
        per_node = inv.f in ("kill", "pause")
        targets = comp.value["nodes"] if per_node else [None]
        if not targets:
            continue
        ends: list[int | None] = []
        for target in targets:
            ends.append(
                next(
                    (
                        c.time
                        for _, c in done[i + 1 :]
                        if c.f == NEMESIS_ENDS[inv.f]
                        and c.type == "ok"
                        and (not per_node or target in c.value["nodes"])
                    ),
                    None,
                )
            )
        end = None if None in ends else max(e for e in ends if e is not None)
        out.append((run, inv.f, inv.time, end, inv.index, comp.type))
    return out


def random_history(seed: int, n: int = 400) -> list[Op]:
    """A history that breaks the process rules now and then: invokes while
    in flight, completions of nothing or of another f or key, invokes after
    info, faults never ended."""
    rng = random.Random(seed)
    ops: list[Op] = []
    in_flight: dict[object, Op] = {}
    t = 0

    def add(**fields: Any) -> None:
        ops.append(Op(index=len(ops), time=t, **fields))

    while len(ops) < n:
        t += rng.randint(0, 3)
        if rng.random() < 0.15:
            last = in_flight.get(NEMESIS)
            if last is None or rng.random() < 0.05:
                f = rng.choice(["kill", "start", "pause", "resume", "partition", "packet", "heal"])
                value: Any = {"nodes": rng.sample([1, 2, 3], rng.randint(1, 2))}
                if f == "partition":
                    value = {"groups": [[1], [2, 3]], "kind": "halves"}
                elif f in ("packet", "heal"):
                    value = {}
                add(type="invoke", process=NEMESIS, f=f, value=value)
                in_flight[NEMESIS] = ops[-1]
            else:
                kind = rng.choice(["ok", "ok", "ok", "info", "fail"])
                error = {"ok": None, "info": "timeout", "fail": "no-effect"}[kind]
                add(type=kind, process=NEMESIS, f=last.f, value=last.value, error=error)
                del in_flight[NEMESIS]
            continue
        process = rng.randrange(6)
        inv = in_flight.get(process)
        if inv is None or rng.random() < 0.05:
            f = rng.choice(["read", "write"])
            add(
                type="invoke",
                process=process,
                f=f,
                key=rng.choice(["a", "b"]),
                value=None if f == "read" else t,
            )
            in_flight[process] = ops[-1]
        else:
            kind = rng.choice(["ok", "ok", "fail", "info"])
            f, key = inv.f, inv.key
            if rng.random() < 0.05:
                f, key = ("read", "b") if (f, key) != ("read", "b") else ("write", "a")
            ok = kind == "ok"
            add(
                type=kind,
                process=process,
                f=f,
                key=key,
                value=inv.value,
                error=None if ok else "timeout",
                node=rng.choice([None, 1, 2]),
                offset=len(ops) if ok else None,
                epoch=1 if ok else None,
            )
            if rng.random() < 0.9:
                del in_flight[process]
    return ops


def _completion(ops: list[Op], index: int) -> int:
    """The index of the completion of the nemesis op invoked at ``index``."""
    return next(op.index for op in ops[index + 1 :] if op.process == NEMESIS)


def spark_pairs(df: Any) -> list[tuple[Any, ...]]:
    out = []
    for r in df.orderBy("run", "index").collect():
        row = [r[n] for n in PAIRED_COLUMNS]
        for i in (9, 10):  # value, result: compare parsed
            row[i] = None if row[i] is None else json.loads(row[i])
        out.append(tuple(row))
    return out


def test_random_histories_pair_as_the_reference_pairs(spark: SparkSession, tmp_path: Path) -> None:
    histories = {f"seed-{seed}": random_history(seed) for seed in range(4)}
    for name, ops in histories.items():
        (tmp_path / name).mkdir()
        write_history(tmp_path / name / "history.jsonl", ops)
        (tmp_path / name / "config.json").write_text('{"model": "register"}')
    paired = pair_ops(load_history(spark, find_runs([tmp_path])))
    assert paired.ops.columns == list(PAIRED_COLUMNS)
    assert paired.nemesis.columns == list(NEMESIS_COLUMNS)
    expected_ops, expected_problems, expected_faults = [], set(), []
    for name in histories:
        read = read_history(tmp_path / name / "history.jsonl")
        expected_ops += reference_pairs(read, name)
        expected_problems |= {
            (name, p.index, p.kind) for p in check_well_formed(read) if p.kind in PAIRING_KINDS
        }
        expected_faults += reference_faults(read, name)
    assert spark_pairs(paired.ops) == sorted(expected_ops, key=lambda r: (r[0], r[5]))
    problems = paired.problems.collect()
    got = {(p["run"], p["index"], p["kind"]) for p in problems}
    # The reference reports a fault that is never ended once per (f, node)
    # still in force (the first such fault); pairing reports each fault.
    unended = {(r[0], r[4], r[5]) for r in expected_faults if r[3] is None}
    assert {p for p in got if p[2] == "nemesis-unended"} == {
        (run, _completion(histories[run], index), "nemesis-unended") for run, index, _ in unended
    }
    assert {p for p in expected_problems if p[2] == "nemesis-unended"} <= got
    assert {p for p in got if p[2] != "nemesis-unended"} == {
        p for p in expected_problems if p[2] != "nemesis-unended"
    }
    # Every kind shows up in these histories, so each was compared.
    assert {kind for _, _, kind in expected_problems} == set(PAIRING_KINDS)
    assert all(p["line"] for p in problems)
    faults = paired.nemesis.collect()
    assert {r[3] is None for r in expected_faults} == {True, False}  # ended and not
    assert sorted(
        (r["run"], r["f"], r["start"], r["end"], r["index"], r["type"]) for r in faults
    ) == sorted(expected_faults)


def test_doc_histories_pair_without_problems(spark: SparkSession, tmp_path: Path) -> None:
    for model in HISTORY_MODELS:
        write_run(tmp_path, model, doc_history(model), model=model)
    paired = pair_ops(load_history(spark, find_runs([tmp_path])))
    assert paired.problems.count() == 0
    expected = sorted(
        (row for m in HISTORY_MODELS for row in reference_pairs(_read(tmp_path, m), m)),
        key=lambda r: (r[0], r[5]),
    )
    assert spark_pairs(paired.ops) == expected
    register = {r["index"]: r for r in paired.ops.where("run = 'register'").collect()}
    # The timed-out cas: info, open-ended, its value kept as JSON text.
    cas = register[4]
    assert (cas["type"], cas["complete_index"], cas["call"], cas["ret"]) == (
        "info",
        8,
        6000000,
        None,
    )
    assert (cas["value"], cas["result"], cas["error"], cas["node"]) == (
        '["v0-1","v2-1"]',
        '["v0-1","v2-1"]',
        "timeout",
        2,
    )
    read = register[16]
    assert (read["value"], read["result"], read["offset"], read["epoch"]) == (None, '"v2-1"', 8, 2)
    assert [tuple(r) for r in paired.nemesis.collect()] == [
        ("register", "kill", None, "[2]", 6100000, 2500000000, '{"nodes":[2]}', 5, "ok")
    ]


def _read(root: Path, run: str) -> list[Op]:
    return read_history(root / run / "history.jsonl")


BAD = [
    '{"index":0,"time":0,"type":"invoke","process":0,"f":"write","key":"k","value":"a"}',
    '{"index":1,"time":1,"type":"ok","process":1,"f":"read","key":"k","value":null}',
    '{"index":2,"time":2,"type":"invoke","process":0,"f":"write","key":"k","value":"b"}',
    '{"index":3,"time":3,"type":"ok","process":0,"f":"read","key":"k","value":"b"}',
    '{"index":4,"time":4,"type":"invoke","process":2,"f":"write","key":"k","value":"c"}',
    '{"index":5,"time":5,"type":"info","process":2,"f":"write","key":"k","value":"c",'
    '"error":"timeout"}',
    '{"index":6,"time":6,"type":"invoke","process":2,"f":"read","key":"k","value":null}',
    '{"index":7,"time":7,"type":"invoke","process":"nemesis","f":"kill","value":{"nodes":[1,2]}}',
    '{"index":8,"time":8,"type":"ok","process":"nemesis","f":"kill","value":{"nodes":[1,2]}}',
    '{"index":9,"time":9,"type":"invoke","process":"nemesis","f":"start","value":{"nodes":[1]}}',
    '{"index":10,"time":10,"type":"ok","process":"nemesis","f":"start","value":{"nodes":[1]}}',
    '{"index":11,"time":11,"type":"invoke","process":"nemesis","f":"partition",'
    '"value":{"groups":[[1],[2,3]],"kind":"halves"}}',
    '{"index":12,"time":12,"type":"info","process":"nemesis","f":"partition",'
    '"value":{"groups":[[1],[2,3]],"kind":"halves"},"error":"timeout"}',
    '{"index":13,"time":13,"type":"invoke","process":"nemesis","f":"heal","value":{}}',
    '{"index":14,"time":14,"type":"ok","process":"nemesis","f":"heal","value":{}}',
    '{"index":15,"time":15,"type":"invoke","process":"nemesis","f":"pause","value":{"nodes":[3]}}',
    '{"index":16,"time":16,"type":"fail","process":"nemesis","f":"pause","value":{"nodes":[3]},'
    '"error":"no-effect"}',
]


def test_each_pairing_problem_names_its_op_and_quotes_its_lines(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(BAD) + "\n")
    paired = pair_ops(load_history(spark, find_runs([path], model="register")))
    got = sorted(
        (p["index"], p["kind"], p["message"], p["line"]) for p in paired.problems.collect()
    )
    assert got == [
        (1, "unmatched-completion", "ok by process 1 with no invoke in flight", BAD[1]),
        (
            2,
            "concurrent-invoke",
            "process 0 invokes write while op 0 (write) is in flight",
            f"{BAD[0]}\n{BAD[2]}",
        ),
        (
            3,
            "completion-mismatch",
            "ok of f=read key=k completes op 2, an invoke of f=write key=k",
            f"{BAD[2]}\n{BAD[3]}",
        ),
        (
            6,
            "invoke-after-info",
            "process 2 invokes after its info at op 5 (a process retired by info never "
            "invokes again)",
            f"{BAD[5]}\n{BAD[6]}",
        ),
        (
            6,
            "open-invoke",
            "process 2's read was never completed (a run ends by completing each op in "
            "flight as info)",
            BAD[6],
        ),
        (
            8,
            "nemesis-unended",
            "kill of node(s) 2 is never ended by a start (every fault that started must be "
            "ended before the history ends)",
            BAD[8],
        ),
    ]
    reference = check_well_formed(read_history(path))
    assert sorted({(p.index, p.kind) for p in reference}) == [(i, k) for i, k, _, _ in got]
    # Only the write completed by info is well paired.
    assert [(r["index"], r["complete_index"], r["ret"]) for r in paired.ops.collect()] == [
        (4, 5, None)
    ]
    assert sorted(tuple(r) for r in paired.nemesis.collect()) == [
        ("bad", "kill", None, "[1,2]", 7, None, '{"nodes":[1,2]}', 7, "ok"),
        (
            "bad",
            "partition",
            "halves",
            "[[1],[2,3]]",
            11,
            14,
            '{"groups":[[1],[2,3]],"kind":"halves"}',
            11,
            "info",
        ),
    ]
