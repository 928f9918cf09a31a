"""The transactions' benchmark (bench/transactions.py) at its small preset,
on a real local cluster of 3 controllers and 3 brokers over mutual TLS.
Nothing here checks a speed: only that every series measures what it says
(every transaction committed and every group flushed with all its records
acknowledged, the log holding those records and one marker per partition
of each transaction, the read_committed consumer returning the committed
records only and the read_uncommitted one all of them), that the JSON and
the text have every figure and ratio, and that the run leaves no process
behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import transactions as bench
from server.local_cluster import load_state
from tests.bench.test_brokers_bench import _alive


@pytest.mark.slow
def test_the_small_preset_measures_every_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "run"
    out = tmp_path / "run.json"
    assert bench.main(["--preset", "small", "--dir", str(directory), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "transactions" and list(doc["sections"]) == list(bench.SECTIONS)
    small = bench.PRESETS["small"]
    s = doc["sections"]

    t = s["txn"]
    assert t["value_bytes"] == bench.VALUE_BYTES
    assert t["per_shape"] == small.transactions
    assert list(t["shapes"]) == [bench.shape_name(r, p) for r, p in small.shapes]
    for (records, partitions), shape in zip(small.shapes, t["shapes"].values(), strict=True):
        assert (shape["records"], shape["partitions"]) == (records, partitions)
        for series in ("txn", "idempotent"):
            got = shape[series]
            # Every transaction committed (every group flushed), every
            # record of each acknowledged.
            assert got["done"] == small.transactions and got["errors"] == 0, (series, got)
            assert got["records_acked"] == small.transactions * records, (series, got)
            assert got["per_s"] > 0 and got["records_per_s"] == pytest.approx(
                got["per_s"] * records
            )
            for figure in ("whole", "commit", "first_ack"):
                assert 0 < got[figure]["p50_ms"] <= got[figure]["p99_ms"], (series, figure, got)
            # The commit (or the flush) is part of the whole.
            assert got["commit"]["max_ms"] <= got["whole"]["max_ms"]
        assert 0 < shape["txn"]["end_txn"]["p50_ms"] <= shape["txn"]["commit"]["max_ms"]
        # At least an AddPartitionsToTxn and an EndTxn per transaction.
        assert shape["txn"]["coordinator_requests_per_txn"] >= 2
        assert "end_txn" not in shape["idempotent"]
        txn, idem = shape["txn"], shape["idempotent"]
        assert shape["ratio_per_s"] == pytest.approx(txn["per_s"] / idem["per_s"])
        for figure in ("commit", "whole"):
            for q in ("p50", "p99"):
                assert shape[f"ratio_{figure}_{q}"] == pytest.approx(
                    txn[figure][f"{q}_ms"] / idem[figure][f"{q}_ms"]
                )
    # The log holds exactly the records sent and one marker per partition
    # of each committed transaction (no retry wrote twice, no marker lost).
    assert t["log_offsets"] == t["expected_log_offsets"] > 0

    r = s["read"]
    aborted = small.fill_transactions // bench.ABORT_EVERY
    assert r["transactions"] == small.fill_transactions
    assert r["aborted_transactions"] == aborted
    assert r["committed"] == (small.fill_transactions - aborted) * small.fill_records
    assert r["aborted"] == aborted * small.fill_records
    # Every record and one marker per partition of each transaction.
    assert r["log_offsets"] == (
        r["committed"] + r["aborted"] + small.fill_transactions * small.read_partitions
    )
    rc, ru = r["read_committed"], r["read_uncommitted"]
    for got in (rc, ru):
        assert got["trials"] == len(got["per_trial_s"]) == small.read_trials
        assert got["seconds_p50"] > 0 and got["records_per_s"] > 0 and got["offsets_per_s"] > 0
    # read_committed returns the committed records only, read_uncommitted
    # the aborted ones too, in every trial.
    assert rc["records_returned"] == [r["committed"]] * small.read_trials
    assert ru["records_returned"] == [r["committed"] + r["aborted"]] * small.read_trials
    assert r["ratio_seconds"] == pytest.approx(rc["seconds_p50"] / ru["seconds_p50"])
    assert r["ratio_records_per_s"] == pytest.approx(rc["records_per_s"] / ru["records_per_s"])

    # Every figure is in the text, none missing ("-").
    lines = text.splitlines()
    for start, count in (("     txn ", len(small.shapes)), ("     idempotent ", len(small.shapes)),
                         ("     ratio ", len(small.shapes)), ("   read_committed ", 1),
                         ("   read_uncommitted ", 1), ("   ratio ", 1)):  # fmt: skip
        found = [x for x in lines if x.startswith(start)]
        assert len(found) == count, (start, text)
        assert all("-" not in x.split() for x in found), found
    assert "failed" not in text

    state = load_state(directory / "cluster")
    assert state is not None
    # The cluster is down: no process of it runs any more.
    for member in state.members:
        assert member.pid is None or not _alive(member.pid), member


def test_bad_arguments_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--only", "txn,nonsense"])
    assert "unknown section(s) nonsense; known: txn, read" in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("")
    with pytest.raises(SystemExit):
        bench.main(["--dir", str(tmp_path / "busy")])
    assert "is not empty" in capsys.readouterr().err


def test_a_failed_section_is_reported_with_its_error() -> None:
    doc = {
        "preset": "small",
        "git_commit": "abc1234",
        "load_average_start": [1.0, 1.0, 1.0],
        "load_average_end": [1.0, 1.0, 1.0],
        "sections": {"read": {"error": "RuntimeError: the ends not reached", "wall_s": 3.0}},
    }
    assert "== read: failed: RuntimeError: the ends not reached" in bench.format_text(doc)


def test_the_full_preset_has_every_shape_one_record_can_have() -> None:
    shapes = set(bench.PRESETS["full"].shapes)
    # A transaction of one record touches one partition: (1, 10) is (1, 1).
    assert shapes == {(r, p) for r in (1, 10, 100) for p in (1, 10) if r >= p}
