"""What the tests of real queue runs check of every such run, whatever its
backend and faults: the final polls completed and found each acknowledged
record at its offset (none lost, moved or read with two values)."""

from __future__ import annotations

import json

from chaos.workloads.queue import check_final_polls
from history.ops import Op
from history.runs import RunDir


def check_final_polls_found_everything(run: RunDir, ops: list[Op]) -> None:
    """The run's final polls (``summary.json``'s ``final_polls``) completed,
    and against the history ``ops`` they lost, moved and read inconsistently
    no record."""
    final = json.loads(run.summary.read_text())["final_polls"]
    assert final["complete"], final
    found = check_final_polls(ops, final["from_index"])
    assert found == {"lost": [], "moved": [], "inconsistent": []}, found
