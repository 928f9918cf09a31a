"""The check every real queue run's test makes of its final polls
(tests.chaos.queue_runs), tried on a run folder written by the test: it
passes when the polls found each acknowledged record, and fires on polls
that did not complete or that lost a record."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from history.runs import RunDir
from tests.chaos.queue_runs import check_final_polls_found_everything
from tests.chaos.test_workload_queue import _final, _op

SENDS = [
    _op(0, "invoke", "send", [["send", 0, 1], ["send", 0, 2]]),
    _op(1, "ok", "send", [["send", 0, [0, 1]], ["send", 0, [1, 2]]]),
]


def _run(tmp_path: Path, complete: bool) -> RunDir:
    run = RunDir(tmp_path)
    final = {"complete": complete, "from_index": 2}
    run.summary.write_text(json.dumps({"final_polls": final}))
    return run


def test_the_final_polls_check_passes_when_every_record_is_found(tmp_path: Path) -> None:
    ops = [*SENDS, *_final(2, {"0": [[0, 1], [1, 2]]})]
    check_final_polls_found_everything(_run(tmp_path, complete=True), ops)


def test_the_final_polls_check_fires_on_a_lost_record(tmp_path: Path) -> None:
    ops = [*SENDS, *_final(2, {"0": [[0, 1]]})]
    lost = re.escape("'lost': [{'key': 0, 'value': 2, 'offset': 1}]")
    with pytest.raises(AssertionError, match=lost):
        check_final_polls_found_everything(_run(tmp_path, complete=True), ops)


def test_the_final_polls_check_fires_on_polls_that_did_not_complete(tmp_path: Path) -> None:
    ops = [*SENDS, *_final(2, {"0": [[0, 1], [1, 2]]})]
    with pytest.raises(AssertionError, match="'complete': False"):
        check_final_polls_found_everything(_run(tmp_path, complete=False), ops)
