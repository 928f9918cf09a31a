"""The brokers' benchmark (bench/brokers.py) at its small preset, on a real
local cluster of 3 controllers and 3 brokers over mutual TLS, so that it
keeps running as the brokers change.  Nothing here checks a speed: only that
every section measures what it says (every write acknowledged, every record
consumed once, the failover recovered, the fenced broker's partitions all
led elsewhere) and that the benchmark leaves no process or file behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import broker_load
from bench import brokers as bench
from server.local_cluster import load_state


def test_the_small_preset_measures_every_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "run"
    assert bench.main(["--preset", "small", "--dir", str(directory), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["preset"] == "small" and list(doc["sections"]) == list(bench.SECTIONS)
    small = bench.PRESETS["small"]
    s = doc["sections"]

    for size in (100, 1024):
        for kind in ("acks-all", "acks-1", "kv-put"):
            series = s["sequential"][f"{kind}-{size}"]
            assert series["errors"] == 0, series
            assert series["writes"] == small.seq_records
            assert 0 < series["p50_ms"] <= series["p99_ms"]

    for size in (100, 1024):
        t = s["throughput"][f"size_{size}"]
        assert t["failed"] == 0 and t["records"] > 0, t
        assert t["mb_per_s"] == pytest.approx(t["records"] * size / t["seconds"] / 1e6)

    e2e = s["e2e"]
    assert e2e["failed"] == 0 and e2e["duplicates"] == 0
    assert e2e["records"] == e2e["sent"] == int(small.e2e_rate * small.e2e_duration_s)
    assert 0 < e2e["p50_ms"] <= e2e["p99_ms"] <= e2e["p999_ms"] <= e2e["max_ms"]

    failover = s["failover"]
    assert failover["trials"] == failover["recovered"] == small.failover_trials
    for trial in failover["per_trial"]:
        # Nothing is acknowledged by a dead leader, and the new one can only
        # be chosen once the controller has fenced the killed broker.
        assert trial["ack_s"] > 0 and trial["metadata_s"] > 0

    fence = s["fence"]
    assert fence["led_by_victim"] == small.fence_partitions
    assert fence["still_led_after"] == 0
    assert 0 < fence["kill_to_fenced_s"] <= fence["kill_to_led_elsewhere_s"]
    assert fence["kill_to_all_writable_s"] > 0
    assert all(v is not None and v > 0 for v in fence["rss_mib_after"].values())
    assert set(fence["idle_cpu_cores"]) == {"broker-4", "broker-5", "broker-6"}

    # The cluster is down: no process of it runs any more.
    state = load_state(directory / "cluster")
    assert state is not None
    for member in state.members:
        assert member.pid is None or not _alive(member.pid), member


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def test_stamped_values_carry_their_scheduled_instant() -> None:
    value = broker_load.stamped_value(1234.5, 100, b"x" * 200)
    assert len(value) == 100 and broker_load.scheduled_of(value) == 1234.5
    with pytest.raises(ValueError, match="at least 8 bytes"):
        broker_load.stamped_value(1.0, 4, b"x" * 8)


def test_bad_arguments_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--only", "sequential,nonsense"])
    assert "unknown section(s) nonsense" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--fence-partitions", "0"])
    assert "must be at least 1, not 0" in capsys.readouterr().err
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
        "sections": {"fence": {"error": "RuntimeError: not ready", "wall_s": 3.0}},
    }
    text = bench.format_text(doc)
    assert "== fence: failed: RuntimeError: not ready" in text
