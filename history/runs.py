"""Run folders: everything one test run leaves behind.

::

    runs/<time>-<name>/
        config.json            what was run (format, backend, model, nodes, faults, ...)
        history.jsonl          the operations (history.files)
        summary.json           counts, well-formedness, the backend's verdict
        nodes/<id>/log.jsonl       the node's committed log (history.exports)
        nodes/<id>/changes.jsonl   its role, epoch and leader changes
        nodes/<id>/votes.jsonl, broker_registrations.jsonl, partition_changes.jsonl, ...
                               (some runs; history.votes, history.export_formats)
        logs/                  free-form text logs (node output, the harness, a trace)

``<time>`` is the UTC start, ``YYYYMMDDTHHMMSSZ``, so that names sort by
start.  ``docs/history-format.md`` describes each file.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from history.export_files import (
    read_changes,
    read_log,
    write_changes,
    write_log,
)
from history.export_formats import (
    BROKER_REGISTRATIONS_FILE,
    PARTITION_CHANGES_FILE,
    PARTITION_STATE_FILE,
    PARTITION_TIMELINE_FILE,
    PARTITIONS_FILE,
    read_partition_changes,
    read_partition_records,
    read_partition_states,
    read_partition_timeline,
    read_registrations,
)
from history.exports import (
    Change,
    LogEntry,
    check_changes,
    check_log,
)
from history.files import (
    NEMESIS,
    OP_TYPES,
    HistoryFormatError,
    Op,
    Problem,
    check_well_formed,
    read_history,
    write_history,
)
from history.votes import VOTES_FILE, read_votes

__all__ = [
    "FORMAT_VERSION",
    "RunDir",
    "check_run",
    "create_run_dir",
    "find_runs",
    "run_name",
    "summarize",
    "write_json",
    "write_run",
]

FORMAT_VERSION: Final = 1
"""``format`` in config.json and summary.json; raised on any incompatible
change of the files."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_PROBLEMS_IN_SUMMARY: Final = 100


@dataclass(frozen=True, slots=True)
class RunDir:
    """The paths of one run folder."""

    path: Path

    @property
    def history(self) -> Path:
        return self.path / "history.jsonl"

    @property
    def config(self) -> Path:
        return self.path / "config.json"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def node_dir(self, node: int) -> Path:
        return self.path / "nodes" / str(node)

    def node_log(self, node: int) -> Path:
        return self.node_dir(node) / "log.jsonl"

    def node_changes(self, node: int) -> Path:
        return self.node_dir(node) / "changes.jsonl"


def run_name(name: str, when: datetime) -> str:
    """``<time>-<name>``: the folder name of a run started at ``when``."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"a run name is letters, digits, '.', '_' and '-', got {name!r}")
    return f"{when.astimezone(UTC):%Y%m%dT%H%M%SZ}-{name}"


def create_run_dir(
    root: str | os.PathLike[str], name: str, *, when: datetime | None = None
) -> RunDir:
    """Make a new, empty run folder under ``root`` (``-2``, ``-3``, ... is
    appended if the name is taken)."""
    base = run_name(name, when or datetime.now(UTC))
    Path(root).mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        path = Path(root) / (base if attempt == 1 else f"{base}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return RunDir(path)
    raise FileExistsError(f"no free run folder name for {base} under {root}")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON (a new file)."""
    with open(os.fspath(path), "x", encoding="utf-8", newline="\n") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")


def summarize(ops: Sequence[Op], problems: Sequence[Problem]) -> dict[str, Any]:
    """The part of ``summary.json`` every run has."""
    clients = [op for op in ops if op.process != NEMESIS]
    counts = Counter(op.type for op in clients)
    return {
        "format": FORMAT_VERSION,
        "ops": {t: counts[t] for t in OP_TYPES},
        "processes": len({op.process for op in clients}),
        "nemesis": sum(1 for op in ops if op.process == NEMESIS and op.type == "invoke"),
        "well_formed": not problems,
        "problems": [str(p) for p in problems[:MAX_PROBLEMS_IN_SUMMARY]],
    }


def write_run(
    root: str | os.PathLike[str],
    name: str,
    *,
    config: Mapping[str, Any],
    ops: Iterable[Op],
    node_logs: Mapping[int, Iterable[LogEntry]],
    node_changes: Mapping[int, Iterable[Change]],
    logs: Mapping[str, str] | None = None,
    summary: Mapping[str, Any] | None = None,
    when: datetime | None = None,
) -> RunDir:
    """Write a whole run recorded in memory (the simulator's) as a run
    folder; ``summary`` adds to :func:`summarize`'s part.  Returns the folder."""
    ops = list(ops)
    conf = {"format": FORMAT_VERSION, "name": name, **config}
    # Raises for an unknown model before anything is written.
    problems = check_well_formed(
        ops, model=conf.get("model"), require_nemesis=bool(conf.get("faults"))
    )
    run = create_run_dir(root, name, when=when)
    write_json(run.config, conf)
    write_history(run.history, ops)
    for node in sorted(set(node_logs) | set(node_changes)):
        run.node_dir(node).mkdir(parents=True)
        write_log(run.node_log(node), node_logs.get(node, ()))
        write_changes(run.node_changes(node), node_changes.get(node, ()))
    run.logs.mkdir()
    for filename, text in (logs or {}).items():
        if not _NAME.fullmatch(filename):
            raise ValueError(f"bad log file name {filename!r}")
        (run.logs / filename).write_text(text, encoding="utf-8")
    write_json(run.summary, {**summarize(ops, problems), **(summary or {})})
    return run


