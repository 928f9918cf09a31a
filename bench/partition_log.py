"""The partition log (``partition_log/``) against the file calls under it.

Every figure is beside its floor, measured in the same run on the same disk
(a temporary directory under ``--dir``, default the system's temp dir):

- **append**: ``PartitionLog.append_as_leader`` over ``OsDirectory`` of
  batches of 100 records (100-byte and 1 KiB values), without fsync and with
  ``flush_messages=1``; the floor writes the same batch bytes with one
  ``os.write`` a batch (and ``os.fsync`` after each, for ``flush_messages=1``).
- **read**: ``PartitionLog.read`` from the start to the end (``--read-bytes``
  a call, the next call from where the last ended) and from random offsets;
  the floor is ``os.pread`` of the same file ranges the log returned.
- **recovery**: ``PartitionLog.open`` of a log left without its clean-shutdown
  marker, with recovery point 0 and no producer snapshot (so every batch is
  re-checked, the indexes, epoch cache and producer state rebuilt); the floor
  reads the same ``.log`` files a chunk at a time and computes the CRC-32C of
  every batch.
- **memory**: the resident set (``VmRSS``) of a child process holding
  ``--partitions`` logs open, against a child that imported the same modules
  and opened none.
- **compaction**: ``LogCleaner`` over a compacted log of 1 KiB values whose
  keys are drawn from a tenth as many keys as records (about 10% live),
  cleaned until nothing is cleanable: MB/s of the segments it read, against
  copying the same segment files (pread, write, one fsync each).

Ratios are ours / floor in bytes per second (1.0 is as fast as the bare file
calls; recovery's ratio is ours in seconds / floor, the issue's "within 2x").
Each append figure has a bound row beside it: a minimal Python function
computing the batch's CRC-32C and writing it, one call a batch, which is the
least a checking append costs in CPython.  The leader's record check is the
compiled one (``partition_log/_speedups.c``) when built; ``KQ_PURE_PYTHON=1``
runs the Python reference instead (the JSON rows say which ran).
Appends and their floor take turns a tenth of the batches at a time.  Median of ``--repeat``
runs, each floor right after ours.  The files are in the page cache for both
sides of every read figure.

    .venv/bin/python bench/partition_log.py [--preset small|full] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crc32c import crc32c

from partition_log import (
    CleanerConfig,
    CleanupPolicy,
    LogCleaner,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    set_base_offset,
    speedups,
)
from partition_log.os_files import OsDirectory

MiB = 1 << 20
RECORDS_PER_BATCH = 100
NOW_MS = 1_700_000_000_000


@dataclass(frozen=True, slots=True)
class Preset:
    # appends without fsync: bytes appended per record size
    append_bytes: int
    # appends with flush_messages=1: batches per record size
    synced_batches: int
    # reads: random reads per record size
    random_reads: int
    recovery_bytes: int
    memory_partitions: int
    memory_bytes_per_partition: int
    memory_segment_bytes: int
    compaction_bytes: int
    repeat: int


PRESETS = {
    # A few seconds: what the smoke test runs so the benchmark cannot rot.
    "small": Preset(
        append_bytes=4 * MiB,
        synced_batches=20,
        random_reads=50,
        recovery_bytes=8 * MiB,
        memory_partitions=3,
        memory_bytes_per_partition=2 * MiB,
        memory_segment_bytes=1 * MiB,
        compaction_bytes=4 * MiB,
        repeat=1,
    ),
    # The sizes: 1 GiB recovery, 5 GiB of logs over 100 partitions.
    "full": Preset(
        append_bytes=256 * MiB,
        synced_batches=2000,
        random_reads=2000,
        recovery_bytes=1 << 30,
        memory_partitions=100,
        memory_bytes_per_partition=(5 << 30) // 100,
        memory_segment_bytes=16 * MiB,
        compaction_bytes=1 << 30,
        repeat=3,
    ),
}
RECORD_SIZES = (100, 1024)


def make_batch(value_bytes: int, base_offset: int = 0) -> bytes:
    """One batch of 100 keyless records of ``value_bytes`` each."""
    records = [
        Record(base_offset + i, NOW_MS + i, None, bytes([65 + i % 26]) * value_bytes)
        for i in range(RECORDS_PER_BATCH)
    ]
    return build_batch(records, base_offset=base_offset)


def scratch(parent: Path, prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"kq-bench-plog-{prefix}-", dir=parent))


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


# -- appends ------------------------------------------------------------------


ROUNDS = 10


def append_pair(
    parent: Path, batch: bytes, count: int, flush_messages: int | None
) -> tuple[float, float, float]:
    """Bytes/s of ``count`` leader appends of ``batch`` to a fresh log, of
    the same bytes with one os.write a batch (and an os.fsync after each with
    ``flush_messages``) to a fresh file in the same directory tree, and of a
    bound: one call of a minimal Python function a batch that computes the
    batch's CRC-32C (what any checking append must) and does the same write
    (and fsync), to a third file.  The three take turns, a tenth of the
    batches at a time, so all see the same disk and the same load from other
    processes (an fsync here takes from 0.1 to 0.5 ms from one minute to the
    next)."""
    path = scratch(parent, "append")
    fd, name = tempfile.mkstemp(prefix="kq-bench-plog-floor-", dir=parent)
    bound_fd, bound_name = tempfile.mkstemp(prefix="kq-bench-plog-bound-", dir=parent)
    try:
        log = PartitionLog.open(
            OsDirectory(path), LogConfig(flush_messages=flush_messages), now_ms=NOW_MS
        )
        append = log.append_as_leader
        write, fsync = os.write, os.fsync
        sync = flush_messages is not None
        view = memoryview(batch)

        def checked_write(data: memoryview) -> None:
            crc32c(data[21:])  # the CRC covers attributes .. end
            write(bound_fd, data)
            if sync:
                fsync(bound_fd)

        ours = floor = bound = 0.0
        done = 0
        for round_ in range(ROUNDS):
            n = count * (round_ + 1) // ROUNDS - done
            done += n
            start = time.perf_counter()
            for _ in range(n):
                append(batch, 1, NOW_MS)
            ours += time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(n):
                write(fd, batch)
                if sync:
                    fsync(fd)
            floor += time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(n):
                checked_write(view)
            bound += time.perf_counter() - start
        log.close()
        size = count * len(batch)
        return size / ours, size / floor, size / bound
    finally:
        os.close(fd)
        os.unlink(name)
        os.close(bound_fd)
        os.unlink(bound_name)
        shutil.rmtree(path)


def bench_appends(parent: Path, preset: Preset) -> list[dict[str, Any]]:
    rows = []
    for value_bytes in RECORD_SIZES:
        batch = make_batch(value_bytes)
        for synced in (False, True):
            count = preset.synced_batches if synced else max(1, preset.append_bytes // len(batch))
            ours, floor, bounds, ratios, bound_ratios = [], [], [], [], []
            for _ in range(preset.repeat):
                rate, base, bound = append_pair(parent, batch, count, 1 if synced else None)
                ours.append(rate)
                floor.append(base)
                bounds.append(bound)
                ratios.append(rate / base)
                bound_ratios.append(bound / base)
            figure = f"append {value_bytes}-byte records" + (
                ", flush_messages=1" if synced else ", no fsync"
            )
            floor_is = "os.write + os.fsync a batch" if synced else "os.write a batch"
            rows.append(
                {
                    "figure": figure,
                    "unit": "MB/s",
                    "batches": count,
                    "batch_bytes": len(batch),
                    "records_check": "compiled" if speedups.COMPILED else "python",
                    "kq": round(median(ours) / 1e6, 2),
                    "floor": round(median(floor) / 1e6, 2),
                    "floor_is": floor_is,
                    "ratio": round(median(ratios), 3),
                }
            )
            # What no Python append can pass: one call a batch, its CRC and
            # the write, with nothing else (no header, offsets or index).
            rows.append(
                {
                    "figure": f"{figure}: bound (a Python call doing crc32c + the write)",
                    "unit": "MB/s",
                    "batches": count,
                    "batch_bytes": len(batch),
                    "kq": round(median(bounds) / 1e6, 2),
                    "floor": round(median(floor) / 1e6, 2),
                    "floor_is": floor_is,
                    "ratio": round(median(bound_ratios), 3),
                }
            )
    return rows


# -- a log to read and recover ------------------------------------------------


def build_log(path: Path, value_bytes: int, total_bytes: int, config: LogConfig) -> int:
    """A log of about ``total_bytes`` of 100-record batches in ``path``,
    written by follower appends of about 1 MiB at a time and closed cleanly;
    returns its log end offset."""
    template = bytearray(make_batch(value_bytes))
    count = max(1, total_bytes // len(template))
    per_call = max(1, MiB // len(template))
    log = PartitionLog.open(OsDirectory(path), config, now_ms=NOW_MS)
    offset = 0
    written = 0
    while written < count:
        n = min(per_call, count - written)
        chunk = bytearray(template * n)
        for i in range(n):
            set_base_offset(chunk, offset + i * RECORDS_PER_BATCH, i * len(template))
        log.append_as_follower(bytes(chunk), NOW_MS)
        offset += n * RECORDS_PER_BATCH
        written += n
    end = log.log_end_offset
    log.close()
    return end


def segment_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(".log"))


# -- reads --------------------------------------------------------------------


def pread_floor(path: Path, ranges: list[tuple[int, int, int]]) -> float:
    """Bytes/s of os.pread of (segment, position, size) ranges."""
    files = segment_files(path)
    fds = [os.open(p, os.O_RDONLY) for p in files]
    try:
        pread = os.pread
        total = 0
        start = time.perf_counter()
        for segment, position, size in ranges:
            total += len(pread(fds[segment], size, position))
        return total / (time.perf_counter() - start)
    finally:
        for fd in fds:
            os.close(fd)


def batch_positions(path: Path) -> dict[int, tuple[int, int]]:
    """Base offset of every batch -> (segment number, position)."""
    out: dict[int, tuple[int, int]] = {}
    for number, file in enumerate(segment_files(path)):
        data = file.read_bytes()
        position = 0
        while position < len(data):
            base = int.from_bytes(data[position : position + 8], "big")
            out[base] = (number, position)
            position += 12 + int.from_bytes(data[position + 8 : position + 12], "big")
    return out


def read_ours(
    log: PartitionLog, starts: list[int], max_bytes: int, batch_bytes: int
) -> tuple[float, list[int], list[int]]:
    """Bytes/s of reads from each of ``starts`` (with none, from the log
    start to its end, each read from where the last ended); the offsets read
    from and how many bytes each read returned, for the floor's ranges (the
    bytes are dropped as a consumer's would be: keeping them all would make
    every read fault in fresh memory, which the floor does not)."""
    read = log.read
    total = 0
    offsets: list[int] = []
    results: list[int] = []
    if not starts:
        end = log.log_end_offset
        offset = log.log_start_offset
        start = time.perf_counter()
        while offset < end:
            data = read(offset, max_bytes)
            total += len(data)
            offsets.append(offset)
            results.append(len(data))
            # Every batch of the log holds 100 offsets in batch_bytes bytes.
            offset += len(data) // batch_bytes * RECORDS_PER_BATCH
    else:
        start = time.perf_counter()
        for offset in starts:
            data = read(offset, max_bytes)
            total += len(data)
            offsets.append(offset)
            results.append(len(data))
    return total / (time.perf_counter() - start), offsets, results


def bench_reads(parent: Path, preset: Preset, read_bytes: int) -> list[dict[str, Any]]:
    rows = []
    for value_bytes in RECORD_SIZES:
        path = scratch(parent, "read")
        try:
            batch_bytes = len(make_batch(value_bytes))
            end = build_log(path, value_bytes, preset.append_bytes, LogConfig())
            positions = batch_positions(path)
            rng = random.Random(value_bytes)
            random_starts = [rng.randrange(end) for _ in range(preset.random_reads)]
            log = PartitionLog.open(OsDirectory(path), LogConfig(), now_ms=NOW_MS)
            log.maybe_increment_high_watermark(end)
            try:
                for kind, starts, max_bytes in (
                    ("sequential", [], read_bytes),
                    ("random", random_starts, read_bytes),
                ):
                    ours, floor, ratios = [], [], []
                    for _ in range(preset.repeat):
                        rate, offsets, results = read_ours(log, starts, max_bytes, batch_bytes)
                        ranges = []
                        for offset, size in zip(offsets, results, strict=True):
                            base = offset - offset % RECORDS_PER_BATCH
                            segment, position = positions[base]
                            ranges.append((segment, position, size))
                        base_rate = pread_floor(path, ranges)
                        ours.append(rate)
                        floor.append(base_rate)
                        ratios.append(rate / base_rate)
                    rows.append(
                        {
                            "figure": f"read {kind}, {value_bytes}-byte records, "
                            f"max_bytes {max_bytes // 1024} KiB",
                            "unit": "MB/s",
                            "reads": len(offsets),
                            "batch_bytes": batch_bytes,
                            "kq": round(median(ours) / 1e6, 1),
                            "floor": round(median(floor) / 1e6, 1),
                            "floor_is": "os.pread of the same ranges",
                            "ratio": round(median(ratios), 3),
                        }
                    )
            finally:
                log.close()
        finally:
            shutil.rmtree(path)
    return rows


# -- recovery -----------------------------------------------------------------


def make_unclean(path: Path) -> None:
    """As after a crash with nothing flushed: no clean-shutdown marker,
    recovery point 0, no producer snapshot."""
    for file in path.iterdir():
        if file.name == ".kafka_cleanshutdown" or file.name.endswith(".snapshot"):
            file.unlink()
    (path / "recovery-point-offset-checkpoint").write_bytes(b"0\n0\n")


def read_and_crc(path: Path) -> int:
    """Read every .log file 1 MiB at a time and compute each batch's CRC-32C;
    the number of batches whose CRC matched."""
    good = 0
    for file in segment_files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            position = 0
            buffer = b""
            at = 0
            while position < size or at < len(buffer):
                if len(buffer) - at < 61:
                    buffer = buffer[at:] + os.pread(fd, MiB, position)
                    position += MiB
                    at = 0
                length = int.from_bytes(buffer[at + 8 : at + 12], "big")
                end = at + 12 + length
                if end > len(buffer):
                    more = os.pread(fd, max(MiB, end - len(buffer)), position)
                    position += len(more)
                    buffer = buffer[at:] + more
                    end -= at
                    at = 0
                view = memoryview(buffer)
                if crc32c(view[at + 21 : end]) == int.from_bytes(buffer[at + 17 : at + 21], "big"):
                    good += 1
                at = end
        finally:
            os.close(fd)
    return good


def bench_recovery(parent: Path, preset: Preset) -> list[dict[str, Any]]:
    rows = []
    for value_bytes in RECORD_SIZES:
        path = scratch(parent, "recovery")
        try:
            build_log(path, value_bytes, preset.recovery_bytes, LogConfig())
            size = sum(p.stat().st_size for p in segment_files(path))
            ours, floor, ratios = [], [], []
            for _ in range(min(preset.repeat, 2)):
                make_unclean(path)
                start = time.perf_counter()
                log = PartitionLog.open(OsDirectory(path), LogConfig(), now_ms=NOW_MS)
                seconds = time.perf_counter() - start
                if log.recovery.clean or log.recovery.recovered_from != 0:
                    raise RuntimeError(f"the log did not recover from 0: {log.recovery}")
                log.close()
                start = time.perf_counter()
                read_and_crc(path)
                base = time.perf_counter() - start
                ours.append(seconds)
                floor.append(base)
                ratios.append(seconds / base)
            rows.append(
                {
                    "figure": f"recovery of {size / MiB:,.0f} MiB, {value_bytes}-byte records",
                    "unit": "s",
                    "log_bytes": size,
                    "kq": round(median(ours), 3),
                    "floor": round(median(floor), 3),
                    "floor_is": "read the .log files and CRC-32C every batch",
                    # Seconds: ours / floor, the "within 2x" of the issue.
                    "ratio": round(median(ratios), 3),
                }
            )
        finally:
            shutil.rmtree(path)
    return rows


# -- memory -------------------------------------------------------------------


def vm_rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def memory_child(directories: list[str], segment_bytes: int) -> dict[str, int]:
    """In the child: open every log (none for the baseline), then report."""
    config = LogConfig(segment_bytes=segment_bytes)
    logs = [PartitionLog.open(OsDirectory(d), config, now_ms=NOW_MS) for d in directories]
    rss = vm_rss_kib()
    segments = sum(len(log.segment_base_offsets) for log in logs)
    return {"rss_kib": rss, "logs": len(logs), "segments": segments}


def run_child(directories: list[Path], segment_bytes: int) -> dict[str, int]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--memory-child",
        str(segment_bytes),
        *map(str, directories),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, int] = json.loads(out)
    return result


def bench_memory(parent: Path, preset: Preset) -> list[dict[str, Any]]:
    root = scratch(parent, "memory")
    try:
        template = root / "template"
        template.mkdir()
        config = LogConfig(segment_bytes=preset.memory_segment_bytes)
        build_log(template, 1024, preset.memory_bytes_per_partition, config)
        directories = []
        for i in range(preset.memory_partitions):
            target = root / f"p{i}"
            shutil.copytree(template, target)
            directories.append(target)
        shutil.rmtree(template)
        total = sum(f.stat().st_size for d in directories for f in segment_files(d))
        empty = run_child([], preset.memory_segment_bytes)
        holding = run_child(directories, preset.memory_segment_bytes)
        return [
            {
                "figure": f"resident memory, {holding['logs']} logs open "
                f"({total / (1 << 30):.2f} GiB, {holding['segments']} segments)",
                "unit": "MiB",
                "log_bytes": total,
                "kq": round(holding["rss_kib"] / 1024, 1),
                "floor": round(empty["rss_kib"] / 1024, 1),
                "floor_is": "same imports, no log open",
                "ratio": round(holding["rss_kib"] / empty["rss_kib"], 3),
                "per_log_kib": round((holding["rss_kib"] - empty["rss_kib"]) / holding["logs"]),
            }
        ]
    finally:
        shutil.rmtree(root)


# -- compaction ---------------------------------------------------------------


def build_compacted_log(path: Path, total_bytes: int, segment_bytes: int) -> PartitionLog:
    """A compacted log of about ``total_bytes`` of 100-record batches of
    1 KiB values whose keys are drawn at random from a tenth as many keys as
    records, so about 10% of the records are each key's last; open, with
    the high watermark at its end."""
    config = LogConfig(cleanup_policy=CleanupPolicy.COMPACT, segment_bytes=segment_bytes)
    log = PartitionLog.open(OsDirectory(path), config, now_ms=NOW_MS)
    value = b"v" * 1024
    per_batch_bytes = len(make_batch(1024))
    count = max(1, total_bytes // per_batch_bytes) * RECORDS_PER_BATCH
    keys = max(1, count // 10)
    rng = random.Random(10)
    offset = 0
    while offset < count:
        records = [
            Record(offset + i, NOW_MS, b"key-%08d" % rng.randrange(keys), value)
            for i in range(RECORDS_PER_BATCH)
        ]
        log.append_as_follower(build_batch(records, base_offset=offset), NOW_MS)
        offset += RECORDS_PER_BATCH
    log.maybe_increment_high_watermark(log.log_end_offset)
    return log


def copy_floor(path: Path, names: list[str]) -> float:
    """Seconds to copy the named files 1 MiB at a time with os.pread and
    os.write, each copy synced once (as each cleaned segment is)."""
    start = time.perf_counter()
    for name in names:
        source = os.open(path / name, os.O_RDONLY)
        target = os.open(path / (name + ".copy"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            position = 0
            while chunk := os.pread(source, MiB, position):
                os.write(target, chunk)
                position += len(chunk)
            os.fsync(target)
        finally:
            os.close(source)
            os.close(target)
    seconds = time.perf_counter() - start
    for name in names:
        os.unlink(path / (name + ".copy"))
    return seconds


def compaction(parent: Path, preset: Preset) -> list[dict[str, Any]]:
    """Compaction of ``compaction_bytes`` with 10% live keys by
    :class:`~partition_log.cleaner.LogCleaner`, cleaning until nothing is
    cleanable, against copying the segments it read."""
    path = scratch(parent, "compaction")
    try:
        segment_bytes = max(MiB, preset.compaction_bytes // 16)
        log = build_compacted_log(path, preset.compaction_bytes, segment_bytes)
        # The segments below the active one: what the cleaner reads.
        names = [f"{base:020d}.log" for base in log.segment_base_offsets[:-1]]
        cleaned_bytes = sum((path / name).stat().st_size for name in names)
        cleaner = LogCleaner({"bench": log}, CleanerConfig())
        read = written = passes = 0
        start = time.perf_counter()
        while cleaner.maybe_clean(NOW_MS):
            assert cleaner.last_cleaning is not None
            read += cleaner.last_cleaning.bytes_read
            written += cleaner.last_cleaning.bytes_written
            passes += 1
        seconds = time.perf_counter() - start
        log.close()
        floor_seconds = copy_floor(path, names)
        return [
            {
                "figure": f"compaction of {cleaned_bytes / MiB:,.0f} MiB, 10% live keys "
                f"({written / max(read, 1):.0%} of the bytes kept, {passes} cleaning(s))",
                "unit": "MB/s",
                "log_bytes": cleaned_bytes,
                "kq": round(read / seconds / 1e6, 1),
                "floor": round(cleaned_bytes / floor_seconds / 1e6, 1),
                "floor_is": "copy the same segments (pread, write, fsync)",
                "ratio": round((read / seconds) / (cleaned_bytes / floor_seconds), 3),
            }
        ]
    finally:
        shutil.rmtree(path)


# -- main ---------------------------------------------------------------------

PARTS: dict[str, Callable[[Path, Preset, argparse.Namespace], list[dict[str, Any]]]] = {
    "append": lambda d, p, a: bench_appends(d, p),
    "read": lambda d, p, a: bench_reads(d, p, a.read_bytes),
    "recovery": lambda d, p, a: bench_recovery(d, p),
    "memory": lambda d, p, a: bench_memory(d, p),
    "compaction": lambda d, p, a: compaction(d, p),
}


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if value < 10 else f"{value:,.1f}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--only", choices=sorted(PARTS), action="append")
    parser.add_argument("--repeat", type=int, help="runs of each figure (default: the preset's)")
    parser.add_argument("--read-bytes", type=int, default=MiB, help="max_bytes of each read")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--memory-child", type=int, metavar="SEGMENT_BYTES", help=argparse.SUPPRESS)
    parser.add_argument("directories", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child is not None:
        print(json.dumps(memory_child(args.directories, args.memory_child)))
        return 0
    preset = PRESETS[args.preset]
    if args.repeat is not None:
        if args.repeat < 1:
            parser.error(f"--repeat {args.repeat} must be at least 1")
        preset = dataclasses.replace(preset, repeat=args.repeat)
    if not args.dir.is_dir():
        parser.error(f"--dir {args.dir} is not a directory")
    rows: list[dict[str, Any]] = []
    for name in args.only or list(PARTS):
        rows.extend(PARTS[name](args.dir, preset, args))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("| figure | unit | kq | floor | ratio | floor is |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['figure']} | {r['unit']} | {_cell(r['kq'])} | {_cell(r['floor'])} | "
                f"{_cell(r['ratio'])} | {r.get('skipped') or r['floor_is']} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
