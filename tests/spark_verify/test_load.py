"""Reading runs into Spark: finding run inputs, parsing history lines, per-line
problems and node exports, checked against the reference reader in chaos/."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from history.files import read_history
from spark_verify.load import (
    HISTORY_COLUMNS,
    KNOWN_MODELS,
    RunInputError,
    find_runs,
    history_problems,
    load_history,
    load_node_exports,
    spark_path,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "history-format.md").read_text()
EXAMPLES: dict[str, str] = dict(
    re.findall(r"<!-- example: ([a-z ]+) -->\n```jsonl\n(.*?)```", DOC, flags=re.DOTALL)
)
HISTORY_MODELS = ("register", "kv", "topics", "log")


def doc_history(model: str) -> str:
    """The text of the docs' example history of ``model``."""
    return EXAMPLES[f"history {model}"]


def write_run(
    root: Path,
    name: str,
    history: str,
    *,
    model: str | None = "register",
    exports: dict[int, tuple[str, str]] | None = None,
) -> Path:
    """A run folder: config.json (with ``model`` unless None), history.jsonl
    and, per node, (log.jsonl, changes.jsonl) texts."""
    run = root / name
    run.mkdir(parents=True)
    config: dict[str, Any] = {"format": 1, "name": name, "nodes": sorted(exports or {})}
    if model is not None:
        config["model"] = model
    (run / "config.json").write_text(json.dumps(config, indent=2))
    (run / "history.jsonl").write_text(history)
    for node, (log, changes) in (exports or {}).items():
        (run / "nodes" / str(node)).mkdir(parents=True)
        (run / "nodes" / str(node) / "log.jsonl").write_text(log)
        (run / "nodes" / str(node) / "changes.jsonl").write_text(changes)
    return run


def reference_rows(path: Path, run: str) -> list[tuple[Any, ...]]:
    """What the reference reader makes of a history, in load_history's
    columns: process as text, value as parsed JSON (compared parsed, since a
    variant renders an object's keys sorted)."""
    rows = []
    for op in read_history(path):
        rows.append(
            (
                run,
                op.index,
                op.time,
                op.type,
                str(op.process),
                op.f,
                op.key,
                op.value,
                op.error,
                op.node,
                op.offset,
                op.epoch,
            )
        )
    return rows


def spark_rows(df: Any) -> list[tuple[Any, ...]]:
    names = ["run", *[n for n, _ in HISTORY_COLUMNS]]
    out = []
    for r in df.orderBy("run", "index").collect():
        row = [r[n] for n in names]
        row[7] = None if row[7] is None else json.loads(row[7])
        out.append(tuple(row))
    return out


# -- finding runs (no Spark) -----------------------------------------------------


def test_a_run_folder_gives_its_name_model_history_and_nodes(tmp_path: Path) -> None:
    run = write_run(
        tmp_path, "20260101T000000Z-a", doc_history("register"), exports={3: ("", ""), 1: ("", "")}
    )
    (run / "nodes" / "notes").mkdir()  # not a node id: ignored
    [found] = find_runs([run])
    assert found.name == "20260101T000000Z-a"
    assert found.history == run / "history.jsonl"
    assert found.fmt == "jsonl"
    assert found.model == "register"
    assert found.config is not None and found.config["name"] == found.name
    assert list(found.nodes.items()) == [(1, run / "nodes" / "1"), (3, run / "nodes" / "3")]


def test_a_folder_of_runs_gives_every_run_in_it(tmp_path: Path) -> None:
    write_run(tmp_path, "b", doc_history("kv"), model="kv")
    write_run(tmp_path, "a", doc_history("register"))
    (tmp_path / "logs").mkdir()  # not a run
    found = find_runs([tmp_path])
    assert [(r.name, r.model) for r in found] == [("a", "register"), ("b", "kv")]


def test_parquet_is_preferred_and_a_bare_file_needs_a_model(tmp_path: Path) -> None:
    run = write_run(tmp_path, "a", doc_history("register"))
    (run / "history.parquet").mkdir()
    [found] = find_runs([run])
    assert (found.fmt, found.history) == ("parquet", run / "history.parquet")
    bare = tmp_path / "jepsen.jsonl"
    bare.write_text(doc_history("kv"))
    with pytest.raises(RunInputError, match=r"jepsen\.jsonl.*--model"):
        find_runs([bare])
    [found] = find_runs([bare], model="kv")
    assert (found.name, found.fmt, found.config, found.nodes) == ("jepsen", "jsonl", None, {})
    [found] = find_runs([run], model="kv")  # model= overrides config.json
    assert found.model == "kv"


