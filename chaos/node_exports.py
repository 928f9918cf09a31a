"""What a cluster's nodes left, as run-folder exports: both backends
(:mod:`chaos.local`, :mod:`chaos.docker`) stop their nodes, get each node's
log text and data directory onto the host, and hand them to
:func:`export_node`.

- :func:`committed_entries`: a node's committed log, read from its stored log
  up to the last high watermark the node reported (a lower bound of what it
  committed: records above it may be uncommitted);
- :func:`partition_changes`: each partition's leader, leader epoch and ISR
  after each change the controllers committed, from a controller's log;
- :func:`broker_registrations`: each broker's registration, fencing,
  unfencing and controlled shutdown as the controllers committed them, from
  a controller's log (and its snapshot, when the log starts after one);
- :func:`partition_exports` / :func:`export_broker`: a broker's partition
  logs, record by record, and each partition's checkpointed HW;
- :func:`node_changes`: its changes, from the lines its own log has for each
  election ("elected leader", "follows leader", "is a candidate", ...),
  timed by those lines' timestamps, which have millisecond resolution and
  are read as local time;
- :func:`vote_events`: the votes a node granted (and its candidacies, votes
  for itself), the quorum state each of its starts restored, from its log,
  and the quorum state its storage holds at the end.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path

from history.export_files import write_changes, write_log
from history.export_formats import (
    BROKER_REGISTRATIONS_FILE,
    DAMAGED_HASH,
    PARTITION_CHANGES_FILE,
    PARTITION_STATE_FILE,
    PARTITION_TIMELINE_FILE,
    PARTITIONS_FILE,
)
from history.exports import Change, LogEntry, record_hash
from history.runs import RunDir
from history.votes import VOTES_FILE
from metadata.records import (
    NO_LEADER_CHANGE,
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    LeaderRecoveryState,
    MalformedRecordError,
    PartitionChangeRecord,
    PartitionRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnknownRecordError,
    UnregisterBrokerRecord,
    decode_record,
)
from metadata.state_machine import decode_snapshot as decode_metadata_snapshot
from partition_log.batch import BatchHeader
from partition_log.errors import PartitionLogError
from partition_log.inspect import dump
from partition_log.log_files import decode_offset, read_whole
from partition_log.os_files import OsDirectory
from partition_log.producer_state import increment_sequence
from quorum.driver.storage_format import StorageFormatError, open_node_storage
from quorum.shared_log import decode_snapshot as decode_shared_snapshot
from quorum.storage import StorageCorruptError
from quorum.types import Batch, BatchKind, QuorumState

__all__ = [
    "BROKER_REGISTRATIONS_FILE",
    "DAMAGED_HASH",
    "PARTITIONS_FILE",
    "PARTITION_CHANGES_FILE",
    "PARTITION_STATE_FILE",
    "PARTITION_TIMELINE_FILE",
    "VOTES_FILE",
    "broker_registrations",
    "committed_entries",
    "export_node",
    "export_partition_changes",
    "node_changes",
    "partition_changes",
    "vote_events",
]
# The files' names and the damaged-batch marker are the readers'
# (history.export_formats, history.votes: what kq chaos check reads), so
# that writer and reader cannot drift apart.


def _write_lines(path: Path, lines: Iterable[Mapping[str, object]]) -> None:
    """One export file: a compact JSON object a line."""
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))


def _stored_batches(data_dir: Path, cluster_id: str, node: int) -> list[Batch]:
    """Every batch of a stopped node's stored log."""
    storage = open_node_storage(data_dir, cluster_id, node)
    try:
        return storage.log.read_all()
    finally:
        storage.close()


def _committed_metadata(
    batches: list[Batch], high_watermark: int, skip_below: int = 0
) -> Iterator[tuple[int, int, Record]]:
    """Each metadata record of the data ``batches`` from ``skip_below``
    up to ``high_watermark`` (committed), with its offset and its batch's
    epoch; a record this build does not read is passed over."""
    for batch in batches:
        if batch.kind is not BatchKind.DATA:
            continue
        for i, raw in enumerate(batch.records):
            offset = batch.base_offset + i
            if offset >= high_watermark:
                break
            if offset < skip_below:
                continue
            try:
                record = decode_record(raw)
            except (UnknownRecordError, MalformedRecordError):
                continue  # not a metadata record this build reads
            yield offset, batch.epoch, record


