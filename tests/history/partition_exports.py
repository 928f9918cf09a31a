"""Partition exports written for the tests: a builder of the five files'
lines (``docs/history-format.md``, "Brokers' partitions"), and a clean
three-broker run with one of each planted anomaly on demand.

Shared by the reference checks' tests and the Spark job's tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from history.exports import record_hash
from history.partition_checks import PartitionExports

T = "queue"


class Partitions:
    """Export lines of one run, line by line; ``seq`` counts per node."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.states: list[dict[str, Any]] = []
        self.timeline: list[dict[str, Any]] = []
        self.changes: list[dict[str, Any]] = []
        self.registrations: list[dict[str, Any]] = []
        self._seq: dict[int, int] = {}
        self._life: dict[int, int] = {}

    def _next(self, node: int) -> int:
        self._seq[node] = self._seq.get(node, 0) + 1
        return self._seq[node]

    def restart(self, node: int) -> None:
        self._life[node] = self._life.get(node, 0) + 1
        self._next(node)

    def state(
        self,
        node: int,
        t_ms: int,
        hw: int,
        leo: int,
        epoch: int,
        leader: int,
        isr: tuple[int, ...] = (1, 2, 3),
        partition: int = 0,
        start: int | None = 0,
    ) -> None:
        self.timeline.append(
            {
                "node": node,
                "seq": self._next(node),
                "life": self._life.get(node, 0),
                "time": t_ms * 1_000_000,
                "topic": T,
                "partition": partition,
                "event": "state",
                "leader_epoch": epoch,
                "role": "leader" if leader == node else "follower",
                "leader": leader,
                "high_watermark": hw,
                "log_end_offset": leo,
                "log_start_offset": start,
                "isr": list(isr),
                "truncated_from": None,
                "truncated_to": None,
            }
        )

    def truncate(
        self, node: int, t_ms: int, frm: int, to: int, epoch: int, partition: int = 0
    ) -> None:
        self.timeline.append(
            {
                "node": node,
                "seq": self._next(node),
                "life": self._life.get(node, 0),
                "time": t_ms * 1_000_000,
                "topic": T,
                "partition": partition,
                "event": "truncate",
                "leader_epoch": epoch,
                "role": None,
                "leader": None,
                "high_watermark": None,
                "log_end_offset": None,
                "isr": None,
                "truncated_from": frm,
                "truncated_to": to,
            }
        )

    def restart_log(
        self, node: int, t_ms: int, frm: int, at: int, epoch: int, partition: int = 0
    ) -> None:
        """A follower log restarted at ``at``, its leader's log start, from
        its log end ``frm``."""
        self.timeline.append(
            {
                "node": node,
                "seq": self._next(node),
                "life": self._life.get(node, 0),
                "time": t_ms * 1_000_000,
                "topic": T,
                "partition": partition,
                "event": "restart",
                "leader_epoch": epoch,
                "role": None,
                "leader": None,
                "high_watermark": None,
                "log_end_offset": at,
                "log_start_offset": at,
                "isr": None,
                "truncated_from": frm,
                "truncated_to": None,
            }
        )

    def removed(self, node: int, t_ms: int, partition: int = 0) -> None:
        self.timeline.append(
            {
                "node": node,
                "seq": self._next(node),
                "life": self._life.get(node, 0),
                "time": t_ms * 1_000_000,
                "topic": T,
                "partition": partition,
                "event": "removed",
                "leader_epoch": None,
                "role": None,
                "leader": None,
                "high_watermark": None,
                "log_end_offset": None,
                "isr": None,
                "truncated_from": None,
                "truncated_to": None,
            }
        )

    def log(
        self,
        node: int,
        values: list[int],
        epoch: int = 0,
        producer: int = 1000,
        partition: int = 0,
        start: int = 0,
    ) -> None:
        for i, v in enumerate(values):
            self.records.append(
                {
                    "node": node,
                    "topic": T,
                    "partition": partition,
                    "offset": start + i,
                    "epoch": epoch,
                    "producer_id": producer,
                    "sequence": start + i,
                    "control": False,
                    "hash": record_hash(str(v).encode()),
                }
            )

    def checkpoint(self, node: int, hw: int, leo: int, partition: int = 0) -> None:
        self.states.append(
            {
                "node": node,
                "topic": T,
                "partition": partition,
                "high_watermark": hw,
                "log_end_offset": leo,
                "stopped_at": None,
            }
        )

    def change(
        self,
        offset: int,
        leader: int,
        epoch: int,
        isr: list[int],
        unclean: bool = False,
        node: int = 1,
        partition_epoch: int | None = None,
    ) -> None:
        self.changes.append(
            {
                "node": node,
                "offset": offset,
                "epoch": 1,
                "topic": T,
                "partition": 0,
                "leader": leader,
                "leader_epoch": epoch,
                "partition_epoch": offset if partition_epoch is None else partition_epoch,
                "isr": isr,
                "elr": [],
                "leader_recovery_state": "recovering" if unclean else "recovered",
                "unclean": unclean,
            }
        )

    def registration(
        self,
        offset: int,
        broker: int,
        event: str,
        broker_epoch: int | None = None,
        node: int = 1,
    ) -> None:
        """A controller's line of a broker's registration: ``register``
        (at ``broker_epoch``, default the offset; fenced), ``fence``,
        ``unfence``, ``shutdown`` (a ``change`` into controlled shutdown)
        or ``unregister``, replayed on the broker's last line."""
        last = next(
            (
                r
                for r in reversed(self.registrations)
                if r["broker"] == broker and r["node"] == node
            ),
            None,
        )
        if event == "register":
            state: dict[str, Any] = {
                "broker_epoch": offset if broker_epoch is None else broker_epoch,
                "fenced": True,
                "in_controlled_shutdown": False,
            }
        elif event == "unregister":
            state = {"broker_epoch": None, "fenced": None, "in_controlled_shutdown": None}
        else:
            assert last is not None, f"broker {broker} is not registered"
            state = {
                "broker_epoch": last["broker_epoch"],
                "fenced": {"fence": True, "unfence": False}.get(event, last["fenced"]),
                "in_controlled_shutdown": event == "shutdown"
                or (event == "unfence" and last["in_controlled_shutdown"]),
            }
        self.registrations.append(
            {
                "node": node,
                "offset": offset,
                "epoch": 1,
                "broker": broker,
                "event": "change" if event == "shutdown" else event,
                **state,
            }
        )

    def exports(self) -> PartitionExports:
        return PartitionExports(
            tuple(self.records),
            tuple(self.states),
            tuple(self.timeline),
            tuple(self.changes),
            tuple(self.registrations),
        )

    def write(self, run: Path) -> None:
        """The lines under ``run/nodes/<id>/`` as a chaos run writes them."""
        files = (
            ("partitions.jsonl", self.records),
            ("partition_state.jsonl", self.states),
            ("partition_timeline.jsonl", self.timeline),
            ("partition_changes.jsonl", self.changes),
            ("broker_registrations.jsonl", self.registrations),
        )
        for name, lines in files:
            by_node: dict[int, list[dict[str, Any]]] = {}
            for line in lines:
                by_node.setdefault(int(line["node"]), []).append(line)
            for node, mine in by_node.items():
                folder = run / "nodes" / str(node)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(
                    "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in mine)
                )