def test_bad_inputs_are_refused_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(RunInputError, match="nowhere: no such file"):
        find_runs([tmp_path / "nowhere"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RunInputError, match="empty: neither a run folder"):
        find_runs([empty])
    no_history = tmp_path / "no-history"
    no_history.mkdir()
    (no_history / "config.json").write_text('{"model": "kv"}')
    with pytest.raises(RunInputError, match="no-history: no history.jsonl or history.parquet"):
        find_runs([no_history])
    broken = write_run(tmp_path, "broken", doc_history("kv"))
    (broken / "config.json").write_text("{not json")
    with pytest.raises(RunInputError, match=r"broken/config\.json: not JSON"):
        find_runs([broken])
    (broken / "config.json").write_text("[1]")
    with pytest.raises(RunInputError, match=r"broken/config\.json: expected a JSON object"):
        find_runs([broken])
    text = tmp_path / "notes.txt"
    text.write_text("x")
    with pytest.raises(RunInputError, match="notes.txt: not a history file"):
        find_runs([text])
    with pytest.raises(RunInputError, match="no run given"):
        find_runs([])


def test_model_errors(tmp_path: Path) -> None:
    known = ", ".join(KNOWN_MODELS)
    unknown = write_run(tmp_path / "u", "run", doc_history("kv"), model="bank")
    with pytest.raises(RunInputError, match=f"unknown model 'bank'; known models: {known}"):
        find_runs([unknown])
    none = write_run(tmp_path / "n", "run", doc_history("kv"), model=None)
    with pytest.raises(RunInputError, match="no model in config.json.*pass --model"):
        find_runs([none])
    assert find_runs([none], model="kv")[0].model == "kv"
    with pytest.raises(RunInputError, match="--model: unknown model 'cas'"):
        find_runs([none], model="cas")
    assert find_runs([unknown], model="bank", known_models=("bank",))[0].model == "bank"


def test_two_runs_with_one_name_are_refused(tmp_path: Path) -> None:
    a = write_run(tmp_path / "x", "same", doc_history("kv"))
    b = write_run(tmp_path / "y", "same", doc_history("kv"))
    with pytest.raises(RunInputError, match="two runs named 'same'"):
        find_runs([a, b])


def test_spark_paths_escape_glob_characters(tmp_path: Path) -> None:
    assert spark_path(tmp_path / "a[1]{b}*?.jsonl").endswith(r"a\[1\]\{b\}\*\?.jsonl")


# -- loading (Spark) -------------------------------------------------------------


BAD_LINES = [
    # 1: fine
    '{"index":0,"time":1,"type":"invoke","process":0,"f":"write","key":"k","value":"a"}',
    # 2: a typo'd field
    '{"index":1,"time":2,"type":"ok","process":0,"f":"write","key":"k","value":"a","proces":0}',
    "",  # 3: blank
    "{nope",  # 4
    "[1, 2]",  # 5
    # 6: wrong types everywhere
    '{"index":"5","time":1.5,"type":"bogus","process":-1,"f":"","key":3,"value":null,"node":true}',
    # 7: errors and versions in the wrong places, and a nemesis op with a key
    '{"index":6,"time":3,"type":"ok","process":"nemesis","f":"kill","key":"k","value":[1],'
    '"error":"x","offset":1,"epoch":1}',
    # 8: an info without error, and an invoke with a version
    '{"index":7,"time":4,"type":"info","process":2,"f":"read","key":"k","value":null}',
    '{"index":8,"time":5,"type":"invoke","process":3,"f":"read","key":"k","value":null,"epoch":1}',
    # 10: missing fields, and a wrong index
    '{"index":12,"type":"invoke","f":"read","value":null}',
    # 11: a kill without nodes
    '{"index":10,"time":6,"type":"invoke","process":"nemesis","f":"kill","value":{"n":[1]}}',
    # 12: written as a writer writes (the fast path), but out of range
    '{"index":11,"time":-3,"type":"bogus","process":4,"f":"read","value":null}',
    # 13: fine, though not as a kq writer writes it (another tool's order)
    '{"process": 4, "type": "invoke", "f": "read", "value": null, "index": 12, "time": 7}',
]


@pytest.mark.spark
def test_doc_histories_load_as_the_reference_reads_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    for model in HISTORY_MODELS:
        write_run(tmp_path, model, doc_history(model), model=model)
    runs = find_runs([tmp_path])
    df = load_history(spark, runs)
    assert df.columns == ["run", *[n for n, _ in HISTORY_COLUMNS], "line", "file_line"]
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields][1:12] == list(
        HISTORY_COLUMNS
    )
    expected = sorted(
        row
        for model in HISTORY_MODELS
        for row in reference_rows(tmp_path / model / "history.jsonl", model)
    )
    assert spark_rows(df) == expected
    raw = {
        (r["run"], r["index"]): (r["value"], r["line"], r["file_line"])
        for r in df.select("run", "index", "value", "line", "file_line").collect()
    }
    # A string value keeps its quotes; a JSON null is SQL NULL; the raw line
    # is kept as it is in the file.
    assert raw[("register", 0)][0] == '"v0-1"'
    assert raw[("register", 1)][0] is None
    assert raw[("register", 4)][0] == '["v0-1","v2-1"]'
    assert raw[("topics", 0)][0] == '{"incarnation":"9bFlIkpYt5HfavHYMD5hzQ"}'
    lines = doc_history("register").splitlines()
    assert all(raw[("register", i)][1:] == (lines[i], i + 1) for i in range(len(lines)))
    assert history_problems(df).count() == 0