def committed_entries(
    data_dir: Path, cluster_id: str, node_id: int, high_watermark: int
) -> list[LogEntry]:
    """The records of a node's stored log (in ``data_dir``) below
    ``high_watermark``, as node exports."""
    out = []
    for batch in _stored_batches(data_dir, cluster_id, node_id):
        kind = "data" if batch.kind is BatchKind.DATA else "control"
        for i, record in enumerate(batch.records):
            offset = batch.base_offset + i
            if offset < high_watermark:
                out.append(LogEntry(node_id, offset, batch.epoch, kind, record_hash(record)))
    return out


def export_node(
    run: RunDir,
    node: int,
    log_text: str,
    data_dir: Path,
    cluster_id: str,
    high_watermark: int,
    start_unix_ns: int,
) -> None:
    """Write what the stopped ``node`` left into the run folder ``run``: its
    log text as ``logs/node-<node>.log``, its committed log (records below
    ``high_watermark`` of its stored log in ``data_dir``) and its changes
    (times counting from ``start_unix_ns``) under ``nodes/<node>/``."""
    run.logs.mkdir(parents=True, exist_ok=True)
    (run.logs / f"node-{node}.log").write_text(log_text)
    run.node_dir(node).mkdir(parents=True, exist_ok=True)
    write_log(run.node_log(node), committed_entries(data_dir, cluster_id, node, high_watermark))
    write_changes(run.node_changes(node), node_changes(node, log_text, start_unix_ns))
    _write_lines(
        run.node_dir(node) / VOTES_FILE,
        vote_events(node, log_text, data_dir, cluster_id, start_unix_ns),
    )


_STAMP = r"(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ kq\.\S+: "
_CHANGE_LINES = [
    (re.compile(_STAMP + r"node (?P<n>\d+) elected leader of epoch (?P<e>\d+)$"), "leader"),
    (
        re.compile(_STAMP + r"node (?P<n>\d+) follows leader (?P<l>\d+) in epoch (?P<e>\d+)$"),
        "follower",
    ),
    (
        re.compile(
            _STAMP + r"node (?P<n>\d+) in epoch (?P<e>\d+) with no known leader \((?P<r>\w+)\)$"
        ),
        "",
    ),
    (re.compile(_STAMP + r"node (?P<n>\d+) is a candidate in epoch (?P<e>\d+)$"), "candidate"),
    (
        re.compile(
            _STAMP
            + r"node (?P<n>\d+) has no live leader; asking for pre-votes in epoch (?P<e>\d+)$"
        ),
        "prospective",
    ),
    (
        re.compile(_STAMP + r"node (?P<n>\d+) resigned leadership of epoch (?P<e>\d+)$"),
        "resigned",
    ),
]


def node_changes(node: int, log_text: str, start_unix_ns: int) -> list[Change]:
    """The changes of ``node`` its log text tells: one per line saying how
    its role, epoch or leader changed.  Times are the lines' (local time,
    milliseconds) minus ``start_unix_ns``, at least 0 and never decreasing."""
    out: list[Change] = []
    for m, role, when in _node_lines(node, log_text, _CHANGE_LINES, start_unix_ns):
        groups = m.groupdict()
        role = role or groups["r"]
        if role == "leader":
            leader: int | None = node
        elif groups.get("l") is not None:
            leader = int(groups["l"])
        else:
            leader = None
        change = Change(node, when, int(m["e"]), leader, role)
        if not change.problems():
            out.append(change)
    return out


