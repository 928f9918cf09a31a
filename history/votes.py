"""The votes a quorum node granted, and whether they survived its restarts.

Raft keeps ``votedFor`` as persistent state, durable before the vote is
answered (Ongaro's thesis, Figure 3.1 and §3.8); KRaft keeps it in the
quorum-state file (KIP-595, Kafka's ``QuorumStateStore``).  A node that
forgets its vote on a restart may grant a second candidate the same epoch,
and two leaders of one epoch follow; but only when a second candidate asks
it again in that epoch, which a cluster rarely does.  The node's own exports
show the forgetting itself, at any restart.

Each node exports ``nodes/<id>/votes.jsonl`` (``docs/history-format.md``,
node exports; :func:`chaos.node_exports.vote_events` writes it), one line per
event in its log's order: ``node``, ``time``, ``life`` (how many starts came
up to the line), ``event``, ``epoch``, ``voted_for``, ``leader``.  Events:

- ``grant``: the node granted its vote in ``epoch`` to ``voted_for`` (logged
  once the vote was durable);
- ``candidate``: it voted for itself, opening a candidacy in ``epoch``;
- ``start``: the quorum state a start restored from storage (``epoch``,
  ``voted_for``, ``leader``), the first line of life ``life``;
- ``stored``: the quorum state the node's storage held once the run was
  over (what its next start would restore), with ``life`` one past the last.

The check ``vote-durability`` (one anomaly per line named below):

- kind ``vote-forgotten``: a ``start`` or ``stored`` line restores epoch E,
  the highest epoch the node voted in before that life, but not the vote
  it granted first in E (``voted_for`` null or another node); witness, that
  vote line and the restoring line;
- kind ``epoch-forgotten``: a ``start`` or ``stored`` line restores an epoch
  below one the node voted in before that life (the vote went with it);
  witness, the first vote line of the highest such epoch and the restoring
  line;
- kind ``double-vote``: a node's vote lines name two or more different
  candidates in one epoch, across its whole history (restarts included);
  witness, the first line of each candidate; one anomaly per (node, epoch).

Pure over the export lines (dicts, as the file holds them, with ``seq``, the
0-based line of the node's file): the Spark job (``spark_verify.votes``) is
tested against it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from history.export_formats import read_export_lines

__all__ = [
    "RESTORE_EVENTS",
    "VOTES_FILE",
    "VOTE_DURABILITY",
    "VOTE_EVENTS",
    "VOTE_FIELDS",
    "VOTE_KINDS",
    "VoteAnomaly",
    "check_vote_durability",
    "count_by_kind",
    "read_run_votes",
    "read_votes",
    "vote_message",
]

VOTES_FILE: Final = "votes.jsonl"
VOTE_DURABILITY: Final = "vote-durability"
VOTE_FIELDS: Final = ("node", "time", "life", "event", "epoch", "voted_for", "leader")
VOTE_EVENTS: Final = ("grant", "candidate")
"""Lines that record a vote: for another node, or for itself."""
RESTORE_EVENTS: Final = ("start", "stored")
"""Lines that record a quorum state read back from storage."""
VOTE_KINDS: Final = ("vote-forgotten", "epoch-forgotten", "double-vote")

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class VoteAnomaly:
    """One anomaly of ``vote-durability``: its kind, the node and epoch,
    the witness lines (in the file's order) and a sentence."""

    kind: str
    node: int
    epoch: int
    witness: tuple[Row, ...]
    message: str


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _line_problems(obj: Mapping[str, Any]) -> list[str]:
    out = [
        f"{name} must be an integer >= 0, got {obj[name]!r}"
        for name in ("node", "time", "life", "epoch")
        if not _is_count(obj[name])
    ]
    if obj["event"] not in (*VOTE_EVENTS, *RESTORE_EVENTS):
        events = ", ".join((*VOTE_EVENTS, *RESTORE_EVENTS))
        out.append(f"event must be one of {events}, got {obj['event']!r}")
    for name in ("voted_for", "leader"):
        if obj[name] is not None and not _is_count(obj[name]):
            out.append(f"{name} must be a node id or null, got {obj[name]!r}")
    if obj["event"] in VOTE_EVENTS and obj["voted_for"] is None:
        out.append(f"a {obj['event']} line must name the node voted for")
    return out


def read_votes(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse one node's ``votes.jsonl``: its lines as dicts with ``seq``
    (0-based line).  :class:`HistoryFormatError` names a bad line."""
    lines = read_export_lines(path, VOTE_FIELDS, _line_problems)
    return [{**obj, "seq": seq} for seq, obj in enumerate(lines)]


def read_run_votes(run: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every node's ``votes.jsonl`` of a run folder (nodes without one: none)."""
    out: list[dict[str, Any]] = []
    for path in sorted(Path(run).glob(f"nodes/*/{VOTES_FILE}")):
        out.extend(read_votes(path))
    return out


def vote_message(kind: str, node: int, vote: Row, restored: Row | None = None) -> str:
    """The sentence of one anomaly (the Spark job words it the same)."""
    epoch = int(vote["epoch"])
    if kind == "double-vote":
        return (
            f"node {node} voted for two different candidates in epoch {epoch}: "
            f"votes are never changed within an epoch (Raft §3.4)"
        )
    assert restored is not None
    what = "its start" if restored["event"] == "start" else "its stored quorum state"
    voted = "nobody" if restored["voted_for"] is None else f"node {restored['voted_for']}"
    granted = "itself" if vote["event"] == "candidate" else f"node {vote['voted_for']}"
    if kind == "vote-forgotten":
        return (
            f"node {node} voted for {granted} in epoch {epoch}, but {what} "
            f"(life {restored['life']}) restored epoch {epoch} with a vote for {voted}: "
            f"votedFor must survive a restart (Raft §3.8, KIP-595's quorum-state file)"
        )
    return (
        f"node {node} voted for {granted} in epoch {epoch}, but {what} "
        f"(life {restored['life']}) restored epoch {restored['epoch']}, an older one: "
        f"the epoch and vote must survive a restart (Raft §3.8)"
    )


def check_vote_durability(lines: Iterable[Row]) -> list[VoteAnomaly]:
    """The anomalies of ``vote-durability`` (the module's docstring) in the
    lines of any nodes, ordered by node, then epoch, then the line."""
    per_node: dict[int, list[Row]] = defaultdict(list)
    for line in lines:
        per_node[int(line["node"])].append(line)
    found: list[tuple[tuple[int, int, int], VoteAnomaly]] = []
    for node, rows in per_node.items():
        rows = sorted(rows, key=lambda r: int(r["seq"]))
        votes = [r for r in rows if r["event"] in VOTE_EVENTS]
        for r in rows:
            if r["event"] not in RESTORE_EVENTS:
                continue
            before = [v for v in votes if int(v["life"]) < int(r["life"])]
            if not before:
                continue
            top = max(int(v["epoch"]) for v in before)
            first = next(v for v in before if int(v["epoch"]) == top)
            if int(r["epoch"]) < top:
                kind = "epoch-forgotten"
            elif int(r["epoch"]) == top and r["voted_for"] != first["voted_for"]:
                kind = "vote-forgotten"
            else:
                continue
            anomaly = VoteAnomaly(kind, node, top, (first, r), vote_message(kind, node, first, r))
            found.append(((node, top, int(r["seq"])), anomaly))
        by_epoch: dict[int, list[Row]] = defaultdict(list)
        for v in votes:
            by_epoch[int(v["epoch"])].append(v)
        for epoch, vs in by_epoch.items():
            firsts: dict[int, Row] = {}
            for v in vs:
                firsts.setdefault(int(v["voted_for"]), v)
            if len(firsts) > 1:
                witness = tuple(sorted(firsts.values(), key=lambda v: int(v["seq"])))
                anomaly = VoteAnomaly(
                    "double-vote",
                    node,
                    epoch,
                    witness,
                    vote_message("double-vote", node, witness[0]),
                )
                found.append(((node, epoch, max(int(v["seq"]) for v in vs)), anomaly))
    return [a for _, a in sorted(found, key=lambda f: f[0])]


def count_by_kind(anomalies: Sequence[VoteAnomaly]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in anomalies:
        out[a.kind] = out.get(a.kind, 0) + 1
    return out