@pytest.mark.spark
def test_history_problems_name_each_bad_line(spark: SparkSession, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(BAD_LINES) + "\n")
    df = load_history(spark, find_runs([bad], model="register"))
    got = sorted(
        ((r["kind"], r["index"], r["message"], r["line"]) for r in history_problems(df).collect()),
        key=lambda p: BAD_LINES.index(p[3]),
    )
    by_line = [(BAD_LINES.index(line), kind, index, message) for kind, index, message, line in got]
    assert [(i + 1, kind, index) for i, kind, index, _ in by_line] == [
        (2, "invalid-op", 1),
        (3, "not-json", None),
        (4, "not-json", None),
        (5, "not-json", None),
        (6, "invalid-op", None),
        (7, "invalid-op", 6),
        (8, "invalid-op", 7),
        (9, "invalid-op", 8),
        (10, "invalid-op", 12),
        (10, "index", 12),
        (11, "invalid-op", 10),
        (12, "invalid-op", 11),
    ]
    messages = [m for _, _, _, m in by_line]
    assert messages[0] == "unknown field(s) proces"
    assert messages[1:4] == ["line 3: blank line", "line 4: not JSON", "line 5: not a JSON object"]
    for part in (
        'index must be an integer >= 0, got "5"',
        "time must be an integer >= 0, got 1.5",
        'type must be one of invoke, ok, fail, info, got "bogus"',
        "process must be an integer >= 0 or 'nemesis', got -1",
        'f must be a non-empty string, got ""',
        "key must be a string, got 3",
        "node must be an integer >= 0, got true",
    ):
        assert part in messages[4]
    for part in (
        "an ok carries no error, got x",
        "a nemesis op carries no key, offset or epoch",
        "a nemesis op's value must be an object, got [1]",
    ):
        assert part in messages[5]
    assert messages[6] == "an info needs an error saying why"
    assert messages[7] == "an invoke carries no offset or epoch (versions come with completions)"
    assert messages[8] == "missing field(s) time, process"
    assert messages[9] == "line 10 has index 12 where 9 was due (line i holds index i - 1, " + (
        "counting lines from 1)"
    )
    assert messages[10] == "a nemesis kill needs value.nodes, a list of node ids"
    assert messages[11] == (
        "type must be one of invoke, ok, fail, info, got bogus; time must be an integer >= 0, "
        "got -3"
    )
    # The lines the reference reader refuses are the ones reported invalid
    # or not JSON (line 9's version on an invoke too).
    for i, line in enumerate(BAD_LINES):
        one = tmp_path / f"line{i}.jsonl"
        one.write_text(line + "\n")
        refused = True
        try:
            read_history(one)
            refused = False
        except ValueError:
            pass
        reported = any(j == i and kind in ("invalid-op", "not-json") for j, kind, _, _ in by_line)
        assert refused == reported, line


@pytest.mark.spark
def test_node_exports_load_with_their_line_order(spark: SparkSession, tmp_path: Path) -> None:
    log, changes = EXAMPLES["log"], EXAMPLES["changes"]
    write_run(tmp_path, "a", doc_history("register"), exports={3: (log, changes), 1: ("", "")})
    write_run(tmp_path, "b", doc_history("kv"), model="kv")  # no exports
    runs = find_runs([tmp_path])
    log_df, changes_df = load_node_exports(spark, runs)
    assert log_df.columns == ["run", "node", "seq", "offset", "epoch", "kind", "hash"]
    assert changes_df.columns == ["run", "node", "seq", "time", "epoch", "leader", "role"]
    assert [tuple(r) for r in log_df.orderBy("seq").collect()] == [
        ("a", d["node"], i, d["offset"], d["epoch"], d["kind"], d["hash"])
        for i, d in enumerate(json.loads(line) for line in log.splitlines())
    ]
    assert [tuple(r) for r in changes_df.orderBy("seq").collect()] == [
        ("a", d["node"], i, d["time"], d["epoch"], d["leader"], d["role"])
        for i, d in enumerate(json.loads(line) for line in changes.splitlines())
    ]
    empty_log, empty_changes = load_node_exports(spark, runs[1:])
    assert (empty_log.count(), empty_changes.count()) == (0, 0)
    assert empty_log.columns == log_df.columns


