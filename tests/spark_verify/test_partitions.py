"""The partition checks as a Spark job (spark_verify.partitions) find
exactly the anomalies of the reference (history.partition_checks) on the
same synthetic exports, clean and planted; ``kq verify`` judges a queue run
by them too and its report draws each partition's HW, LEO, ISR size and
consumer lag, faults shaded."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from history.ops import HistoryRecorder
from history.partition_checks import check_partitions
from spark_verify.job import VerifyOptions, verify
from spark_verify.partitions import (
    PARTITION_CHECKS,
    check_partition_runs,
    load_partition_exports,
    partition_anomaly_rows,
)
from tests.history.partition_exports import Partitions, clean
from tests.history.queue_histories import Queue

pytestmark = pytest.mark.spark


def _diverged(p: Partitions) -> None:
    p.records[1] = {**p.records[1], "hash": "0" * 64}


def _hw_down(p: Partitions) -> None:
    p.state(2, 1500, 4, 5, 1, 2, (2, 3))


def _epoch_down(p: Partitions) -> None:
    p.restart(3)
    p.state(3, 1600, 5, 5, 0, 1)


def _cut(p: Partitions) -> None:
    p.truncate(3, 1500, 5, 4, 1)


def _excused(p: Partitions) -> None:
    p.change(40, 2, 1, [2], unclean=True)
    p.truncate(3, 1500, 5, 4, 1)


def _stale_tail(p: Partitions) -> None:
    p.state(4, 500, 3, 5, 0, 1)
    p.log(4, [1, 2, 3, 40, 41], epoch=0)
    p.removed(2, 1600)
    p.state(2, 1700, 0, 0, 1, 2, (2, 3))


def _start_above(p: Partitions) -> None:
    p.state(2, 1500, 5, 7, 1, 2, (2, 3), start=6)
    # At the HW, or from a broker that did not log it: not above.
    p.state(3, 1500, 5, 7, 1, 2, (2, 3), start=5)
    p.state(1, 1500, 5, 7, 1, 2, (2, 3), start=None)


def _ineligible(p: Partitions) -> None:
    # Broker 1 back in the ISR between its new registration (25, fenced)
    # and its unfencing (27); 3 while shutting down; 9 never registered; a
    # second controller with the same lines (one anomaly each); a third
    # with no registrations (not judged).
    p.change(26, 2, 1, [2, 3, 1])
    p.registration(31, 3, "shutdown")
    p.change(32, 2, 1, [1, 2])
    p.change(33, 2, 1, [1, 2, 3])
    p.change(34, 2, 1, [1, 2, 3, 9])
    for c in list(p.changes):
        p.change(c["offset"], c["leader"], c["leader_epoch"], c["isr"], node=2)
    p.registrations += [{**r, "node": 2} for r in p.registrations]
    p.change(50, 2, 1, [2, 3, 7], node=3)


def _rejoined(p: Partitions) -> None:
    # Fenced and unfenced at the same epoch, then back in the ISR; a member
    # fenced while it stays; a partition created again with active brokers.
    p.registration(31, 3, "fence")
    p.change(32, 2, 1, [1, 2])
    p.registration(33, 3, "unfence")
    p.change(34, 2, 1, [1, 2, 3])
    p.registration(35, 2, "fence")
    p.change(36, -1, 2, [1, 2, 3])
    p.registration(37, 2, "unfence")
    p.change(40, 1, 0, [1, 2, 3], partition_epoch=0)


def _all(p: Partitions) -> None:
    for plant in (_diverged, _hw_down, _epoch_down, _cut, _start_above, _ineligible):
        plant(p)


CASES: dict[str, Callable[[Partitions], None]] = {
    "diverged": _diverged,
    "hw-down": _hw_down,
    "epoch-down": _epoch_down,
    "cut": _cut,
    "excused": _excused,
    "stale-tail": _stale_tail,
    "start-above": _start_above,
    "ineligible": _ineligible,
    "rejoined": _rejoined,
    "all": _all,
}


def write_run(root: Path, name: str, p: Partitions, q: Queue | None = None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    config = {
        "format": 1,
        "name": name,
        "nodes": [],
        "brokers": [1, 2, 3],
        "model": "queue",
        "queue": {"topics": [{"name": "queue", "partitions": 1}]},
    }
    (run / "config.json").write_text(json.dumps(config))
    ops = (q or Queue()).ops
    (run / "history.jsonl").write_text("".join(op.to_line() + "\n" for op in ops))
    p.write(run)
    return run


def planted(name: str) -> Partitions:
    p = clean()
    if name != "clean":
        CASES[name](p)
    return p


def test_spark_finds_what_the_reference_finds(spark: SparkSession, tmp_path: Path) -> None:
    folders = {name: write_run(tmp_path, name, planted(name)) for name in ("clean", *sorted(CASES))}
    frames = load_partition_exports(spark, folders)
    assert frames.runs == tuple(sorted(folders))
    got: dict[str, set[tuple[Any, ...]]] = {name: set() for name in folders}
    for r in partition_anomaly_rows(frames).collect():
        got[r.run].add(
            (r.check, r.topic, r.partition, tuple(r.nodes), tuple(r.offsets), tuple(r.seqs))
        )
    fired: dict[str, set[str]] = {}
    for name in folders:
        want = {a.ident() for v in check_partitions(planted(name).exports()).values() for a in v}
        assert got[name] == want, (name, sorted(got[name] - want), sorted(want - got[name]))
        fired[name] = {w[0] for w in want}
    assert fired == {
        "clean": set(),
        "excused": set(),
        "stale-tail": set(),
        "diverged": {"replica-divergence"},
        "hw-down": {"hw-regression"},
        "epoch-down": {"epoch-regression"},
        "cut": {"truncated-committed"},
        "start-above": {"log-start-above-hw"},
        "ineligible": {"ineligible-isr"},
        "rejoined": set(),
        "all": set(PARTITION_CHECKS),
    }
    # The results carry the reference's sentences.
    results = {c.name: c for c in check_partition_runs(spark, folders, frames)}
    reference = check_partitions(planted("all").exports())
    for check in PARTITION_CHECKS:
        assert results[check].valid is False
        mine = [a.message for a in results[check].anomalies if a.run == "all"]
        assert mine == [a.message for a in reference[check]], check


def test_runs_without_partition_exports_are_not_applicable(
    spark: SparkSession, tmp_path: Path
) -> None:
    run = tmp_path / "bare"
    run.mkdir()
    results = check_partition_runs(spark, {"bare": run})
    assert [c.name for c in results] == list(PARTITION_CHECKS)
    assert all(c.valid is True and c.detail["applicable"] is False for c in results)


def _queue() -> Queue:
    """Sends to key 0 and polls behind them, a fault in between, 100 ms
    between events (the exports' time scale)."""
    q = Queue()
    clock = itertools.count(0, 100_000_000)
    q.rec = HistoryRecorder(lambda: next(clock), q.ops.append, start_ns=0)
    for v in range(5):
        q.send(0, [("0", v, v)])
    q.poll(1, {"0": [(0, 0), (1, 1)]})
    q.heal()
    q.send(0, [("0", 5, 5)])
    q.poll(1, {"0": [(2, 2)]})
    q.heal()
    q.crash(1)
    q.assign(2, ["0"], seek=True)
    q.poll(2, {"0": [(o, o) for o in range(6)]})
    return q


def test_kq_verify_judges_and_plots_the_partitions(spark: SparkSession, tmp_path: Path) -> None:
    good = write_run(tmp_path, "good", clean(), _queue())
    bad = write_run(tmp_path, "bad", planted("cut"), _queue())
    done = verify(spark, [good, bad], VerifyOptions(out=tmp_path / "out"))
    runs = {r["name"]: r for r in done.verdict["runs"]}
    assert runs["good"]["verdict"] == "valid", runs["good"]
    assert runs["bad"]["verdict"] == "invalid"
    assert runs["bad"]["failed"] == ["truncated-committed"]
    checks = list(done.verdict["checks"])
    assert checks[-len(PARTITION_CHECKS) :] == list(PARTITION_CHECKS)
    assert done.report_path is not None
    page = done.report_path.read_text()
    for what in ("HW and LEO", "ISR size", "consumer lag"):
        assert f'aria-label="{what} of queue-0 in run good"' in page
    good_part = page[page.index("<h2>Run good</h2>") : page.index("<h2>Run bad</h2>")]
    plots = good_part[good_part.index("<h3>Partitions</h3>") :]
    assert 'data-fault="partition"' in plots  # the faults shaded
    # One series per replica's HW and LEO, named by broker.
    assert all(f"<title>broker {n} HW</title>" in page for n in (1, 2, 3))
    assert "<title>broker 3 LEO</title>" in page
    assert re.search(r"<title>consumer lag</title>", page)
