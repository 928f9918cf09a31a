"""The safety properties of the transaction simulation
(:mod:`broker.sim.txn`), checked after every event after the broker
simulation's own (:class:`~broker.sim.invariants.InvariantChecker`), and
the end-of-run check of a healed, quiet cluster.

After every event:

- ``markers-agree`` (a): a marker of producer id P at epoch E agrees with
  the coordinator's committed decision for (P, E) (its PREPARE_COMMIT or
  PREPARE_ABORT below the transaction-state partition's HW), and no
  decision has a COMMIT marker in one partition and an ABORT in another.
- ``complete-after-markers`` (a): a COMPLETE_COMMIT or COMPLETE_ABORT
  below that HW comes only after the marker of every partition of its
  PREPARE was written.
- ``stable-offset`` (b): a ``read_committed`` reader's bound (the serving
  leader's last stable offset) never passes the first offset of a
  transaction still open in the partition.
- ``read-committed`` (b): a ``read_committed`` reader of any partition
  (the serving leader's batches below that bound, aborted transactions'
  records and control batches dropped) sees only records of transactions
  whose producer asked to commit them and the coordinator decided commit.
- ``no-write-after-fence`` (c): in no replica's log does a data batch of
  an epoch older than a marker of its producer come after that marker.

At the end (:func:`check_settled`, after healing and a quiet phase longer
than every timeout): ``committed-visible`` (every acknowledged record of a
transaction whose commit was acknowledged is visible to
``read_committed``), ``aborted-invisible`` (none of an acknowledged
abort's), ``hanging-transaction`` (every partition's last stable offset
is its HW) and ``coordinator-settled`` (the coordinator is loaded and has
no transaction ongoing or prepared).  A partition left without a clean
candidate (every in-sync copy lost power) is skipped there, with what
needs it, as the broker simulation's end check skips it.

Logs are read from outside, incrementally: each replica's batches are
scanned once (again from the start after a truncation or a restart).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.sim.cluster import SimCluster
from broker.sim.invariants import RULES, Check, InvariantChecker, Violation, _Logs
from broker.sim.logs import BatchId, batches
from broker.sim.txn import TxnSimCluster
from broker.txn import codec
from broker.txn.records import TxnRecord
from broker.txn.types import TransactionState
from partition_log.batch import BatchHeader, BatchScanner, decode_records
from partition_log.errors import PartitionLogError
from partition_log.log import PartitionLog
from partition_log.txn import ControlType, read_marker

__all__ = ["BatchInfo", "LogScan", "TxnInvariantChecker", "check_settled"]

_S = TransactionState


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What the checker reads of one batch."""

    base: int
    last: int
    batch_id: BatchId
    producer_id: int
    producer_epoch: int
    transactional: bool
    marker: ControlType | None
    values: tuple[str, ...]
    records: tuple[TxnRecord, ...]


def _mark(log: PartitionLog) -> tuple[int, int, object]:
    """What changes whenever ``log``'s batches do: its ends and its latest
    epoch entry (a truncation followed by appends to the same end writes a
    newer epoch)."""
    return (log.log_start_offset, log.log_end_offset, log.epoch_cache.latest_entry)


