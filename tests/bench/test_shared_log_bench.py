"""The shared-log benchmark (bench/shared_log.py) at tiny sizes, so that it
keeps running as the state machines change.  Nothing here checks a speed."""

from __future__ import annotations

import json

import pytest

from bench import shared_log as sl
from metadata.state_machine import ControllerStateMachine


def test_both_logs_apply_through_the_shared_log_and_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--batches", "4", "--batch", "3", "--topics", "2", "--repeat", "1", "--json"]
    assert sl.main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["log"] for r in rows] == ["key-value puts", "topic creations"]
    assert rows[0]["records"] == 12
    assert rows[1]["records"] > 2
    assert all(r["shared_seconds"] > 0 and r["peer_seconds"] > 0 for r in rows)


def test_the_metadata_log_replays_into_the_topics_it_created() -> None:
    log = sl.metadata_log(3)
    node = sl.shared()
    for batch in log:
        node.handle_commit(batch)
    metadata = node.part("metadata")
    assert isinstance(metadata, ControllerStateMachine)
    assert metadata.applied_offset == log[-1].end_offset
    image = metadata.image
    assert sorted(t.name for t in image.topics.values()) == ["t0", "t1", "t2"]
    assert all(not b.fenced for b in image.brokers.values())
