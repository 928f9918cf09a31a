"""The safety properties of the broker simulation, checked after every
event (``brokers.md`` §1.11). Each is a function of the cluster (and, for
the monotonic ones, of what was seen before) that returns what is wrong, or
nothing; :class:`InvariantChecker` runs them all and raises
:class:`Violation` naming the rule, the seed and the event.

- ``acked-on-leader``: every acks=all record acknowledged NONE is in the
  current leader's log at its acknowledged offset, the same batch (leader
  epoch and CRC), and below its HW once that HW reached the leader's epoch
  start. After an unclean election of that partition the check is waived
  (the loss design.html §4.7 accepts; the result names the partition).
  A record below the leader's log start is not looked for when a
  DeleteRecords raised a log start that far (it was deleted, not lost).
- ``consumed-on-leader``: the same for every record a consumer read.
- ``replicas-agree``: two live replicas hold the same batch at every offset
  below the smaller of their HWs and at or above the larger of their log
  starts.
- ``monotonic``: a leader's HW never goes back within its leadership (the
  same broker incarnation and leader epoch); a replica's leader epoch never
  goes back within an incarnation.
- ``epoch-cache``: a replica's epoch cache is the one derived from its
  batches (the first offset of each epoch), but for a last entry at the
  LEO (a leader's epoch with nothing written yet).
- ``consumer-below-hw``: a poll returns only offsets below the leader's HW.
- ``log-start``: a replica's log start never goes back (but across a power
  loss of its broker, which may lose the records beneath it too).
- ``deleted-stay-deleted``: the serving leader holds no record below the
  highest offset a DeleteRecords answered NONE for (every replica on a
  live broker and every ISR and ELR member had moved its log start
  there), whichever replica leads now; waived after an unclean election.

The checker reads logs from outside (their batches) and the controller's
registrations; it never trusts the replicas' own bookkeeping beyond the HW
and epochs it checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker.replica import Role
from broker.sim.cluster import SimCluster
from broker.sim.logs import BatchId, batches
from partition_log.log import PartitionLog

__all__ = [
    "RULES",
    "InvariantChecker",
    "Violation",
    "acked_on_leader",
    "consumed_on_leader",
    "consumer_below_hw",
    "deleted_stay_deleted",
    "epoch_cache_matches_batches",
    "replicas_agree",
]


class Violation(AssertionError):
    """A safety property failed: the rule, the seed and the event."""

    def __init__(self, rule: str, detail: str, seed: int, event: int) -> None:
        super().__init__(f"{rule}: {detail} (seed {seed}, event {event})")
        self.rule = rule
        self.detail = detail
        self.seed = seed
        self.event = event


class _Logs:
    """Each live log's batches, read once per check."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self._cache: dict[tuple[int, int], dict[int, BatchId]] = {}

    def log(self, broker_id: int, p: int) -> PartitionLog | None:
        broker = self.cluster.brokers[broker_id]
        return broker.logs.get(p) if broker.alive else None

    def batches(self, broker_id: int, p: int) -> dict[int, BatchId] | None:
        key = (broker_id, p)
        if key not in self._cache:
            log = self.log(broker_id, p)
            if log is None:
                return None
            self._cache[key] = batches(log)
        return self._cache[key]


def _missing_on_leader(
    cluster: SimCluster, logs: _Logs, what: str, items: list[tuple[int, int, BatchId, str]]
) -> list[str]:
    problems = []
    for p, offset, batch, value in items:
        leader = cluster.serving_leader(p)
        if leader is None or p in cluster.controller.unclean:
            continue
        have = logs.batches(leader, p)
        log = logs.log(leader, p)
        if have is None or log is None:
            continue
        if offset < log.log_start_offset <= cluster.deletes_applied[p]:
            continue  # deleted (DeleteRecords), not lost
        if have.get(offset) != batch:
            problems.append(
                f"{what} {value!r} at p{p} offset {offset} {batch} is not on leader "
                f"{leader} (it has {have.get(offset)})"
            )
            continue
        # Below the HW once the leader's HW reached its epoch start (before
        # that a new leader's HW may lag what earlier leaders committed:
        # KIP-207's window, where ListOffsets says OFFSET_NOT_AVAILABLE).
        start = cluster.brokers[leader].replicas[p].leader_epoch_start_offset
        hw = log.high_watermark
        if start is not None and hw >= start and offset >= hw:
            problems.append(
                f"{what} {value!r} at p{p} offset {offset} is above leader {leader}'s "
                f"HW {hw}, which is past its epoch start {start}"
            )
    return problems


def acked_on_leader(cluster: SimCluster, logs: _Logs) -> list[str]:
    return _missing_on_leader(
        cluster,
        logs,
        "acknowledged acks=all record",
        [(a.partition, a.offset, a.batch, a.value) for a in cluster.acked],
    )


def consumed_on_leader(cluster: SimCluster, logs: _Logs) -> list[str]:
    return _missing_on_leader(
        cluster,
        logs,
        "consumed record",
        [(c.partition, c.offset, c.batch, c.value) for c in cluster.consumed],
    )


def replicas_agree(cluster: SimCluster, logs: _Logs) -> list[str]:
    problems = []
    for p, replicas in cluster.assignments.items():
        if p in cluster.controller.unclean:
            continue
        live = [b for b in replicas if logs.log(b, p) is not None]
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                log_a, log_b = logs.log(a, p), logs.log(b, p)
                assert log_a is not None and log_b is not None
                below = min(log_a.high_watermark, log_b.high_watermark)
                # Below the larger log start one of them deleted the records
                # (a follower moves its start one fetch after its leader).
                start = max(log_a.log_start_offset, log_b.log_start_offset)
                ba, bb = logs.batches(a, p), logs.batches(b, p)
                assert ba is not None and bb is not None
                for offset in sorted(set(ba) | set(bb)):
                    if offset < start:
                        continue
                    if offset >= below:
                        break
                    if ba.get(offset) != bb.get(offset):
                        problems.append(
                            f"p{p} offset {offset} below HW {below}: broker {a} has "
                            f"{ba.get(offset)}, broker {b} has {bb.get(offset)}"
                        )
                        break
    return problems


