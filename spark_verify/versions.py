"""Checks of the versions the servers report: stale reads and forks, per key.

kq reports with each ``ok`` op the version of the record it wrote, or of the
write whose value a read returned (``offset``, ``epoch``;
``docs/history-format.md``).  Every record of a run, of any key, is a
position in one replicated log (the Raft log of the quorum, Raft thesis §3.5),
so versions are compared by ``offset``: a record at a higher offset was
committed later.  ``epoch`` only has to agree: one offset holds one record.

These checks need one sort and a linear pass; unlike the linearizability
search they never run out of time, and they name the exact records involved.

- :func:`stale_reads`: an ``ok`` read that returned an older version than a
  write that had completed before the read was invoked (a linearizable read
  must see it, or something newer).
- :func:`version_forks`: one offset with two epochs, one version with two
  values, one written value at two versions: the servers disagree about what
  the log holds.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Iterable
from typing import Any, Final

from spark_verify.models import kind_of
from spark_verify.ops import CheckOp
from spark_verify.verdict import Anomaly

__all__ = ["STALE_READS", "VERSION_FORKS", "stale_reads", "version_forks"]

STALE_READS: Final = "stale-reads"
VERSION_FORKS: Final = "version-forks"

_Key = tuple[str | None, str | None]


def _by_key(ops: Iterable[CheckOp]) -> dict[_Key, list[CheckOp]]:
    out: dict[_Key, list[CheckOp]] = {}
    for op in ops:
        out.setdefault((op.run, op.key), []).append(op)
    return out


def _desc(op: CheckOp) -> str:
    kind = kind_of(op.f)
    if kind == "read":
        what = f"{op.f} of {op.result!r}"
    elif kind == "cas" and isinstance(op.arg, list) and len(op.arg) == 2:
        what = f"cas from {op.arg[0]!r} to {op.arg[1]!r}"
    elif kind == "delete":
        what = op.f
    else:
        what = f"{op.f} of {op.arg!r}"
    version = "" if op.offset is None else f" at offset {op.offset} (epoch {op.epoch})"
    end = "..." if op.ret is None else str(op.ret)
    return f"{what} by process {op.process} [{op.call}, {end}]{version}"


def stale_reads(ops: Iterable[CheckOp]) -> list[Anomaly]:
    """``ok`` reads that returned a version older than a write completed before they began.

    A read's version is the offset it reports: that of the write whose value
    it returned.  A read of ``None`` reports none: it saw the initial state
    (older than any write) or a delete; it is given the offset of the newest
    ``ok`` delete invoked before it returned, the most lenient choice, and is
    not judged at all if an ``info`` delete (whose offset is unknown) was
    invoked before it returned.  The writes: ``ok`` write, put, cas, delete and append with an
    offset, that returned strictly before the read's invoke (at the same
    nanosecond they are concurrent).  The witness is the read and the newest
    such write.
    """
    out: list[Anomaly] = []
    for (run, key), key_ops in _by_key(ops).items():
        writes = sorted(
            (
                op
                for op in key_ops
                if op.type == "ok"
                and op.offset is not None
                and op.ret is not None
                and kind_of(op.f) in ("write", "cas", "delete", "append")
            ),
            key=lambda op: op.ret if op.ret is not None else 0,
        )
        reads = sorted(
            (op for op in key_ops if op.type == "ok" and kind_of(op.f) == "read"),
            key=lambda op: op.call,
        )
        if not writes or not reads:
            continue
        # For a read of None: the newest offset among the deletes invoked
        # before it returned (by invoke time), any of which it may have seen.
        deletes = sorted(
            (op.call, op.offset)
            for op in writes
            if kind_of(op.f) == "delete" and op.offset is not None
        )
        delete_calls = [call for call, _ in deletes]
        newest_delete = list(itertools.accumulate((off for _, off in deletes), max))
        info_deletes = [
            op.call for op in key_ops if op.type == "info" and kind_of(op.f) == "delete"
        ]
        first_info_delete = min(info_deletes, default=None)
        newest: CheckOp | None = None  # newest write returned before the current read
        w = 0
        for read in reads:
            while w < len(writes) and (writes[w].ret or 0) < read.call:
                if newest is None or (writes[w].offset or 0) > (newest.offset or 0):
                    newest = writes[w]
                w += 1
            if newest is None or newest.offset is None:
                continue
            if read.result is None:
                if first_info_delete is not None and first_info_delete <= (read.ret or 0):
                    continue  # an info delete may have emptied the key: undecidable here
                seen = bisect_right(delete_calls, read.ret if read.ret is not None else 0)
                version = newest_delete[seen - 1] if seen else -1
            elif read.offset is None:
                continue  # well-formedness reports it (model-version)
            else:
                version = read.offset
            if version >= newest.offset:
                continue
            out.append(
                Anomaly(
                    check=STALE_READS,
                    kind="stale-read",
                    message=(
                        f"{_desc(read)} returned an older version than "
                        f"{_desc(newest)}, which completed before the read began"
                    ),
                    run=run,
                    key=key,
                    node=read.node,
                    witness=(read.to_json(), newest.to_json()),
                )
            )
    return out


def version_forks(ops: Iterable[CheckOp]) -> list[Anomaly]:
    """Ops of a key that disagree about versions (check ``version-forks``).

    Three kinds, one anomaly for each offset or value in question:

    - ``offset-epochs``: ops name one offset with different epochs.
    - ``version-values``: one (offset, epoch) with different values: two
      different writes claiming the same record, or a read that returned a
      value other than the one the write at that version wrote, or two reads
      at one version with different values.  The value of a write, put or cas
      is the one it wrote; of a delete, none; a read's is its result.  An
      append's record holds its suffix while a read at that version sees the
      whole value: at an append's version only the reads are compared with
      each other.  A refused cas's record changes nothing and has no value.
    - ``value-versions``: one value (a string) seen at two offsets: written
      at one and read at another, say (two epochs at one offset are
      ``offset-epochs``).  Skipped for keys with appends, whose
      values are concatenations.
    """
    out: list[Anomaly] = []
    for (run, key), key_ops in _by_key(ops).items():
        versioned = sorted(
            (op for op in key_ops if op.offset is not None and op.type != "info"),
            key=lambda op: op.index,
        )
        appends = any(kind_of(op.f) == "append" for op in key_ops)
        by_offset: dict[int, list[CheckOp]] = {}
        for op in versioned:
            assert op.offset is not None
            by_offset.setdefault(op.offset, []).append(op)
        for offset in sorted(by_offset):
            group = by_offset[offset]
            epochs = sorted({op.epoch for op in group}, key=lambda e: -1 if e is None else e)
            if len(epochs) > 1:
                firsts = [next(op for op in group if op.epoch == e) for e in epochs]
                out.append(
                    _fork(
                        "offset-epochs",
                        f"offset {offset} is named with epochs "
                        f"{', '.join(str(e) for e in epochs)}: "
                        + "; ".join(_desc(op) for op in firsts),
                        run,
                        key,
                        firsts,
                    )
                )
            for epoch in epochs:
                conflict = _value_conflict([op for op in group if op.epoch == epoch])
                if conflict:
                    a, b = conflict
                    out.append(
                        _fork(
                            "version-values",
                            f"offset {offset} (epoch {epoch}) holds two different values: "
                            f"{_desc(a)}; {_desc(b)}",
                            run,
                            key,
                            [a, b],
                        )
                    )
        if appends:
            continue
        at: dict[Any, dict[int, CheckOp]] = {}
        for op in versioned:
            value = _value(op)
            if value is not None and value is not _NO_VALUE:
                assert op.offset is not None
                at.setdefault(value, {}).setdefault(op.offset, op)
        for value, versions in at.items():
            if len(versions) > 1:
                firsts = [versions[v] for v in sorted(versions)]
                out.append(
                    _fork(
                        "value-versions",
                        f"value {value!r} is seen at {len(versions)} offsets: "
                        + "; ".join(_desc(op) for op in firsts),
                        run,
                        key,
                        firsts,
                    )
                )
    return out


_NO_VALUE: Final = object()


def _value(op: CheckOp) -> Any:
    """The value at the op's version, ``_NO_VALUE`` if unknown (appends, refused cas)."""
    kind = kind_of(op.f)
    if op.type != "ok":
        return _NO_VALUE
    if kind == "read":
        return op.result
    if kind == "write":
        return op.arg
    if kind == "cas" and isinstance(op.arg, list) and len(op.arg) == 2:
        return op.arg[1]
    if kind == "delete":
        return None
    return _NO_VALUE


def _value_conflict(group: list[CheckOp]) -> tuple[CheckOp, CheckOp] | None:
    """Two ops of one version that disagree about what it holds."""
    owners = [op for op in group if kind_of(op.f) != "read"]
    distinct_owners = {op.index for op in owners}
    if len(distinct_owners) > 1:
        first, second = owners[0], next(op for op in owners if op.index != owners[0].index)
        return first, second
    known = [op for op in group if _value(op) is not _NO_VALUE]
    if not known:
        return None
    # An append's version holds the whole value, which only reads show.
    reads = [op for op in known if kind_of(op.f) == "read"]
    base = known if not any(kind_of(op.f) == "append" for op in group) else reads
    for op in base[1:]:
        if _value(op) != _value(base[0]):
            return base[0], op
    return None


def _fork(kind: str, message: str, run: str | None, key: str | None, ops: list[CheckOp]) -> Anomaly:
    return Anomaly(
        check=VERSION_FORKS,
        kind=kind,
        message=message,
        run=run,
        key=key,
        witness=tuple(op.to_json() for op in ops),
    )
