"""The brokers' partition checks over a run's node exports (the reference).

A run with brokers exports, for each broker, its partition logs record by
record (``partitions.jsonl``), each partition's checkpointed HW
(``partition_state.jsonl``) and its partition states over time and
truncations (``partition_timeline.jsonl``), and for each controller the
partition changes it committed (``partition_changes.jsonl``) and the
brokers' registrations, fencings and unfencings (``broker_registrations.jsonl``);
see ``docs/history-format.md`` ("Brokers' partitions").  Six checks read them:

- ``replica-divergence``: replicas agree on every offset below the highest
  HW announced for the partition (same record hash, leader epoch, producer
  and sequence), each replica at the offsets below its own highest HW: a
  replica whose HW never passed an offset may still hold a tail it has not
  truncated yet (Kafka truncates on the follower's next fetch, KIP-101), but
  one whose HW passed it agreed with the leader there;
- ``hw-regression``: a replica's HW never goes down within one process life
  (a restarted broker starts from its checkpoint, which lags), except by a
  truncation (judged by ``truncated-committed``) or the replica's removal.
  A follower log restarted at its leader's log start (a ``restart`` line,
  Kafka's ``truncateFullyAndStartAt``) starts the series again too, as the
  Spark job compares only successive state lines: its HW rises to the new
  log start, and one left below it is a ``log-start-above-hw``;
- ``epoch-regression``: a replica's leader epoch never goes down, across
  restarts too (epochs come from the committed metadata), except across the
  replica's removal;
- ``truncated-committed``: no follower truncates below a committed HW, its
  own last HW before the truncation in the same life (the records below it
  were committed and matched the leader's), unless the controllers recorded
  an unclean election of the partition at or before the truncation's leader
  epoch (Kafka: only an unclean leader may lack committed records).  The
  partition's highest HW is not the bound: a replica's records between its
  own HW and the leader's may be a divergent tail of an older epoch, which
  it must truncate (KIP-101), and the timeline does not say which records a
  truncation cut. A log restart is no truncation: the records it drops lie
  below the leader's log start, gone from the leader's log too;
- ``log-start-above-hw``: a replica's log start offset never passes its
  HW (``UnifiedLog.maybeIncrementLogStartOffset`` refuses it, and
  ``deletableSegments`` deletes no segment at or above the HW "to ensure
  that the log start offset can never exceed it"): a state line whose
  ``log_start_offset`` is above its ``high_watermark`` is records removed
  before they were committed.  Lines from brokers that did not log the log
  start (null) are not judged;
- ``ineligible-isr``: every broker a committed partition change brings
  into an ISR (a member of its ISR that was not one in the partition's
  change before it; every member of a new partition's ISR) was, at that
  metadata offset, registered, unfenced and not in controlled shutdown at
  its current broker epoch (KIP-841, KIP-903; Kafka's
  ``ReplicationControlManager.ineligibleReplicasForIsr`` refuses an
  AlterPartition naming any other, ``buildPartitionRegistration`` and the
  elections of ``PartitionChangeBuilder`` take only active brokers).  A
  member that stays is not judged: the controllers themselves keep a
  fenced last member when no ELR takes it, and take a fenced or shutting
  down broker out of the ISRs with the record that fences it.  Each
  controller's changes are judged against its own registrations (one log,
  one offset order); a controller that exported none is not judged.  A
  re-registered broker is fenced until its heartbeat unfences it, so an
  AlterPartition carrying its old epoch shows here as a fenced member;
  one that reaches the controllers after the new registration was
  unfenced does not (the records do not keep the epochs the leader sent).

Pure over the export lines (dicts, as the files hold them): the Spark job
(``spark_verify.partitions``) is tested against it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "PARTITION_CHECKS",
    "PartitionAnomaly",
    "PartitionExports",
    "check_partitions",
    "read_partition_exports",
]

PARTITION_CHECKS: Final = (
    "replica-divergence",
    "hw-regression",
    "epoch-regression",
    "truncated-committed",
    "log-start-above-hw",
    "ineligible-isr",
)
"""The partition checks, in the order they are reported."""

_FILES: Final = {
    "records": "partitions.jsonl",
    "states": "partition_state.jsonl",
    "timeline": "partition_timeline.jsonl",
    "changes": "partition_changes.jsonl",
    "registrations": "broker_registrations.jsonl",
}

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PartitionExports:
    """A run's partition exports, every node's lines of each file."""

    records: tuple[Row, ...] = ()
    states: tuple[Row, ...] = ()
    timeline: tuple[Row, ...] = ()
    changes: tuple[Row, ...] = ()
    registrations: tuple[Row, ...] = ()

    @property
    def present(self) -> bool:
        """Whether the run exported brokers' partitions at all."""
        return bool(self.records or self.states or self.timeline)


