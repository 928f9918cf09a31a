"""Converting to Parquet: the columns of docs/history-format.md, and Parquet
input loading as the JSON Lines it came from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from spark_verify.convert import (
    ConvertError,
    history_to_parquet,
    main,
    node_exports_to_parquet,
)
from spark_verify.load import (
    HISTORY_COLUMNS,
    RunInputError,
    find_runs,
    history_problems,
    load_history,
    load_node_exports,
)
from spark_verify.pairing import pair_ops
from tests.spark_verify.test_load import EXAMPLES, HISTORY_MODELS, doc_history, write_run

PARQUET_TYPES = {"bigint": pa.int64(), "string": pa.string()}


def test_the_command_refuses_a_missing_path_before_starting_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such file or folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "empty: no history.jsonl in it" in capsys.readouterr().err


@pytest.mark.spark
def test_parquet_has_the_documented_columns_and_loads_as_the_jsonl(
    spark: SparkSession, tmp_path: Path
) -> None:
    jsonl_root, parquet_root = tmp_path / "jsonl", tmp_path / "parquet"
    for model in HISTORY_MODELS:
        exports = {3: (EXAMPLES["log"], EXAMPLES["changes"])} if model == "register" else None
        write_run(jsonl_root, model, doc_history(model), model=model, exports=exports)
    shutil.copytree(jsonl_root, parquet_root)
    for model in HISTORY_MODELS:
        out = history_to_parquet(spark, parquet_root / model)
        assert out == parquet_root / model / "history.parquet" and out.is_dir()
    assert node_exports_to_parquet(spark, parquet_root / "register") == [
        parquet_root / "register" / "nodes" / "3" / "log.parquet",
        parquet_root / "register" / "nodes" / "3" / "changes.parquet",
    ]
    table = pq.read_table(parquet_root / "register" / "history.parquet")
    assert [(f.name, f.type) for f in table.schema] == [
        (name, PARQUET_TYPES[kind]) for name, kind in HISTORY_COLUMNS
    ]
    values = dict(zip(table["index"].to_pylist(), table["value"].to_pylist(), strict=True))
    assert (values[0], values[1], values[4]) == ('"v0-1"', None, '["v0-1","v2-1"]')
    log_table = pq.read_table(parquet_root / "register" / "nodes" / "3" / "log.parquet")
    assert log_table.schema.names == ["node", "offset", "epoch", "kind", "hash", "seq"]

    from_jsonl, from_parquet = find_runs([jsonl_root]), find_runs([parquet_root])
    assert {r.fmt for r in from_jsonl} == {"jsonl"}
    assert {r.fmt for r in from_parquet} == {"parquet"}
    columns = ["run", *[n for n, _ in HISTORY_COLUMNS]]
    a = load_history(spark, from_jsonl)
    b = load_history(spark, from_parquet)
    # The same columns with the same types (a column's nullability depends on
    # how the scan derived it, not on the format).
    assert [(f.name, f.dataType) for f in a.select(columns).schema.fields] == [
        (f.name, f.dataType) for f in b.select(columns).schema.fields
    ]
    assert sorted(a.select(columns).collect()) == sorted(b.select(columns).collect())
    assert b.where("line is not null or file_line is not null").count() == 0
    assert sorted(pair_ops(a).ops.collect()) == sorted(pair_ops(b).ops.collect())
    for x, y in zip(
        load_node_exports(spark, from_jsonl), load_node_exports(spark, from_parquet), strict=True
    ):
        assert x.schema.simpleString() == y.schema.simpleString()
        assert sorted(x.collect()) == sorted(y.collect())

    with pytest.raises(ConvertError, match="history.parquet already exists"):
        history_to_parquet(spark, parquet_root / "register")


@pytest.mark.spark
def test_malformed_histories_are_refused(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = doc_history("kv").splitlines()
    lines[3] = lines[3].replace('"process":1', '"process":"one"')
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConvertError, match=r"(?s)bad\.jsonl: malformed lines.*got \"one\""):
        history_to_parquet(spark, bad)
    assert not (tmp_path / "bad.parquet").exists()
    assert main([str(bad), "--master", "local[2]"]) == 2
    assert "malformed lines" in capsys.readouterr().err
    out = history_to_parquet(spark, bad, tmp_path / "kept.parquet", check=False)
    assert pq.read_table(out).num_rows == len(lines)


@pytest.mark.spark
def test_parquet_input_is_checked(spark: SparkSession, tmp_path: Path) -> None:
    rows = {
        "index": [0, 1],
        "time": [5, 6],
        "type": ["invoke", "bogus"],
        "process": ["0", "-2"],
        "f": ["read", "read"],
        "key": ["k", "k"],
        "value": [None, '"x"'],
        "error": ["oops", None],
        "node": [None, 1],
        "offset": [None, None],
        "epoch": [None, None],
    }
    single = tmp_path / "single.parquet"
    pq.write_table(pa.table(rows), single)
    df = load_history(spark, find_runs([single], model="kv"))
    got = {r["index"]: (r["kind"], r["message"], r["line"]) for r in history_problems(df).collect()}
    assert got[0] == (
        "invalid-op",
        "an invoke carries no error, got oops",
        '{"index":0,"time":5,"type":"invoke","process":"0","f":"read","key":"k",'
        '"value":null,"error":"oops"}',
    )
    assert got[1][0] == "invalid-op"
    assert "type must be one of invoke, ok, fail, info, got bogus" in got[1][1]
    assert "process must be an integer >= 0 or 'nemesis', got -2" in got[1][1]

    many = tmp_path / "many.parquet"
    pq.write_table(pa.table({"run": ["r1", "r2"], **rows}), many)
    loaded = load_history(spark, find_runs([many], model="kv"))
    assert sorted((r["run"], r["index"]) for r in loaded.collect()) == [("r1", 0), ("r2", 1)]

    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({**rows, "index": ["0", "1"]}), wrong)
    with pytest.raises(RunInputError, match=r"wrong\.parquet: wrong column type\(s\): index is"):
        load_history(spark, find_runs([wrong], model="kv"))
    missing = tmp_path / "missing.parquet"
    pq.write_table(pa.table({k: v for k, v in rows.items() if k != "f"}), missing)
    with pytest.raises(RunInputError, match=r"missing\.parquet: no column\(s\) f"):
        load_history(spark, find_runs([missing], model="kv"))