def clean() -> Partitions:
    """Three brokers, leader 1 in epoch 0, then 2 in epoch 1 after 1 was
    paused: follower 3 truncates its uncommitted tail (offset 3 of epoch
    0, above the HW 3) and every replica ends with offsets 0-4 alike below
    its HW; broker 1 restarts and its HW starts again from its checkpoint.
    The controllers saw brokers 1-3 register and be unfenced, fenced 1 when
    it stopped, and unfenced its new registration before it rejoined the
    ISR."""
    p = Partitions()
    for b in (1, 2, 3):
        p.registration(b, b, "register")
        p.registration(3 + b, b, "unfence")
    p.change(10, 1, 0, [1, 2, 3])
    p.registration(19, 1, "fence")
    p.state(1, 100, 0, 0, 0, 1)
    p.state(2, 110, 0, 0, 0, 1)
    p.state(3, 120, 0, 0, 0, 1)
    p.state(1, 400, 3, 4, 0, 1)
    p.state(2, 410, 3, 3, 0, 1)
    p.state(3, 420, 3, 4, 0, 1)
    p.change(20, 2, 1, [2, 3])
    p.state(2, 900, 3, 3, 1, 2, (2, 3))
    p.state(3, 950, 3, 4, 1, 2, (2, 3))
    p.truncate(3, 960, 4, 3, 1)  # the uncommitted tail of epoch 0
    p.state(3, 1200, 3, 3, 1, 2, (2, 3))
    p.state(2, 1400, 5, 5, 1, 2, (2, 3))
    p.state(3, 1450, 5, 5, 1, 2, (2, 3))
    p.restart(1)
    p.registration(25, 1, "register")
    p.registration(27, 1, "unfence")
    p.state(1, 2000, 2, 4, 1, 2, (2, 3))  # from its checkpoint: a new life
    p.truncate(1, 2010, 4, 3, 1)
    p.state(1, 2300, 5, 5, 1, 2, (1, 2, 3))
    p.change(30, 2, 1, [1, 2, 3])
    for node in (1, 2, 3):
        p.log(node, [1, 2, 3], epoch=0)
        p.log(node, [5, 6], epoch=1, producer=1001, start=3)
        p.checkpoint(node, 5, 5)
    return p
