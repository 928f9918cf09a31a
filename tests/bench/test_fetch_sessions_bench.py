"""The fetch sessions' benchmark (bench/fetch_sessions.py) at a small size,
so that it keeps measuring what it says: nothing here checks a speed, only
that the full fetch answers every partition on every round, the session
none when idle and the written one when one is, and that both kept the
follower's logs equal to the leader's."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench import fetch_sessions as bench


def test_each_way_answers_what_it_should() -> None:
    figures, pairs = asyncio.run(bench.measure(300, 4, keep=True))
    assert figures["partitions"] == 300
    assert figures["idle"]["answered_per_round"] == {"full": 300, "session": 0}
    written = figures["one_written"]["answered_per_round"]
    assert written["full"] == 300 and 1 <= written["session"] <= 2
    # Every write reached the follower, each way.
    assert (
        sum(pairs["full"].managers[2].logs.log(k).log_end_offset for k in pairs["full"].keys) == 4
    )
    for pair in pairs.values():
        for key in pair.keys:
            leader, follower = (pair.managers[b].logs.log(key) for b in (1, 2))
            assert leader is not None and follower is not None
            assert follower.log_end_offset == leader.log_end_offset


def test_the_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--partitions", "100", "--rounds", "2", "--json"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)
    assert doc["partitions"] == 100 and doc["idle"]["ratio"] > 0
    assert bench.main(["--partitions", "100", "--rounds", "2"]) == 0
    assert "| 100 | idle |" in capsys.readouterr().out
