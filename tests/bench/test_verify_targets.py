"""The generator of the verification targets (bench/verify_targets.py,
bench/verify_histories.py): seeded histories, written once, linearizable by
construction (the per-key checker agrees), and the memory sampler."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import verify_targets as bench
from bench.verify_histories import Sizes
from spark_verify.ops import CheckOp
from spark_verify.wgl import check_key


def _ops_by_key(history: Path) -> dict[str, list[CheckOp]]:
    """Pair a generated history's lines (one op in flight per process)."""
    pending: dict[Any, dict[str, Any]] = {}
    out: dict[str, list[CheckOp]] = defaultdict(list)
    for line in history.read_text().splitlines():
        o = json.loads(line)
        if o["type"] == "invoke":
            pending[o["process"]] = o
            continue
        i = pending.pop(o["process"])
        out[o["key"]].append(
            CheckOp(
                run="r",
                key=o["key"],
                process=str(o["process"]),
                f=o["f"],
                type=o["type"],
                index=i["index"],
                complete_index=o["index"],
                call=i["time"],
                ret=None if o["type"] == "info" else o["time"],
                arg=i["value"],
                result=o.get("value") if o["f"] == "read" else i["value"],
                error=o.get("error"),
            )
        )
    for p, i in pending.items():
        out[i["key"]].append(
            CheckOp(
                run="r",
                key=i["key"],
                process=str(p),
                f=i["f"],
                type="info",
                index=i["index"],
                complete_index=None,
                call=i["time"],
                ret=None,
                arg=i["value"],
                result=None if i["f"] == "read" else i["value"],
            )
        )
    return out


def test_a_kv_target_is_a_linearizable_history_of_many_clients(tmp_path: Path) -> None:
    target = bench.Target(
        "kv-test", "kv", 1, Sizes(ops=2_000, keys=3, seed=7, info_rate=0.05, nodes=0, clients=12), 1
    )
    run = bench.history_of(tmp_path, target)
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == "kv" and config["clients"] == 12
    assert not (run / "nodes").exists()
    by_key = _ops_by_key(run / "history.jsonl")
    assert sorted(by_key) == ["k0", "k1", "k2"]
    # Clients are not bound to keys: a process works on several.
    processes = [{op.process for op in ops} for ops in by_key.values()]
    assert set.intersection(*processes)
    assert sum(len(ops) for ops in by_key.values()) == 2_000
    assert any(op.type == "info" for ops in by_key.values() for op in ops)
    for ops in by_key.values():
        assert check_key(ops, "kv").valid is True
    # Written once: a second call finds it, the same bytes.
    before = (run / "history.jsonl").read_bytes()
    assert bench.history_of(tmp_path, target) == run
    assert (run / "history.jsonl").read_bytes() == before


def test_a_target_of_many_runs_has_one_seed_each(tmp_path: Path) -> None:
    target = bench.Target("few", "few", 3, Sizes(ops=60, keys=2, per_key=2, seed=5, nodes=0), 1)
    folder = bench.history_of(tmp_path, target)
    runs = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert runs == ["r000", "r001", "r002"]
    seeds = [json.loads((folder / r / "config.json").read_text())["seed"] for r in runs]
    assert seeds == [5, 6, 7]
    histories = {(folder / r / "history.jsonl").read_text() for r in runs}
    assert len(histories) == 3


def test_the_targets_are_the_issues() -> None:
    assert list(bench.TARGETS) == ["small", "100k", "1m", "20-per-key", "kv-50"]
    assert bench.TARGETS["1m"].sizes.ops == 1_000_000 and bench.TARGETS["1m"].sizes.keys == 10_000
    assert bench.TARGETS["20-per-key"].sizes.per_key == 20
    assert bench.TARGETS["kv-50"].sizes.clients == 50
    assert bench.TARGETS["small"].runs == 100


def test_the_memory_sampler_sees_this_process() -> None:
    assert bench.tree_rss_kib(os.getpid()) > 1024
    assert bench.tree_rss_kib(2**22 + 12345) == 0