class LogScan:
    """One replica's batches, scanned incrementally; with the open
    transactions and the fence (highest marker epoch) of each producer."""

    __slots__ = (
        "batches",
        "end",
        "fence",
        "generation",
        "log",
        "mark",
        "open_first",
        "problems",
        "state",
    )

    def __init__(self, state: bool) -> None:
        self.state = state
        self.log: PartitionLog | None = None
        self.end = 0
        self.batches: list[BatchInfo] = []
        self.generation = 0
        self.fence: dict[int, int] = {}
        self.open_first: dict[int, int] = {}
        self.problems: list[str] = []
        self.mark: tuple[int, int, object] = (-1, -1, None)

    def _intact(self, log: PartitionLog) -> bool:
        if not self.batches:
            return log.log_start_offset <= self.end
        last = self.batches[-1]
        try:
            data = log.read(last.base, 1)
        except PartitionLogError:
            return False
        if len(data) < 61:
            return False
        header = BatchHeader.parse(data)
        return (
            header.base_offset == last.base
            and (header.partition_leader_epoch, header.crc) == last.batch_id
        )

    def update(self, log: PartitionLog) -> list[BatchInfo]:
        """The batches new since the last update (all of them after a
        reset)."""
        mark = _mark(log)
        if self.log is log and mark == self.mark:
            return []
        self.mark = mark
        if self.log is not log or log.log_end_offset < self.end or not self._intact(log):
            self.log = log
            self.end = log.log_start_offset
            self.batches = []
            self.generation += 1
            self.fence = {}
            self.open_first = {}
        new: list[BatchInfo] = []
        offset = self.end
        while offset < log.log_end_offset:
            data = log.read(offset, 1 << 30)
            before = offset
            for batch in BatchScanner(data, check_crc=False):
                header = batch.header
                if header.base_offset < offset:
                    continue
                raw = data[batch.position : batch.end]
                info = self._info(header, raw)
                new.append(info)
                self._account(info)
                offset = header.next_offset
            if offset == before:
                break
        self.end = offset
        self.batches.extend(new)
        return new

    def _info(self, header: BatchHeader, raw: bytes) -> BatchInfo:
        marker = None
        values: tuple[str, ...] = ()
        records: tuple[TxnRecord, ...] = ()
        if header.is_control:
            marker = read_marker(raw, header).type
        elif self.state:
            records = tuple(
                codec.decode(r.key, r.value) for r in decode_records(raw) if r.key is not None
            )
        else:
            values = tuple((r.value or b"").decode("utf-8", "replace") for r in decode_records(raw))
        return BatchInfo(
            header.base_offset,
            header.next_offset - 1,
            (header.partition_leader_epoch, header.crc),
            header.producer_id,
            header.producer_epoch,
            header.is_transactional,
            marker,
            values,
            records,
        )

    def _account(self, info: BatchInfo) -> None:
        pid = info.producer_id
        if pid < 0:
            return
        if info.marker is not None:
            self.fence[pid] = max(self.fence.get(pid, -1), info.producer_epoch)
            self.open_first.pop(pid, None)
            return
        fence = self.fence.get(pid)
        if fence is not None and info.producer_epoch < fence:
            self.problems.append(
                f"a batch of producer {pid} epoch {info.producer_epoch} at offset {info.base} "
                f"after its marker of epoch {fence}"
            )
        if info.transactional and pid not in self.open_first:
            self.open_first[pid] = info.base


@dataclass(slots=True)
class _Decision:
    """One committed PREPARE_* of a (producer id, epoch): its outcome, its
    partitions and the markers written for it."""

    transactional_id: str
    commit: bool
    partitions: frozenset[int]
    markers: dict[int, set[ControlType]] = field(default_factory=dict)
    completed: bool = False


@dataclass(slots=True)
class _Reader:
    """A read_committed reader of one partition at one leader's log."""

    leader: int
    incarnation: int
    scan: LogScan
    generation: int
    index: int = 0
    # producer id -> the records of its transaction not yet ended
    pending: dict[int, list[tuple[int, str, int]]] = field(default_factory=dict)
    # (offset, value, producer id, epoch) of records a COMMIT ended
    visible: list[tuple[int, str, int, int]] = field(default_factory=list)

    def advance(self, bound: int) -> list[tuple[int, str, int, int]]:
        """Reads on to ``bound``; the records newly made visible by a
        marker (or outside any transaction)."""
        new: list[tuple[int, str, int, int]] = []
        batches = self.scan.batches
        while self.index < len(batches) and batches[self.index].last < bound:
            info = batches[self.index]
            self.index += 1
            pid = info.producer_id
            if info.marker is not None:
                ended = self.pending.pop(pid, [])
                if info.marker is ControlType.COMMIT:
                    new.extend((o, v, pid, e) for o, v, e in ended)
            elif info.transactional:
                self.pending.setdefault(pid, []).extend(
                    (info.base + i, v, info.producer_epoch) for i, v in enumerate(info.values)
                )
            else:
                new.extend(
                    (info.base + i, v, pid, info.producer_epoch) for i, v in enumerate(info.values)
                )
        self.visible.extend(new)
        return new

    def pending_visible(self) -> list[tuple[int, str, int, int]]:
        """Records below the bound whose transaction no marker below it
        ended: a reader gets them unless an abort of theirs is in the log
        (Kafka's consumer drops only what the aborted-transaction list
        names)."""
        out: list[tuple[int, str, int, int]] = []
        if not self.pending:
            return out
        later = self.scan.batches[self.index :]
        for pid, records in self.pending.items():
            end = next(
                (b.marker for b in later if b.producer_id == pid and b.marker is not None), None
            )
            if end is not ControlType.ABORT:
                out.extend((o, v, pid, e) for o, v, e in records)
        return out


