"""``kq log``: read a partition log's files as an operator does (Kafka's
``kafka-dump-log.sh``).

kq log dump PATH [--records] [--indexes] [--state] [--json]
kq log check PATH [--json]

PATH is a partition directory or one segment file (``<20 digits>.log``).
Both only read: the files are left exactly as they are, even where opening
the log would recover it.  ``check`` exits 0 when nothing is wrong and 1
naming each finding (file, position, offset, what).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    Subparsers,
    add_command_group,
    command,
    print_json,
)
from partition_log.errors import PartitionLogError
from partition_log.inspect import (
    DirectoryDump,
    SegmentBatches,
    SegmentDump,
    check,
    dump,
    dump_files,
    dump_segment,
    index_entries,
    segment_names,
)
from partition_log.os_files import OsDirectory

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "log",
        help="dump or check a partition log's files",
        description=(
            "Read a partition directory or one of its segment files (as Kafka's "
            "kafka-dump-log tool does), without changing any file."
        ),
    )
    dump_parser = commands.add_parser(
        "dump",
        help="print the batches of a segment or a partition directory",
        description=(
            "Print each batch: offsets, count, leader epoch, producer id, epoch and "
            "sequences, transactional and control flags, timestamps, compression, size, "
            "position and whether its CRC holds. Reading stops at a torn or damaged "
            "batch, which is named."
        ),
    )
    dump_parser.add_argument("path", help="a partition directory or a segment file (.log)")
    dump_parser.add_argument("--records", action="store_true", help="also print the records")
    dump_parser.add_argument(
        "--indexes", action="store_true", help="also print the offset and time index entries"
    )
    dump_parser.add_argument(
        "--state",
        action="store_true",
        help="also print the leader-epoch checkpoint and the producer snapshots (a directory)",
    )
    dump_parser.add_argument("--json", action="store_true", help="print it as JSON")
    dump_parser.set_defaults(func=_dump)

    check_parser = commands.add_parser(
        "check",
        help="verify a segment or a partition directory; exit 1 naming what is wrong",
        description=(
            "Verify every batch's CRC, that offsets increase without gaps across the "
            "segments, that the tail is not torn, that every index entry points at a "
            "batch's start with its last offset, that the leader-epoch checkpoint is the "
            "cache the batches give, that producer snapshots decode, and that every file "
            "is part of a log. Exit 0 when nothing is wrong, 1 naming each finding."
        ),
    )
    check_parser.add_argument("path", help="a partition directory or a segment file (.log)")
    check_parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    check_parser.set_defaults(func=_check)


def _open(path_text: str) -> tuple[OsDirectory, str | None]:
    """The directory to read and, for a segment file, its name."""
    path = Path(path_text)
    if not path.exists():
        raise CommandError(f"{path}: no such file or directory")
    try:
        if path.is_dir():
            return OsDirectory(path), None
        return OsDirectory(path.parent), path.name
    except PartitionLogError as error:
        raise CommandError(f"{path}: {error.args[0]}") from None


@command("log dump")
def _dump(args: argparse.Namespace) -> int:
    directory, segment = _open(args.path)
    try:
        if args.json:
            if segment is not None:
                result: DirectoryDump | SegmentDump = dump_segment(
                    directory, segment, records=args.records, indexes=args.indexes
                )
            else:
                result = dump(
                    directory, records=args.records, indexes=args.indexes, state=args.state
                )
            print_json(result.to_dict())
            return EXIT_OK
        # Text is printed batch by batch as the segments are read, so a large
        # log is never held in memory.
        names = [segment] if segment is not None else segment_names(directory)
        for name in names:
            _print_segment(directory, name, records=args.records, indexes=args.indexes)
        if segment is None:
            _print_state(dump_files(directory, state=args.state))
    except PartitionLogError as error:
        raise CommandError(f"{args.path}: {error.args[0]}") from None
    return EXIT_OK


def _fields(values: dict[str, object]) -> str:
    return " ".join(f"{k}: {_text(v)}" for k, v in values.items())


def _text(value: object) -> str:
    if isinstance(value, dict) and len(value) == 1:
        ((encoding, text),) = value.items()
        return json.dumps(text) if encoding == "utf8" else f"0x{text}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def _print_segment(directory: OsDirectory, name: str, *, records: bool, indexes: bool) -> None:
    batches = SegmentBatches(directory, name, records=records)
    print(f"Dumping {name} (base offset {batches.base_offset})")
    for batch in batches:
        fields = batch.to_dict()
        decoded = fields.pop("records", None)
        print(_fields(fields))
        if isinstance(decoded, list):
            for record in decoded:
                print("| " + _fields(record))
    if batches.reason is not None:
        print(
            f"Stopped at position {batches.stop_position} of {batches.size} bytes "
            f"({batches.end.value}): {batches.reason}"
        )
    if not indexes:
        return
    entries = index_entries(directory, batches.base_offset).to_dict()
    for key in ("offset_index", "time_index"):
        label = key.replace("_", " ")
        found, error = entries[key], entries[f"{key}_error"]
        if error is not None:
            print(f"{label}: does not decode: {error}")
        elif not isinstance(found, list):
            print(f"{label}: no file")
        else:
            print(f"{label}: {len(found)} entries")
            for entry in found:
                print("  " + _fields(entry))


def _print_state(result: DirectoryDump) -> None:
    data = result.to_dict()
    if "leader_epoch_checkpoint" in data:
        error = data["leader_epoch_checkpoint_error"]
        entries = data["leader_epoch_checkpoint"]
        if error is not None:
            print(f"leader-epoch-checkpoint: does not decode: {error}")
        else:
            assert isinstance(entries, list)
            print("leader-epoch-checkpoint: " + ", ".join(_fields(e) for e in entries))
    for snapshot in data.get("producer_snapshots", []):  # type: ignore[attr-defined]
        print(_fields(snapshot))
    if result.other_files:
        print("other files: " + ", ".join(result.other_files))


@command("log check")
def _check(args: argparse.Namespace) -> int:
    directory, segment = _open(args.path)
    try:
        findings = check(directory, segment)
    except PartitionLogError as error:
        raise CommandError(f"{args.path}: {error.args[0]}") from None
    if args.json:
        print_json(
            {"path": args.path, "ok": not findings, "findings": [f.to_dict() for f in findings]}
        )
    elif findings:
        for finding in findings:
            print(finding)
        print(f"{len(findings)} finding{'s' if len(findings) != 1 else ''} in {args.path}")
    else:
        print(f"{args.path}: no findings")
    return EXIT_FAILURE if findings else EXIT_OK