@pytest.mark.spark
def test_line_numbers_hold_across_the_splits_of_a_file(spark: SparkSession, tmp_path: Path) -> None:
    lines = [
        f'{{"index":{i},"time":{i},"type":"invoke","process":{i},"f":"read","key":"k",'
        '"value":null}'
        for i in range(300)
    ]
    write_run(tmp_path, "a", "\n".join(lines) + "\n")
    write_run(tmp_path, "b", doc_history("register"))
    key = "spark.sql.files.maxPartitionBytes"
    before = spark.conf.get(key) or "128MB"
    spark.conf.set(key, "2048")  # a 25 kB file in a dozen splits
    try:
        df = load_history(spark, find_runs([tmp_path]))
        assert df.rdd.getNumPartitions() > 10
        assert df.where("file_line != index + 1").count() == 0
        assert df.count() == 300 + len(doc_history("register").splitlines())
    finally:
        spark.conf.set(key, before)


@pytest.mark.spark
def test_many_histories_are_one_scan_with_their_own_runs_and_lines(
    spark: SparkSession, tmp_path: Path
) -> None:
    sizes = [3 + 7 * i for i in range(12)]
    for i, n in enumerate(sizes):
        lines = [
            f'{{"index":{j},"time":{j},"type":"invoke","process":{i},"f":"read","key":"k{i}",'
            '"value":null}'
            for j in range(n)
        ]
        write_run(tmp_path / "runs", f"r{i:02d}", "\n".join(lines) + "\n")
    # A name Spark's file path would not render as it is: read on its own.
    odd = tmp_path / "odd name"
    odd.mkdir()
    write_run(odd, "odd", doc_history("register"))
    runs = find_runs([tmp_path / "runs", odd])
    # Small files share partitions (a small open cost), and one is split.
    settings = {"spark.sql.files.openCostInBytes": "1", "spark.sql.files.maxPartitionBytes": "900"}
    before: dict[str, str | None] = {k: spark.conf.get(k) for k in settings}
    for k, value in settings.items():
        spark.conf.set(k, value)
    try:
        df = load_history(spark, runs)
        plan = df._jdf.queryExecution().executedPlan().toString()
        # One scan of the plainly named histories, one of the odd one (each
        # read twice: the lines, and their counts per partition).
        assert plan.count("InMemoryFileIndex(12 paths)") == 2, plan
        assert plan.count("FileScan text") == 4, plan
        rows = df.select("run", "key", "index", "file_line").collect()
        per_part = df.select(F.spark_partition_id().alias("p"), "run").distinct().collect()
    finally:
        for k, old in before.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)
    by_run: dict[str, list[tuple[Any, ...]]] = {}
    for r in rows:
        by_run.setdefault(r["run"], []).append((r["key"], r["index"], r["file_line"]))
    assert sorted(by_run) == ["odd", *[f"r{i:02d}" for i in range(len(sizes))]]
    for i, n in enumerate(sizes):
        got = sorted(by_run[f"r{i:02d}"], key=lambda t: t[1])
        assert got == [(f"k{i}", j, j + 1) for j in range(n)]
    assert len(by_run["odd"]) == len(doc_history("register").splitlines())
    assert all(line == index + 1 for _, index, line in by_run["odd"])
    runs_in: dict[int, set[str]] = {}
    for r in per_part:
        runs_in.setdefault(r["p"], set()).add(r["run"])
    assert any(len(v) > 1 for v in runs_in.values()), runs_in


@pytest.mark.spark
def test_a_file_whose_path_spark_renders_otherwise_fails_loudly(
    spark: SparkSession, tmp_path: Path
) -> None:
    from spark_verify.load import _read_files_together

    (tmp_path / "h.jsonl").write_text('{"index":0}\n')
    # Spark reads "a//h.jsonl" as "a/h.jsonl": no run is named for that.
    df = _read_files_together(spark, {f"{tmp_path}//h.jsonl": "r"})
    with pytest.raises(Exception, match="read a history file no run names: file:"):
        df.collect()
    assert _read_files_together(spark, {f"{tmp_path}/h.jsonl": "r"}).collect()[0]["run"] == "r"