def _txn_key(value: str) -> tuple[str, int, int] | None:
    parts = value.split("/")
    if len(parts) != 5:
        return None
    try:
        return parts[0], int(parts[1]), int(parts[2])
    except ValueError:
        return None


class _SharedLogs(_Logs):
    """The broker simulation's view of the logs, each log's batches read
    again only once it changed (a transaction run's logs grow long)."""

    def __init__(
        self,
        cluster: SimCluster,
        shared: dict[tuple[int, int], tuple[PartitionLog, object, dict[int, BatchId]]],
    ) -> None:
        super().__init__(cluster)
        self.shared = shared

    def batches(self, broker_id: int, p: int) -> dict[int, BatchId] | None:
        log = self.log(broker_id, p)
        if log is None:
            return None
        mark = _mark(log)
        found = self.shared.get((broker_id, p))
        if found is not None and found[0] is log and found[1] == mark:
            return found[2]
        read = batches(log)
        self.shared[(broker_id, p)] = (log, mark, read)
        return read


@dataclass(slots=True)
class _BrokerChecker(InvariantChecker):
    """:class:`InvariantChecker`'s rules, in its order, over
    :class:`_SharedLogs`."""

    shared: dict[tuple[int, int], tuple[PartitionLog, object, dict[int, BatchId]]] = field(
        default_factory=dict
    )

    def __call__(self, cluster: SimCluster) -> None:
        self.checks += 1
        logs = _SharedLogs(cluster, self.shared)
        rules: dict[str, Check] = {
            "log-start": self.log_start,
            **RULES,
            "monotonic": self.monotonic,
        }
        for rule, check in rules.items():
            problems = check(cluster, logs)
            if problems:
                raise Violation(rule, "; ".join(problems), cluster.seed, cluster.events)