def epoch_cache_matches_batches(cluster: SimCluster, logs: _Logs) -> list[str]:
    problems = []
    for broker_id, broker in cluster.brokers.items():
        for p in broker.partitions:
            log = logs.log(broker_id, p)
            found = logs.batches(broker_id, p)
            if log is None or found is None:
                continue
            derived: list[tuple[int, int]] = []
            for offset in sorted(found):
                epoch = found[offset][0]
                if not derived or epoch != derived[-1][0]:
                    derived.append((epoch, offset))
            cached = [(e.epoch, e.start_offset) for e in log.epoch_cache.entries]
            if (
                cached
                and cached[-1][1] >= log.log_end_offset
                and (not derived or cached[-1][0] > derived[-1][0])
            ):
                cached = cached[:-1]
            if cached != derived:
                problems.append(
                    f"p{p} on broker {broker_id}: epoch cache {cached}, batches give {derived}"
                )
    return problems


def consumer_below_hw(cluster: SimCluster, logs: _Logs) -> list[str]:
    del logs
    if cluster.last_poll is None:
        return []
    p, leader, got, high_watermark = cluster.last_poll
    cluster.last_poll = None
    above = [c.offset for c in got if c.offset >= high_watermark]
    if above:
        return [
            f"a poll of p{p} from leader {leader} returned offsets {above} at HW {high_watermark}"
        ]
    return []


def deleted_stay_deleted(cluster: SimCluster, logs: _Logs) -> list[str]:
    problems = []
    for p, deleted in cluster.deletes_acked.items():
        leader = cluster.serving_leader(p)
        if deleted == 0 or leader is None or p in cluster.controller.unclean:
            continue
        have = logs.batches(leader, p)
        log = logs.log(leader, p)
        if have is None or log is None:
            continue
        readable = sorted(offset for offset in have if offset < deleted)
        if readable:
            problems.append(
                f"p{p}: records below {deleted} were deleted (DeleteRecords answered NONE), "
                f"leader {leader} (log start {log.log_start_offset}) holds offsets "
                f"{readable[:5]}"
            )
    return problems


Check = Callable[[SimCluster, _Logs], list[str]]

RULES: dict[str, Check] = {
    "consumer-below-hw": consumer_below_hw,
    "acked-on-leader": acked_on_leader,
    "consumed-on-leader": consumed_on_leader,
    "replicas-agree": replicas_agree,
    "epoch-cache": epoch_cache_matches_batches,
    "deleted-stay-deleted": deleted_stay_deleted,
}


@dataclass(slots=True)
class InvariantChecker:
    """Every rule after every event; the monotonic rule keeps what it saw."""

    # (broker, incarnation, partition) -> leader epoch last seen
    epochs: dict[tuple[int, int, int], int] = field(default_factory=dict)
    # (broker, incarnation, partition, leader epoch) -> HW last seen leading
    high_watermarks: dict[tuple[int, int, int, int], int] = field(default_factory=dict)
    # (broker, power losses, partition) -> log start last seen
    log_starts: dict[tuple[int, int, int], int] = field(default_factory=dict)
    checks: int = 0

    def log_start(self, cluster: SimCluster, logs: _Logs) -> list[str]:
        problems = []
        for broker_id, broker in cluster.brokers.items():
            for p in broker.partitions:
                log = logs.log(broker_id, p)
                if log is None:
                    continue
                key = (broker_id, broker.power_losses, p)
                start = log.log_start_offset
                before = self.log_starts.get(key)
                if before is not None and start < before:
                    problems.append(f"p{p} on broker {broker_id}: log start {start} after {before}")
                self.log_starts[key] = start
        return problems

    def monotonic(self, cluster: SimCluster, logs: _Logs) -> list[str]:
        problems = []
        for broker_id, broker in cluster.brokers.items():
            if not broker.alive:
                continue
            for p, replica in broker.replicas.items():
                key = (broker_id, broker.incarnation, p)
                seen = self.epochs.get(key)
                if seen is not None and replica.leader_epoch < seen:
                    problems.append(
                        f"p{p} on broker {broker_id}: leader epoch "
                        f"{replica.leader_epoch} after {seen}"
                    )
                self.epochs[key] = replica.leader_epoch
                if replica.role is not Role.LEADER:
                    continue
                hw = broker.logs[p].high_watermark
                lead = (*key, replica.leader_epoch)
                before = self.high_watermarks.get(lead)
                if before is not None and hw < before:
                    problems.append(
                        f"p{p} leader {broker_id} epoch {replica.leader_epoch}: "
                        f"HW {hw} after {before}"
                    )
                self.high_watermarks[lead] = hw
        return problems

    def __call__(self, cluster: SimCluster) -> None:
        self.checks += 1
        logs = _Logs(cluster)
        # A log start gone back shows first as itself, not as the epoch
        # cache or batches it exposes.
        rules: dict[str, Check] = {
            "log-start": self.log_start,
            **RULES,
            "monotonic": self.monotonic,
        }
        for rule, check in rules.items():
            problems = check(cluster, logs)
            if problems:
                raise Violation(rule, "; ".join(problems), cluster.seed, cluster.events)
