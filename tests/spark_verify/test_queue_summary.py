"""Where a queue run's final polls start, from its summary (no Spark job)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_verify.queue import final_polls_from


def test_final_polls_from_the_summary(tmp_path: Path) -> None:
    assert final_polls_from(tmp_path) is None  # no summary.json
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"final_polls": {"from_index": 120, "complete": True}}))
    assert final_polls_from(tmp_path) == 120
    summary.write_text(json.dumps({"final_polls": None}))
    assert final_polls_from(tmp_path) is None


@pytest.mark.parametrize("bad", ["-1", '"7"', "true"])
def test_a_bad_from_index_is_named(tmp_path: Path, bad: str) -> None:
    (tmp_path / "summary.json").write_text('{"final_polls": {"from_index": ' + bad + "}}")
    with pytest.raises(ValueError, match=r"final_polls.from_index must be an integer >= 0"):
        final_polls_from(tmp_path)


def test_an_unreadable_summary_is_named(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"summary.json: cannot read the run's summary"):
        final_polls_from(tmp_path)