class TxnInvariantChecker:
    """Every rule after every event: the broker simulation's, then the
    transactions'.  Keeps what it has seen (decisions, markers) across
    events."""

    def __init__(self) -> None:
        self.base: InvariantChecker = _BrokerChecker()
        self.scans: dict[tuple[int, int], LogScan] = {}
        self.decisions: dict[tuple[int, int], list[_Decision]] = {}
        self.seen_state: set[tuple[int, BatchId]] = set()
        self.readers: dict[int, _Reader] = {}
        self.checks = 0

    def __call__(self, cluster: SimCluster) -> None:
        self.base(cluster)
        assert isinstance(cluster, TxnSimCluster)
        self.checks += 1
        for rule, problems in self._check(cluster):
            if problems:
                raise Violation(
                    rule,
                    "; ".join(problems[:3]) + f" [after {cluster.last_event}]",
                    cluster.seed,
                    cluster.events,
                )

    def scan(self, cluster: TxnSimCluster, broker_id: int, p: int) -> LogScan | None:
        broker = cluster.brokers[broker_id]
        log = broker.logs.get(p) if broker.alive else None
        if log is None:
            return None
        key = (broker_id, p)
        found = self.scans.get(key)
        if found is None:
            found = self.scans[key] = LogScan(p == cluster.state_partition)
        return found

    def _check(self, cluster: TxnSimCluster) -> list[tuple[str, list[str]]]:
        sp = cluster.state_partition
        new_markers: list[tuple[int, BatchInfo]] = []
        fenced: list[str] = []
        for b in sorted(cluster.brokers):
            for p in cluster.brokers[b].partitions:
                scan = self.scan(cluster, b, p)
                if scan is None:
                    continue
                log = cluster.brokers[b].logs[p]
                new = scan.update(log)
                if p != sp:
                    new_markers.extend((p, i) for i in new if i.marker is not None)
                if scan.problems:
                    fenced.extend(f"p{p} on broker {b}: {what}" for what in scan.problems)
                    scan.problems.clear()
        completes = self._read_decisions(cluster)
        agree = self._markers(new_markers)
        complete = self._completes(completes)
        stable, read = self._readers(cluster)
        return [
            ("markers-agree", agree),
            ("complete-after-markers", complete),
            ("no-write-after-fence", fenced),
            ("stable-offset", stable),
            ("read-committed", read),
        ]

    # -- (a) markers and decisions --------------------------------------------------

    def _read_decisions(self, cluster: TxnSimCluster) -> list[tuple[int, int]]:
        """The state partition's new records below the serving leader's HW
        into decisions; the (producer id, epoch) of each new COMPLETE."""
        sp = cluster.state_partition
        leader = cluster.serving_leader(sp)
        if leader is None:
            return []
        scan = self.scans.get((leader, sp))
        if scan is None:
            return []
        hw = cluster.brokers[leader].logs[sp].high_watermark
        completes = []
        for info in scan.batches:
            if info.last >= hw:
                break
            key = (info.base, info.batch_id)
            if key in self.seen_state:
                continue
            self.seen_state.add(key)
            for record in info.records:
                value = record.value
                if value is None:
                    continue
                state = _S(value.state)
                ident = (value.producer_id, value.producer_epoch)
                if state.is_prepare:
                    self.decisions.setdefault(ident, []).append(
                        _Decision(
                            record.key.transactional_id,
                            state is _S.PREPARE_COMMIT,
                            frozenset(tp.partition for tp in value.partitions),
                        )
                    )
                elif state.is_complete:
                    completes.append(ident)
        return completes

    def _markers(self, new: list[tuple[int, BatchInfo]]) -> list[str]:
        problems = []
        for p, info in new:
            ident = (info.producer_id, info.producer_epoch)
            assert info.marker is not None
            found = self.decisions.get(ident)
            what = f"{info.marker.name} marker of producer {ident[0]} epoch {ident[1]} in p{p}"
            if not found:
                problems.append(f"{what} at {info.base}: the coordinator decided nothing")
                continue
            decision = found[-1]
            decision.markers.setdefault(p, set()).add(info.marker)
            if decision.commit != (info.marker is ControlType.COMMIT):
                problems.append(
                    f"{what} at {info.base}, but the coordinator decided "
                    f"{'commit' if decision.commit else 'abort'}"
                )
            kinds = set().union(*decision.markers.values())
            if len(kinds) > 1:
                where = {q: sorted(k.name for k in m) for q, m in sorted(decision.markers.items())}
                problems.append(
                    f"producer {ident[0]} epoch {ident[1]} has COMMIT and ABORT markers: {where}"
                )
        return problems

    def _completes(self, completes: list[tuple[int, int]]) -> list[str]:
        problems = []
        for ident in completes:
            found = self.decisions.get(ident)
            if not found:
                continue
            decision = found[-1]
            decision.completed = True
            missing = sorted(p for p in decision.partitions if p not in decision.markers)
            if missing:
                problems.append(
                    f"{decision.transactional_id} (producer {ident[0]} epoch {ident[1]}) "
                    f"completed {'commit' if decision.commit else 'abort'} with no marker "
                    f"written in p{missing} of p{sorted(decision.partitions)}"
                )
        return problems

    # -- (b) readers ----------------------------------------------------------------

    def reader(self, cluster: TxnSimCluster, p: int) -> _Reader | None:
        leader = cluster.serving_leader(p)
        if leader is None:
            return None
        scan = self.scans.get((leader, p))
        if scan is None:
            return None
        incarnation = cluster.brokers[leader].incarnation
        reader = self.readers.get(p)
        if (
            reader is None
            or reader.leader != leader
            or reader.incarnation != incarnation
            or reader.scan is not scan
            or reader.generation != scan.generation
        ):
            reader = self.readers[p] = _Reader(leader, incarnation, scan, scan.generation)
        return reader

    def committed(self, cluster: TxnSimCluster, value: str, pid: int, epoch: int) -> str | None:
        """Why the record ``value`` of producer ``pid`` at ``epoch`` must
        not be visible, None if it may."""
        key = _txn_key(value)
        txn = None if key is None else cluster.client_txns.get(key)
        if key is None or txn is None:
            return f"record {value!r} of no known transaction"
        if not txn.commit_requested:
            asked = "asked to abort it" if txn.abort_requested else "never asked to end it"
            return (
                f"record {value!r} of transaction {key[2]} of producer {key[1]} ({key[0]}, "
                f"producer id {pid} epoch {epoch}), whose producer {asked}"
            )
        decided = epoch + 1 if cluster.txn_config.bump_epoch_on_end else epoch
        found = self.decisions.get((pid, decided))
        if not found or not found[-1].commit:
            return (
                f"record {value!r} of producer id {pid} epoch {epoch}: the coordinator has no "
                f"commit of producer {pid} epoch {decided}"
            )
        return None

    def _readers(self, cluster: TxnSimCluster) -> tuple[list[str], list[str]]:
        stable: list[str] = []
        read: list[str] = []
        for p in cluster.data_partitions:
            reader = self.reader(cluster, p)
            if reader is None:
                continue
            log = cluster.brokers[reader.leader].logs[p]
            bound = cluster.read_bound(log)
            for pid, first in sorted(reader.scan.open_first.items()):
                if first < bound:
                    stable.append(
                        f"p{p} on leader {reader.leader}: the read_committed bound {bound} "
                        f"(HW {log.high_watermark}) passes offset {first}, where producer "
                        f"{pid}'s open transaction begins"
                    )
            for offset, value, pid, epoch in [*reader.advance(bound), *reader.pending_visible()]:
                why = self.committed(cluster, value, pid, epoch)
                if why is not None:
                    read.append(
                        f"a read_committed reader of p{p} (leader {reader.leader}, below "
                        f"{bound}) sees offset {offset}: {why}"
                    )
        return stable, read


