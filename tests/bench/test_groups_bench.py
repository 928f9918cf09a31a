"""The consumer groups' benchmark (bench/groups.py) at its small preset, on
a real local cluster of 3 controllers and 3 brokers over mutual TLS.
Nothing here checks a speed: only that every section measures what it says
(every trial settled, every commit and write acknowledged and the last
commit stored, each failover answered by another coordinator), that the
brokers ran with the group settings the figures are printed beside, that
the text shows every figure, and that the run leaves no process behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import groups as bench
from broker.client.producer_batch import TopicPartition
from server.broker import broker_config
from server.config import load_settings
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
    assert doc["benchmark"] == "groups" and list(doc["sections"]) == list(bench.SECTIONS)
    small = bench.PRESETS["small"]
    s = doc["sections"]

    r = s["rebalance"]
    assert r["group_session_timeout_ms"] == small.group_session_timeout_ms
    assert r["heartbeat_interval_ms"] == small.heartbeat_interval_ms
    for event, trials in (
        ("join", small.rebalance_trials),
        ("leave", small.rebalance_trials),
        ("vanish", small.vanish_trials),
    ):
        assert r[event]["trials"] == len(r[event]["per_trial_ms"]) == trials, (event, r)
        assert 0 < r[event]["p50_ms"] <= r[event]["p99_ms"] <= r[event]["max_ms"]

    c = s["commit"]
    for series in ("commit", "produce"):
        assert c[series]["errors"] == 0 and c[series]["writes"] == small.commits, c
        assert 0 < c[series]["p50_ms"] <= c[series]["p99_ms"]
    # The last commit is what the group holds (each commit was stored).
    assert c["last_committed"] == c["last_offset"] > small.commits
    assert c["ratio_p50"] == pytest.approx(c["commit"]["p50_ms"] / c["produce"]["p50_ms"])
    assert c["record_key_bytes"] > 0 and c["record_value_bytes"] > 0

    f = s["failover"]
    assert f["trials"] == len(f["per_trial"]) == small.failover_trials
    for trial in f["per_trial"]:
        # Only the offsets partition's new leader can answer a commit OK.
        assert trial["coordinator_after"] != trial["killed"] and trial["commit_s"] > 0
    assert f["last_committed"] == f["last_offset"]
    peer = f["leader_failover"]
    assert peer["trials"] == peer["recovered"] == small.failover_trials
    assert f["ratio_p50"] == pytest.approx(f["commit_p50_ms"] / peer["ack_p50_ms"])

    # Every figure is in the text, none missing ("-").
    lines = text.splitlines()
    assert "group session timeout 6000 ms, heartbeat interval 500 ms" in text
    for start, count in (("   join ", 1), ("   leave ", 1), ("   vanish ", 1), ("   commit ", 1),
                         ("   produce ", 1), ("   ratio ", 2), ("== coordinator failover", 1),
                         ("   peer, partition leader failover", 1)):  # fmt: skip
        found = [x for x in lines if x.startswith(start)]
        assert len(found) == count, (start, text)
        assert all("-" not in x.split() for x in found), found
    assert "failed" not in text

    state = load_state(directory / "cluster")
    assert state is not None
    # The brokers ran with the group settings printed beside the figures.
    for b in state.brokers:
        config = broker_config(load_settings(state.path(b.config), {}))
        assert config.groups.session_timeout_ms == small.group_session_timeout_ms
        assert config.groups.heartbeat_interval_ms == small.heartbeat_interval_ms
    # The cluster is down: no process of it runs any more.
    for member in state.members:
        assert member.pid is None or not _alive(member.pid), member


def test_settled_means_each_partition_once_and_balanced_shares() -> None:
    tps = [TopicPartition("t", p) for p in range(5)]
    everything = frozenset(tps)
    assert bench.settled([tps[:3], tps[3:]], everything)
    assert bench.settled([tps[:2], tps[2:4], tps[4:]], everything)
    assert not bench.settled([tps[:4], tps[4:]], everything)  # shares 4 and 1
    assert not bench.settled([tps[:3], tps[2:]], everything)  # partition 2 twice
    assert not bench.settled([tps[:2], tps[2:4]], everything)  # partition 4 unowned
    assert not bench.settled([tps[:3], [*tps[3:], TopicPartition("u", 0)]], everything)
    assert not bench.settled([], everything)


def test_the_commit_peer_has_the_commit_records_size() -> None:
    key, value = bench.commit_record_sizes("g", TopicPartition("topic", 0), 7)
    # int16 type, then group, topic (int16 length each) and int32 partition;
    # int16 version, int64 offset, int32 epoch, empty metadata, int64 time.
    assert key == 2 + (2 + 1) + (2 + 5) + 4
    assert value == 2 + 8 + 4 + 2 + 8


def test_bad_arguments_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--only", "commit,nonsense"])
    assert "unknown section(s) nonsense; known: rebalance, commit, failover" in (
        capsys.readouterr().err
    )
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
        "sections": {"failover": {"error": "RuntimeError: no coordinator", "wall_s": 3.0}},
    }
    assert "== failover: failed: RuntimeError: no coordinator" in bench.format_text(doc)