def read_partition_exports(run: Path) -> PartitionExports:
    """The partition exports of the run folder ``run`` (every
    ``nodes/<id>/`` file of :data:`_FILES` there is); a line that is not a
    JSON object raises ValueError naming its file and line."""
    found: dict[str, list[Row]] = {name: [] for name in _FILES}
    nodes = run / "nodes"
    folders = sorted(nodes.iterdir()) if nodes.is_dir() else []
    for folder in folders:
        for name, file in _FILES.items():
            path = folder / file
            if not path.is_file():
                continue
            for lineno, line in enumerate(path.read_text().splitlines(), start=1):
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{path}: line {lineno}: not JSON: {e}") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"{path}: line {lineno}: expected a JSON object")
                found[name].append(obj)
    return PartitionExports(**{k: tuple(v) for k, v in found.items()})


@dataclass(frozen=True, slots=True)
class PartitionAnomaly:
    """One anomaly of one partition: the check, the nodes and offsets (or
    HWs, epochs) involved, the timeline lines (``seq``) that show it, and a
    sentence."""

    check: str
    topic: str
    partition: int
    nodes: tuple[int, ...]
    offsets: tuple[int, ...]
    seqs: tuple[int, ...]
    message: str

    def ident(self) -> tuple[str, str, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """What two checkers must agree on (the message may be worded apart)."""
        return (self.check, self.topic, self.partition, self.nodes, self.offsets, self.seqs)


def _tp(row: Row) -> tuple[str, int]:
    return str(row["topic"]), int(row["partition"])


def check_partitions(exports: PartitionExports) -> dict[str, list[PartitionAnomaly]]:
    """Every partition check's anomalies, by check (:data:`PARTITION_CHECKS`)."""
    found: dict[str, list[PartitionAnomaly]] = {c: [] for c in PARTITION_CHECKS}
    states = [r for r in exports.timeline if r["event"] == "state"]
    found["replica-divergence"] = _divergence(exports.records, exports.states, states)
    found["hw-regression"] = _regressions(exports.timeline, "hw")
    found["epoch-regression"] = _regressions(exports.timeline, "epoch")
    found["truncated-committed"] = _truncations(exports.timeline, exports.changes)
    found["log-start-above-hw"] = _start_above_hw(states)
    found["ineligible-isr"] = _ineligible_isr(exports.changes, exports.registrations)
    return found


def ineligible_why(reg: Row | None) -> str:
    """Why a broker whose latest registration line (at or before some
    offset) is ``reg`` may not join an ISR there, or "" if it may."""
    if reg is None or reg["event"] == "unregister":
        return "was not registered"
    epoch = int(reg["broker_epoch"])
    if reg["fenced"]:
        return f"was fenced (broker epoch {epoch})"
    if reg["in_controlled_shutdown"]:
        return f"was in controlled shutdown (broker epoch {epoch})"
    return ""


def ineligible_message(
    topic: str, partition: int, broker: int, offset: int, isr: Sequence[int], why: str
) -> str:
    return (
        f"the controllers brought broker {broker} into the ISR {list(isr)} of "
        f"{topic}-{partition} at metadata offset {offset} while it {why}: only a registered, "
        f"unfenced broker not in controlled shutdown may join an ISR (KIP-841, KIP-903)"
    )


def _ineligible_isr(changes: Iterable[Row], registrations: Iterable[Row]) -> list[PartitionAnomaly]:
    """Brokers a committed change brought into an ISR while ineligible."""
    regs: dict[int, list[Row]] = defaultdict(list)
    for r in registrations:
        regs[int(r["node"])].append(r)
    per_node: dict[int, list[Row]] = defaultdict(list)
    for c in changes:
        per_node[int(c["node"])].append(c)
    found: dict[tuple[str, int, int, int], PartitionAnomaly] = {}
    for node in sorted(per_node):
        if node not in regs:
            continue  # this controller exported no registrations
        lines = sorted(regs[node], key=lambda r: int(r["offset"]))
        latest: dict[int, Row] = {}
        i = 0
        before: dict[tuple[str, int], Row] = {}
        for c in sorted(per_node[node], key=lambda c: int(c["offset"])):
            offset = int(c["offset"])
            while i < len(lines) and int(lines[i]["offset"]) < offset:
                latest[int(lines[i]["broker"])] = lines[i]
                i += 1
            k = _tp(c)
            prev = before.get(k)
            before[k] = c
            isr = [int(b) for b in c["isr"]]
            if prev is not None and int(c["partition_epoch"]) > int(prev["partition_epoch"]):
                joined = [b for b in isr if b not in {int(x) for x in prev["isr"]}]
            else:
                joined = isr  # a new partition (or one created again)
            for b in joined:
                why = ineligible_why(latest.get(b))
                if not why or (*k, b, offset) in found:
                    continue
                found[(*k, b, offset)] = PartitionAnomaly(
                    "ineligible-isr",
                    k[0],
                    k[1],
                    (b,),
                    (offset,),
                    (),
                    ineligible_message(k[0], k[1], b, offset, isr, why),
                )
    return [found[k] for k in sorted(found)]


def _start_above_hw(states: Iterable[Row]) -> list[PartitionAnomaly]:
    """State lines whose log start offset is above their HW."""
    out = []
    for row in sorted(states, key=lambda r: (*_tp(r), int(r["node"]), int(r["seq"]))):
        start = row.get("log_start_offset")
        if start is None or int(start) <= int(row["high_watermark"]):
            continue
        topic, partition = _tp(row)
        node, hw = int(row["node"]), int(row["high_watermark"])
        out.append(
            PartitionAnomaly(
                "log-start-above-hw",
                topic,
                partition,
                (node,),
                (int(start), hw),
                (int(row["seq"]),),
                f"node {node}'s log start offset of {topic}-{partition} is {int(start)}, above "
                f"its HW {hw} (at {int(row['time']) / 1e9:.3f} s): records removed before "
                f"they were committed",
            )
        )
    return out


def _divergence(
    records: Iterable[Row], checkpoints: Iterable[Row], states: Iterable[Row]
) -> list[PartitionAnomaly]:
    own: dict[tuple[str, int, int], int] = {}
    for row in (*checkpoints, *states):
        k = (*_tp(row), int(row["node"]))
        own[k] = max(own.get(k, -1), int(row["high_watermark"]))
    at: dict[tuple[str, int, int], dict[int, tuple[Any, ...]]] = defaultdict(dict)
    for r in records:
        topic, partition = _tp(r)
        node, offset = int(r["node"]), int(r["offset"])
        if offset < own.get((topic, partition, node), -1):
            at[topic, partition, offset][node] = (
                r["hash"],
                r["epoch"],
                r["producer_id"],
                r["sequence"],
            )
    out = []
    for (topic, partition, offset), by_node in sorted(at.items()):
        if len(set(by_node.values())) < 2:
            continue
        nodes = tuple(sorted(by_node))
        held = "; ".join(
            f"node {n}: epoch {by_node[n][1]}, producer {by_node[n][2]} sequence "
            f"{by_node[n][3]}, hash {str(by_node[n][0])[:12]}"
            for n in nodes
        )
        out.append(
            PartitionAnomaly(
                "replica-divergence",
                topic,
                partition,
                nodes,
                (offset,),
                (),
                f"{topic}-{partition} offset {offset}, below the HW of each replica shown, "
                f"differs between replicas: {held}",
            )
        )
    return out


def _regressions(timeline: Sequence[Row], what: str) -> list[PartitionAnomaly]:
    """HWs (per life) or leader epochs (across lives) that went down between
    two successive state lines of one replica, unless a removal (or, for
    HWs, a truncation or a log restart) came between them."""
    per: dict[tuple[str, int, int], list[Row]] = defaultdict(list)
    for row in timeline:
        per[(*_tp(row), int(row["node"]))].append(row)
    out = []
    for (topic, partition, node), rows in sorted(per.items()):
        prev: Row | None = None
        for row in sorted(rows, key=lambda r: int(r["seq"])):
            event = row["event"]
            if event == "removed" or (what == "hw" and event in ("truncate", "restart")):
                prev = None
                continue
            if event != "state":
                continue
            if what == "hw":
                if prev is not None and prev["life"] != row["life"]:
                    prev = None
                a = None if prev is None else int(prev["high_watermark"])
                b = int(row["high_watermark"])
            else:
                if int(row["leader_epoch"]) < 0:
                    continue  # no epoch known yet
                a = None if prev is None else int(prev["leader_epoch"])
                b = int(row["leader_epoch"])
            if prev is not None and a is not None and b < a:
                word = "HW" if what == "hw" else "leader epoch"
                out.append(
                    PartitionAnomaly(
                        f"{what}-regression",
                        topic,
                        partition,
                        (node,),
                        (a, b),
                        (int(prev["seq"]), int(row["seq"])),
                        f"node {node}'s {word} of {topic}-{partition} went from {a} down to {b} "
                        f"(at {int(prev['time']) / 1e9:.3f} s and {int(row['time']) / 1e9:.3f} s)",
                    )
                )
            prev = row
    return out


def _truncations(timeline: Sequence[Row], changes: Iterable[Row]) -> list[PartitionAnomaly]:
    states: dict[tuple[str, int], list[Row]] = defaultdict(list)
    for row in timeline:
        if row["event"] == "state":
            states[_tp(row)].append(row)
    unclean: dict[tuple[str, int], int] = {}
    for c in changes:
        if c.get("unclean"):
            k = _tp(c)
            unclean[k] = min(unclean.get(k, int(c["leader_epoch"])), int(c["leader_epoch"]))
    out = []
    for t in sorted(timeline, key=lambda r: (int(r["node"]), int(r["seq"]))):
        if t["event"] != "truncate":
            continue
        k = _tp(t)
        node, seq, when = int(t["node"]), int(t["seq"]), int(t["time"])
        committed = max(
            (
                int(s["high_watermark"])
                for s in states[k]
                if int(s["node"]) == node and s["life"] == t["life"] and int(s["seq"]) < seq
            ),
            default=-1,
        )
        to = int(t["truncated_to"])
        if to >= committed:
            continue
        if k in unclean and unclean[k] <= int(t["leader_epoch"]):
            continue  # an unclean election may lose committed records
        out.append(
            PartitionAnomaly(
                "truncated-committed",
                k[0],
                k[1],
                (node,),
                (to, committed),
                (seq,),
                f"node {node} truncated {k[0]}-{k[1]} from {int(t['truncated_from'])} to {to} "
                f"in leader epoch {int(t['leader_epoch'])} at {when / 1e9:.3f} s, below the "
                f"committed HW {committed}, with no unclean election recorded",
            )
        )
    return out