def check_settled(cluster: TxnSimCluster, checker: TxnInvariantChecker) -> None:
    """The end of a run, healed and quiet: raises :class:`Violation`
    naming what did not settle."""

    def fail(rule: str, problems: list[str]) -> None:
        if problems:
            raise Violation(rule, "; ".join(problems[:3]), cluster.seed, cluster.events)

    # Partitions without a clean candidate (no ISR or ELR member: every
    # in-sync copy lost power) wait for an unclean election, as the broker
    # simulation's own end check accepts; what needs them is not checked.
    lost = {
        p
        for p, registration in cluster.controller.partitions.items()
        if not registration.isr and not registration.elr
    }
    visible: dict[int, set[str]] = {}
    offline = []
    hanging = []
    for p in cluster.data_partitions:
        if p in lost:
            continue
        reader = checker.reader(cluster, p)
        if reader is None:
            offline.append(f"p{p} has no serving leader")
            continue
        log = cluster.brokers[reader.leader].logs[p]
        reader.advance(cluster.read_bound(log))
        visible[p] = {v for _, v, _, _ in [*reader.visible, *reader.pending_visible()]}
        if log.last_stable_offset != log.high_watermark or reader.scan.open_first:
            opened = dict(sorted(reader.scan.open_first.items()))
            hanging.append(
                f"p{p} on leader {reader.leader}: last stable offset {log.last_stable_offset}, "
                f"HW {log.high_watermark}, open transactions (producer: first offset) {opened}"
            )
    fail("liveness", offline)
    fail("hanging-transaction", hanging)
    missing, leaked = [], []
    for key, txn in sorted(cluster.client_txns.items()):
        for batch in txn.acked:
            if batch.partition in lost:
                continue
            seen = [v in visible[batch.partition] for v in batch.values]
            if txn.outcome == "committed" and not all(seen):
                missing.append(
                    f"transaction {key} committed, but its records {list(batch.values)} at "
                    f"p{batch.partition} offset {batch.offset} are not all visible"
                )
            if txn.outcome == "aborted" and any(seen):
                leaked.append(
                    f"transaction {key} aborted, but its records {list(batch.values)} at "
                    f"p{batch.partition} offset {batch.offset} are visible"
                )
    fail("committed-visible", missing)
    fail("aborted-invisible", leaked)
    if cluster.state_partition in lost:
        return
    leader = cluster.serving_leader(cluster.state_partition)
    coordinator = None if leader is None else cluster.coordinator_on(cluster.brokers[leader])
    if coordinator is None or not coordinator.loaded:
        fail("coordinator-settled", [f"no loaded coordinator (leader {leader})"])
        return
    unsettled = [
        f"{meta.transactional_id} {meta.state.name} (producer {meta.producer_id} epoch "
        f"{meta.producer_epoch})"
        for meta in coordinator.shard.transactions
        if (meta.state is _S.ONGOING or meta.state.is_prepare)
        and not any(tp.partition in lost for tp in meta.partitions)
    ]
    fail("coordinator-settled", unsettled)
