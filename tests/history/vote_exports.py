"""Synthetic ``votes.jsonl`` exports for the vote-durability tests (the pure
check's and the Spark job's), written as files, as a run leaves them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def line(
    node: int,
    life: int,
    event: str,
    epoch: int,
    voted_for: int | None = None,
    leader: int | None = None,
    time: int = 0,
) -> dict[str, Any]:
    if event == "candidate":
        voted_for = node
    return {
        "node": node,
        "time": time,
        "life": life,
        "event": event,
        "epoch": epoch,
        "voted_for": voted_for,
        "leader": leader,
    }


def write_votes(run: Path, lines: list[dict[str, Any]]) -> None:
    """Each node's lines into ``run/nodes/<node>/votes.jsonl``, in the given
    order."""
    by_node: dict[int, list[dict[str, Any]]] = {}
    for x in lines:
        by_node.setdefault(int(x["node"]), []).append(x)
    for node, xs in by_node.items():
        folder = run / "nodes" / str(node)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "votes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in xs))


# Node 1 votes for 2 in epoch 3, is restarted in epoch 3 and keeps its vote,
# then is a candidate of epoch 4 and wins; its storage keeps (4, 1, 1).
KEPT = [
    line(1, 1, "start", 0),
    line(1, 1, "grant", 3, 2),
    line(1, 2, "start", 3, 2, 2),
    line(1, 2, "candidate", 4),
    line(1, 3, "stored", 4, 1, 1),
]
# Node 2 votes for 3 in epoch 5, is restarted and restores epoch 6 (it
# learned of a newer epoch before the kill): a new epoch after a restart,
# with no vote yet, then grants 1 in epoch 6.
NEW_EPOCH = [
    line(2, 1, "start", 0),
    line(2, 1, "grant", 5, 3),
    line(2, 2, "start", 6, None, None),
    line(2, 2, "grant", 6, 1),
    line(2, 3, "stored", 6, 1, None),
]
# Node 3 votes for 1 in epoch 2, restarts with no vote in epoch 2 (the bug)
# and grants 2 the same epoch: vote-forgotten, then double-vote.
FORGOT_THEN_TWICE = [
    line(3, 1, "start", 0),
    line(3, 1, "grant", 2, 1),
    line(3, 2, "start", 2, None, None),
    line(3, 2, "grant", 2, 2),
    line(3, 3, "stored", 2, 2, None),
]
# Node 4 is a candidate of epoch 7 and its storage ends at epoch 6: the
# epoch (and its vote for itself) did not survive.
EPOCH_LOST = [
    line(4, 1, "start", 6, None, 2),
    line(4, 1, "candidate", 7),
    line(4, 2, "stored", 6, None, 2),
]
# Node 5, a leader whose storage dropped its vote for itself (Q3 at the
# end of a run with no restart at all).
STORED_WITHOUT_VOTE = [
    line(5, 1, "start", 0),
    line(5, 1, "candidate", 1),
    line(5, 2, "stored", 1, None, 5),
]