def _node_lines(
    node: int, log_text: str, patterns: list[tuple[re.Pattern[str], str]], start_unix_ns: int
) -> Iterator[tuple[re.Match[str], str, int]]:
    """Each line of ``node`` in its log text that one of ``patterns``
    matches (the first that does), with that pattern's label and the line's
    time: its stamp (local time, milliseconds) minus ``start_unix_ns``, at
    least 0 and never decreasing."""
    last = 0
    for line in log_text.splitlines():
        for pattern, label in patterns:
            m = pattern.match(line)
            if m is None or int(m["n"]) != node:
                continue
            when = datetime.strptime(m["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            last = max(last, int(when * 1_000_000_000) - start_unix_ns, 0)
            yield m, label, last
            break


# -- the votes a node granted and the states it restored ----------------------------

_VOTE_LINES = [
    (
        re.compile(
            _STAMP + r"node (?P<n>\d+) restored quorum state: epoch (?P<e>\d+), "
            r"voted for (?P<v>\d+|none), leader (?P<l>\d+|none)$"
        ),
        "start",
    ),
    (
        re.compile(
            _STAMP + r"node (?P<n>\d+) granted its vote in epoch (?P<e>\d+) to node (?P<v>\d+)$"
        ),
        "grant",
    ),
    (re.compile(_STAMP + r"node (?P<n>\d+) is a candidate in epoch (?P<e>\d+)$"), "candidate"),
]


def _id_or_none(text: str | None) -> int | None:
    return None if text is None or text == "none" else int(text)


def vote_events(
    node: int, log_text: str, data_dir: Path | None, cluster_id: str, start_unix_ns: int
) -> list[dict[str, object]]:
    """The vote lines of ``node``, in its log's order: each ``start`` (the
    quorum state it restored from storage as it started), each ``grant``
    (a vote it granted a candidate, logged once durable) and each
    ``candidate`` (its vote for itself opening a candidacy), then one
    ``stored`` line, the quorum state its storage in ``data_dir`` holds
    once stopped: what its next start would restore (none if the storage
    cannot be read).  Each line: ``node``, ``time`` (as the changes'),
    ``life`` (the number of start lines up to it; the stored line's is one
    more than the last start's), ``event``, ``epoch``, ``voted_for`` and
    ``leader`` (null when none; a vote's leader is null)."""
    out: list[dict[str, object]] = []
    life = 0
    last = 0
    for m, event, last in _node_lines(node, log_text, _VOTE_LINES, start_unix_ns):
        if event == "start":
            life += 1
        groups = m.groupdict()
        out.append(
            {
                "node": node,
                "time": last,
                "life": life,
                "event": event,
                "epoch": int(m["e"]),
                "voted_for": node if event == "candidate" else _id_or_none(groups.get("v")),
                "leader": _id_or_none(groups.get("l")),
            }
        )
    stored = _stored_state(data_dir, cluster_id, node) if data_dir is not None else None
    if stored is not None:
        out.append(
            {
                "node": node,
                "time": last,
                "life": life + 1,
                "event": "stored",
                "epoch": stored.epoch,
                "voted_for": stored.voted_for,
                "leader": stored.leader_id,
            }
        )
    return out


def _stored_state(data_dir: Path, cluster_id: str, node: int) -> QuorumState | None:
    try:
        storage = open_node_storage(data_dir, cluster_id, node)
    except (OSError, ValueError, StorageFormatError, StorageCorruptError):
        return None
    try:
        return storage.state.read() or QuorumState()
    finally:
        storage.close()


# -- brokers: their partition logs ------------------------------------------------

_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")


def _record_line(
    broker: int, topic: str, partition: int, h: BatchHeader, offset: int
) -> dict[str, object]:
    """A record line of :func:`partition_exports` but its ``hash``: the
    record at ``offset`` of the batch with header ``h``.

    Its sequence is the batch's base sequence plus the record's offset
    delta, not its place among the batch's records: compaction keeps a
    batch's base offset and base sequence but drops records from it
    (``MemoryRecords.filterTo``), so on a replica that cleaned the batch a
    record's place can be smaller than on one that did not."""
    return {
        "node": broker,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "epoch": h.partition_leader_epoch,
        "producer_id": h.producer_id,
        "sequence": (
            increment_sequence(h.base_sequence, offset - h.base_offset)
            if h.producer_id >= 0
            else -1
        ),
        "control": h.is_control,
    }


def partition_exports(
    broker: int, log_dirs: list[Path]
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Every record of every partition directory under ``log_dirs`` (the
    broker's stopped log directories; deleted and stray ones left out), as
    :func:`partition_log.inspect.dump` reads it, and each partition's last
    checkpointed high watermark and log end offset.

    A record line: ``node``, ``topic``, ``partition``, ``offset``, ``epoch``
    (its batch's partition leader epoch), ``producer_id``, ``sequence``
    (the batch's base sequence plus the record's offset delta; -1 without
    a producer), ``control`` and ``hash`` (SHA-256 of the record's value
    bytes; :data:`DAMAGED_HASH` at each offset of a batch whose CRC
    fails).  A partition line: ``node``, ``topic``, ``partition``,
    ``high_watermark`` (-1 if its checkpoint does not decode),
    ``log_end_offset`` and ``stopped_at`` (why the reader stopped: a torn
    or damaged batch, a directory that is not a log; null if it read to
    the end)."""

    records: list[dict[str, object]] = []
    states: list[dict[str, object]] = []
    for log_dir in log_dirs:
        if not log_dir.is_dir():
            continue
        for entry in sorted(log_dir.iterdir()):
            m = _PARTITION_DIR.match(entry.name)
            if m is None or not entry.is_dir():
                continue  # a -delete or -stray directory, or a file
            topic, partition = m["topic"], int(m["partition"])
            directory = OsDirectory(entry)
            end = 0
            stopped: str | None = None
            try:
                segments = dump(directory, records=True).segments
            except PartitionLogError as exc:
                # Not readable as a log: said, not hidden.
                segments, stopped = (), str(exc)
            for segment in segments:
                if segment.reason is not None and stopped is None:
                    stopped = f"{segment.file}: {segment.reason}"
                for batch in segment.batches:
                    h = batch.header
                    end = max(end, h.last_offset + 1)
                    if not batch.crc_valid:
                        # A batch whose CRC fails, which a consumer or a
                        # follower refuses (a recovery that kept a torn
                        # tail: B14), stands at each of its offsets as
                        # damaged, never as what its bytes may still decode
                        # to, so that replica-divergence sees this replica
                        # differ from those holding the records there.
                        records.extend(
                            _record_line(broker, topic, partition, h, offset)
                            | {"hash": DAMAGED_HASH}
                            for offset in range(h.base_offset, h.last_offset + 1)
                        )
                        continue
                    for record in batch.records or ():
                        records.append(
                            _record_line(broker, topic, partition, h, record.offset)
                            | {"hash": record_hash(record.value or b"")}
                        )
            hw_file = "replication-offset-checkpoint"  # broker.log_manager.HIGH_WATERMARK_FILE
            try:
                hw = (
                    decode_offset(hw_file, read_whole(directory, hw_file))
                    if directory.exists(hw_file)
                    else 0
                )
            except PartitionLogError as exc:
                hw, stopped = -1, stopped or str(exc)
            states.append(
                {
                    "node": broker,
                    "topic": topic,
                    "partition": partition,
                    "high_watermark": hw,
                    "log_end_offset": end,
                    "stopped_at": stopped,
                }
            )
    return records, states


_STATE_LINE = re.compile(
    _STAMP + r"broker (?P<n>\d+) partition (?P<tp>.+): role (?P<role>\w+) leader (?P<leader>-?\d+)"
    r" epoch (?P<epoch>-?\d+) hw (?P<hw>-?\d+) leo (?P<leo>-?\d+)(?: start (?P<start>-?\d+))?"
    r" isr (?P<isr>[\d,]*)$"
)
_TRUNCATE_LINE = re.compile(
    _STAMP + r"broker (?P<n>\d+) partition (?P<tp>.+) truncated from (?P<from>-?\d+) to "
    r"(?P<to>-?\d+) in epoch (?P<epoch>-?\d+)$"
)
_RESTART_LINE = re.compile(
    _STAMP + r"broker (?P<n>\d+) partition (?P<tp>.+) restarted at (?P<at>-?\d+) from "
    r"\[(?P<rstart>-?\d+), (?P<rend>-?\d+)\) in epoch (?P<epoch>-?\d+)$"
)
_REMOVED_LINE = re.compile(_STAMP + r"broker (?P<n>\d+) partition (?P<tp>.+) removed$")
_LIFE_LINE = re.compile(_STAMP + r"broker (?P<n>\d+) samples its partitions every \d+ ms$")


def partition_timeline(broker: int, log_text: str, start_unix_ns: int) -> list[dict[str, object]]:
    """Each partition state line, truncation line and restart line of
    ``broker``'s log text (``server.broker``: a state line whenever a
    partition's role, leader, leader epoch, HW, log end or ISR changed,
    checked every tick; a line for each follower truncation and each
    follower log restarted at its leader's log start), in log order.

    Each line: ``node``, ``seq`` (the line's number in the log text: the
    order within one broker), ``life`` (the process's start, counted from
    0: a HW restarts from its checkpoint in a new life), ``time``
    (nanoseconds since ``start_unix_ns``, from the line's millisecond
    stamp, at least 0), ``topic``, ``partition``, ``event`` (``state``,
    ``truncate``, ``restart`` or ``removed``: the replica left the broker)
    and ``leader_epoch``; a state adds ``role``, ``leader``,
    ``high_watermark``, ``log_end_offset``, ``log_start_offset`` (null
    from a broker that did not log it) and ``isr``; a truncation
    ``truncated_from`` and ``truncated_to``; a restart ``truncated_from``
    (the log end before) and ``log_start_offset`` and ``log_end_offset``
    (both the offset the log restarted at: the leader's log start); the
    others null."""
    out: list[dict[str, object]] = []
    life = -1
    for seq, line in enumerate(log_text.splitlines(), start=1):
        if " broker " not in line:
            continue
        m = _LIFE_LINE.match(line)
        if m is not None and int(m["n"]) == broker:
            life += 1
            continue
        m = (
            _STATE_LINE.match(line)
            or _TRUNCATE_LINE.match(line)
            or _RESTART_LINE.match(line)
            or _REMOVED_LINE.match(line)
        )
        if m is None or int(m["n"]) != broker:
            continue
        tp = _PARTITION_DIR.match(m["tp"])
        if tp is None:
            continue
        groups = m.groupdict()
        state = "hw" in groups
        truncate = "to" in groups
        restart = "at" in groups
        start: int | None = None
        end: int | None = None
        cut_from: int | None = None
        if state:
            event = "state"
            start = int(m["start"]) if m["start"] is not None else None
            end = int(m["leo"])
        elif restart:
            event = "restart"
            start = end = int(m["at"])
            cut_from = int(m["rend"])
        elif truncate:
            event = "truncate"
            cut_from = int(m["from"])
        else:
            event = "removed"
        out.append(
            {
                "node": broker,
                "seq": seq,
                "life": max(life, 0),
                "time": max(_stamp_ns(m["stamp"]) - start_unix_ns, 0),
                "topic": tp["topic"],
                "partition": int(tp["partition"]),
                "event": event,
                "leader_epoch": int(m["epoch"]) if state or truncate or restart else None,
                "role": m["role"] if state else None,
                "leader": int(m["leader"]) if state else None,
                "high_watermark": int(m["hw"]) if state else None,
                "log_end_offset": end,
                "log_start_offset": start,
                "isr": [int(b) for b in m["isr"].split(",") if b] if state else None,
                "truncated_from": cut_from,
                "truncated_to": int(m["to"]) if truncate else None,
            }
        )
    return out


def export_broker(
    run: RunDir,
    broker: int,
    log_text: str,
    log_dirs: list[Path],
    start_unix_ns: int | None = None,
) -> None:
    """Write what the stopped ``broker`` left: its log text as
    ``logs/broker-<id>.log``, its partitions (:func:`partition_exports`)
    and their states over time (:func:`partition_timeline`, times counting
    from ``start_unix_ns``: default, the first line's time) under
    ``nodes/<id>/``."""
    run.logs.mkdir(parents=True, exist_ok=True)
    (run.logs / f"broker-{broker}.log").write_text(log_text)
    records, states = partition_exports(broker, log_dirs)
    if start_unix_ns is None:
        start_unix_ns = _first_stamp_ns(log_text)
    timeline = partition_timeline(broker, log_text, start_unix_ns)
    folder = run.node_dir(broker)
    folder.mkdir(parents=True, exist_ok=True)
    _write_lines(folder / PARTITIONS_FILE, records)
    _write_lines(folder / PARTITION_STATE_FILE, states)
    _write_lines(folder / PARTITION_TIMELINE_FILE, timeline)


def _stamp_ns(stamp: str) -> int:
    """A log line's stamp (local time, milliseconds) in Unix nanoseconds,
    exactly (a float's nanoseconds are off by a few hundred)."""
    when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
    return int(time.mktime(when.timetuple())) * 1_000_000_000 + when.microsecond * 1000


def _first_stamp_ns(log_text: str) -> int:
    for line in log_text.splitlines():
        m = re.match(_STAMP, line)
        if m is not None:
            return _stamp_ns(m["stamp"])
    return 0


def partition_changes(
    node: int, data_dir: Path, cluster_id: str, high_watermark: int
) -> list[dict[str, object]]:
    """Each partition's state after every PartitionRecord and
    PartitionChangeRecord a controller's stored log holds below
    ``high_watermark`` (committed), replayed as the image does (a change
    bumps the partition epoch, and the leader epoch when it names a
    leader; Kafka's ``PartitionRegistration.merge``).  A node that took
    part of the log as a snapshot misses the partitions created before it:
    their changes are left out.  Each line: ``node``, ``offset`` and
    ``epoch`` of the record in the metadata log, ``topic``, ``partition``,
    ``leader``, ``leader_epoch``, ``partition_epoch``, ``isr``, ``elr``."""
    names: dict[str, str] = {}
    state: dict[tuple[str, int], dict[str, object]] = {}
    out: list[dict[str, object]] = []
    batches = _stored_batches(data_dir, cluster_id, node)
    for offset, epoch, record in _committed_metadata(batches, high_watermark):
        if isinstance(record, TopicRecord):
            names[record.topic_id] = record.name
            continue
        if isinstance(record, RemoveTopicRecord):
            for k in [k for k in state if k[0] == record.topic_id]:
                del state[k]
            continue
        if isinstance(record, PartitionRecord):
            key = (record.topic_id, record.partition_id)
            s = state[key] = {
                "leader": record.leader,
                "leader_epoch": record.leader_epoch,
                "partition_epoch": record.partition_epoch,
                "isr": list(record.isr),
                "elr": list(record.elr),
                "leader_recovery_state": record.leader_recovery_state.name.lower(),
                "unclean": False,
            }
        elif isinstance(record, PartitionChangeRecord):
            key = (record.topic_id, record.partition_id)
            if key not in state:
                continue  # created before this node's snapshot
            s = state[key]
            s["partition_epoch"] = int(s["partition_epoch"]) + 1  # type: ignore[call-overload]
            if record.leader != NO_LEADER_CHANGE:
                s["leader"] = record.leader
                s["leader_epoch"] = int(s["leader_epoch"]) + 1  # type: ignore[call-overload]
            if record.isr is not None:
                s["isr"] = list(record.isr)
            if record.elr is not None:
                s["elr"] = list(record.elr)
            # An unclean election (Kafka's PartitionChangeBuilder): a new
            # leader RECOVERING, which may have lost committed records.
            recovery = record.leader_recovery_state
            s["unclean"] = (
                record.leader != NO_LEADER_CHANGE and recovery is LeaderRecoveryState.RECOVERING
            )
            if recovery is not None:
                s["leader_recovery_state"] = recovery.name.lower()
        else:
            continue
        out.append(
            {
                "node": node,
                "offset": offset,
                "epoch": epoch,
                "topic": names.get(key[0], key[0]),
                "partition": key[1],
                **s,
            }
        )
    return out


def export_partition_changes(
    run: RunDir, node: int, data_dir: Path, cluster_id: str, high_watermark: int
) -> None:
    """Write :func:`partition_changes` and :func:`broker_registrations` of
    a stopped controller under ``nodes/<node>/``."""
    folder = run.node_dir(node)
    folder.mkdir(parents=True, exist_ok=True)
    _write_lines(
        folder / PARTITION_CHANGES_FILE,
        partition_changes(node, data_dir, cluster_id, high_watermark),
    )
    _write_lines(
        folder / BROKER_REGISTRATIONS_FILE,
        broker_registrations(node, data_dir, cluster_id, high_watermark),
    )


def broker_registrations(
    node: int, data_dir: Path, cluster_id: str, high_watermark: int
) -> list[dict[str, object]]:
    """Each broker's registration after every RegisterBrokerRecord,
    FenceBrokerRecord, UnfenceBrokerRecord, BrokerRegistrationChangeRecord
    and UnregisterBrokerRecord a controller's stored log holds below
    ``high_watermark`` (committed), as the image replays them (a
    registration starts fenced; its broker epoch is its record's offset,
    KIP-631).  These are what decide which replicas may join an ISR
    (KIP-841, KIP-903: registered, unfenced, not in controlled shutdown, at
    the broker's current epoch).  When the log starts after a snapshot,
    the snapshot's registrations come first, as ``snapshot`` lines at the
    snapshot's last offset; if that snapshot cannot be read, no line at all
    (a verifier judges no ISR against a partial history).  Each line:
    ``node``, ``offset`` and ``epoch`` of the record in the metadata log,
    ``broker``, ``event`` (``register``, ``fence``, ``unfence``,
    ``change``, ``unregister`` or ``snapshot``), and the registration
    after it: ``broker_epoch``, ``fenced``, ``in_controlled_shutdown``
    (null after ``unregister``)."""
    storage = open_node_storage(data_dir, cluster_id, node)
    try:
        batches = storage.log.read_all()
        first = next((b.base_offset for b in batches), None)
        snapshot = storage.snapshots.latest()
        data = None
        if snapshot is not None and (first is None or first > 0):
            size = storage.snapshots.size(snapshot)
            data = storage.snapshots.read(snapshot, 0, size) if size is not None else None
    finally:
        storage.close()
    out: list[dict[str, object]] = []
    state: dict[int, dict[str, object]] = {}

    def line(offset: int, epoch: int, broker: int, event: str) -> None:
        reg = state.get(broker)
        out.append(
            {
                "node": node,
                "offset": offset,
                "epoch": epoch,
                "broker": broker,
                "event": event,
                "broker_epoch": None if reg is None else reg["broker_epoch"],
                "fenced": None if reg is None else reg["fenced"],
                "in_controlled_shutdown": None if reg is None else reg["in_controlled_shutdown"],
            }
        )

    skip_below = 0
    if first is not None and first > 0:
        if snapshot is None or data is None or snapshot.end_offset < first:
            return []  # the registrations before the log are unknown
        try:
            parts, _ = decode_shared_snapshot(snapshot, data, ["metadata"])
            image = decode_metadata_snapshot(snapshot, parts["metadata"])
        except ValueError:
            return []
        for b in sorted(image.brokers.values(), key=lambda b: b.broker_id):
            state[b.broker_id] = {
                "broker_epoch": b.epoch,
                "fenced": b.fenced,
                "in_controlled_shutdown": b.in_controlled_shutdown,
            }
            line(snapshot.end_offset - 1, snapshot.epoch, b.broker_id, "snapshot")
        skip_below = snapshot.end_offset
    # Below skip_below, the records are already in the snapshot.
    for offset, epoch, record in _committed_metadata(batches, high_watermark, skip_below):
        if isinstance(record, RegisterBrokerRecord):
            state[record.broker_id] = {
                "broker_epoch": record.broker_epoch,
                "fenced": record.fenced,
                "in_controlled_shutdown": record.in_controlled_shutdown,
            }
            event = "register"
        elif isinstance(record, UnregisterBrokerRecord):
            state.pop(record.broker_id, None)
            event = "unregister"
        elif isinstance(
            record, FenceBrokerRecord | UnfenceBrokerRecord | BrokerRegistrationChangeRecord
        ):
            reg = state.get(record.broker_id)
            if reg is None or reg["broker_epoch"] != record.broker_epoch:
                continue  # replay refuses it: the image did not change
            if isinstance(record, FenceBrokerRecord):
                reg["fenced"], event = True, "fence"
            elif isinstance(record, UnfenceBrokerRecord):
                reg["fenced"], event = False, "unfence"
            else:
                if record.fenced is not None:
                    reg["fenced"] = record.fenced
                if record.in_controlled_shutdown is not None:
                    reg["in_controlled_shutdown"] = record.in_controlled_shutdown
                event = "change"
        else:
            continue
        line(offset, epoch, record.broker_id, event)
    return out