def find_runs(path: Path) -> list[Path]:
    """The run folders at ``path``: itself if it is one, else the run
    folders directly under it (such as ``runs/``), in name order."""
    if (path / "config.json").exists() or (path / "history.jsonl").exists():
        return [path]
    if path.is_dir():
        return sorted(p.parent for p in path.glob("*/history.jsonl"))
    return []


def check_run(path: str | os.PathLike[str]) -> list[Problem]:
    """Check one run folder: its config, the history's well-formedness (for
    the config's ``model``, requiring nemesis ops if it lists ``faults``),
    and each node's exports: its log and changes, its votes, broker
    registrations and partition changes where it has them, and each
    broker's partition records (damaged batches included), states and
    timeline (``history.export_formats``).
    Messages name the file (and the line and field)."""
    run = RunDir(Path(path))
    problems: list[Problem] = []
    try:
        config = json.loads(run.config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [Problem("run-config", f"{run.config}: {exc}")]
    if not isinstance(config, dict):
        return [Problem("run-config", f"{run.config}: expected a JSON object")]
    if config.get("format") != FORMAT_VERSION:
        problems.append(
            Problem("run-config", f"format {config.get('format')!r}, expected {FORMAT_VERSION}")
        )
    nodes = config.get("nodes")
    if not (isinstance(nodes, list) and all(isinstance(n, int) for n in nodes)):
        problems.append(Problem("run-config", f"nodes must be a list of node ids, got {nodes!r}"))
        nodes = []
    brokers = config.get("brokers") or []
    if not (isinstance(brokers, list) and all(isinstance(b, int) for b in brokers)):
        problems.append(
            Problem("run-config", f"brokers must be a list of broker ids, got {brokers!r}")
        )
        brokers = []
    model = config.get("model")
    if model is not None and not isinstance(model, str):
        problems.append(Problem("run-config", f"model must be a string, got {model!r}"))
        model = None
    try:
        ops = read_history(run.history)
    except OSError as exc:
        problems.append(Problem("run-history", str(exc)))
    except HistoryFormatError as exc:
        problems.append(Problem("history-format", str(exc)))
    else:
        try:
            problems.extend(
                check_well_formed(ops, model=model, require_nemesis=bool(config.get("faults")))
            )
        except ValueError as exc:  # an unknown model
            problems.append(Problem("run-config", str(exc)))
    for node in nodes:
        for file, read, check in (
            (run.node_log(node), read_log, check_log),
            (run.node_changes(node), read_changes, check_changes),
        ):
            rel = file.relative_to(run.path)
            try:
                items: Any = read(file)
            except OSError as exc:
                problems.append(Problem("export-missing", f"{rel}: {exc.strerror}"))
                continue
            except HistoryFormatError as exc:
                problems.append(Problem("export-format", str(exc)))
                continue
            for p in check(items, node):
                problems.append(Problem(p.kind, f"{rel} line {(p.index or 0) + 1}: {p.message}"))
        problems.extend(_check_optional_exports(run, node, _NODE_EXPORTS))
    for broker in brokers:
        problems.extend(_check_optional_exports(run, broker, _BROKER_EXPORTS))
    return problems


_Reader = Callable[[Path], list[dict[str, Any]]]

_NODE_EXPORTS: Final[tuple[tuple[str, _Reader], ...]] = (
    (VOTES_FILE, read_votes),
    (BROKER_REGISTRATIONS_FILE, read_registrations),
    (PARTITION_CHANGES_FILE, read_partition_changes),
)
"""A node's exports that only some runs have: votes (a real cluster's
nodes), registrations and partition changes (a run with brokers); checked
when present."""

_BROKER_EXPORTS: Final[tuple[tuple[str, _Reader], ...]] = (
    (PARTITIONS_FILE, read_partition_records),
    (PARTITION_STATE_FILE, read_partition_states),
    (PARTITION_TIMELINE_FILE, read_partition_timeline),
)
"""A broker's partition exports, checked when present."""


def _check_optional_exports(
    run: RunDir, node: int, files: Sequence[tuple[str, _Reader]]
) -> list[Problem]:
    """The format problems of the files of ``files`` in ``node``'s folder
    that exist, each naming the file, its line and the field; every line
    must name the node of its folder."""
    problems: list[Problem] = []
    for name, read in files:
        file = run.node_dir(node) / name
        if not file.is_file():
            continue
        rel = file.relative_to(run.path)
        try:
            lines = read(file)
        except OSError as exc:
            problems.append(Problem("export-missing", f"{rel}: {exc.strerror}"))
            continue
        except HistoryFormatError as exc:
            problems.append(Problem("export-format", f"{rel}:{exc.line}: {exc.reason}"))
            continue
        for lineno, line in enumerate(lines, start=1):
            if line["node"] != node:
                problems.append(
                    Problem(
                        "export-format",
                        f"{rel}:{lineno}: node is {line['node']!r} in the folder of node {node}",
                    )
                )
                break
    return problems
