"""Crashes on real files.

(a) A child process (``crash_child.py``) appends to a partition log over
``OsDirectory`` and reports each batch once its append has returned; it is
killed with SIGKILL at random moments (during its open and recovery too),
round after round on the same directory, with and without
``flush.messages=1``.  A kill loses nothing the process handed to the OS
(brokers.md §2.4), so after each kill every reported batch is in the log
byte for byte, the offsets are contiguous, every batch is whole (nothing
half-visible), the recovery report is consistent, and ``check`` finds
nothing once the log is closed.

(b) Bit flips and truncations at random positions of the segment files of a
log left without its clean-shutdown marker: damage at or above the recovery
point is cut exactly at the first damaged batch, which ``LogRecovery`` names
(file and position), with the later segments dropped; damage below it
refuses the open, naming the file and offset, with the files unchanged.
``check`` names the same file and position before recovery.

Both are seeded (the seed is in the test id and in every assertion message)
and bounded.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from partition_log.batch import split_batches
from partition_log.errors import Errors, PartitionLogError
from partition_log.inspect import FindingKind, check, dump
from partition_log.log import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_FILE, LogConfig, PartitionLog
from partition_log.os_files import OsDirectory
from tests.partition_log.crash_child import config
from tests.partition_log.test_inspect import file_digests, write_log

CHILD = Path(__file__).with_name("crash_child.py")


def read_all(log: PartitionLog) -> list[bytes]:
    """Every batch of the log, in order, as whole valid batches (split_batches
    refuses anything else)."""
    batches: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        views = split_batches(log.read(offset, 1 << 16))
        batches.extend(bytes(v) for v in views)
        offset = int.from_bytes(views[-1][:8], "big") + int.from_bytes(views[-1][23:27], "big") + 1
    return batches


def _wait_for_line(path: Path, child: subprocess.Popen[bytes], deadline: float) -> bool:
    """Whether the child wrote its first line before the deadline (and is
    still running: one that exits has failed)."""
    while time.monotonic() < deadline and child.poll() is None:
        if b"\n" in path.read_bytes():
            return True
        time.sleep(0.005)
    return False


@dataclass
class Round:
    number: int
    opened: dict[str, object] | None
    reported: dict[int, bytes]


def _run_child(path: Path, number: int, flush: int, rng: random.Random, out: Path) -> Round:
    with out.open("wb") as stdout:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(path), str(number), str(flush)],
            stdout=stdout,
            stderr=subprocess.PIPE,
        )
    opened_in_time = True
    try:
        if rng.random() < 0.25:
            # Anywhere from the start: often inside the open and its recovery.
            time.sleep(rng.uniform(0.0, 0.6))
        else:
            opened_in_time = _wait_for_line(out, child, time.monotonic() + 20)
            time.sleep(rng.uniform(0.0, 0.25))
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        _, err = child.communicate(timeout=20)
    # Killed, never exited of itself (a refused open, an append that failed).
    assert child.returncode == -signal.SIGKILL and opened_in_time, err.decode(errors="replace")
    opened = None
    reported: dict[int, bytes] = {}
    for line in out.read_bytes().split(b"\n")[:-1]:  # the last is empty or partial
        if line.startswith(b"opened "):
            opened = json.loads(line[len(b"opened ") :])
            continue
        first, _, hexed = line.split(b" ")
        reported[int(first)] = bytes.fromhex(hexed.decode())
    return Round(number, opened, reported)


def _verify_copy(
    path: Path, scratch: Path, flush: int, reported: dict[int, bytes], why: str
) -> int:
    """Open a copy of the crashed directory (the original is left for the next
    child to recover) and check it; returns its log end."""
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(path, scratch)
    log = PartitionLog.open(OsDirectory(scratch), config(flush), now_ms=0)
    recovery = log.recovery
    end = log.log_end_offset
    assert recovery.log_end_offset == end, why
    assert recovery.recovered_from <= end, why
    assert (recovery.cut_segment is None) == (recovery.cut_position is None), why
    assert (recovery.truncated_bytes > 0) == (recovery.cut_segment is not None), why
    if recovery.truncated_bytes:
        assert recovery.reason, why
    if recovery.dropped_segments:
        assert recovery.cut_segment is not None, why
        assert all(name > recovery.cut_segment for name in recovery.dropped_segments), why
    batches = read_all(log)
    by_offset = {int.from_bytes(b[:8], "big"): b for b in batches}
    expected = log.log_start_offset
    for data in batches:
        assert int.from_bytes(data[:8], "big") == expected, f"{why}: offsets not contiguous"
        expected += int.from_bytes(data[23:27], "big") + 1
    assert expected == end, why
    for offset, data in sorted(reported.items()):
        assert by_offset.get(offset) == data, f"{why}: reported batch at {offset} lost or changed"
    if reported:
        last = max(reported)
        assert end >= last + 1, why
    # The epoch cache and the producer state are those of the batches.
    assert log.epoch_cache.latest_epoch == max(
        (int.from_bytes(b[12:16], "big", signed=True) for b in batches), default=-1
    ), why
    log.close()
    findings = check(OsDirectory(scratch))
    assert findings == [], f"{why}: {[str(f) for f in findings]}"
    return end


@pytest.mark.parametrize("flush", [0, 1], ids=["no-flush-policy", "flush.messages=1"])
@pytest.mark.parametrize("seed", [14])
def test_kill_9_loses_nothing_the_process_handed_to_the_os(
    tmp_path: Path, seed: int, flush: int
) -> None:
    rng = random.Random(seed * 2 + flush)
    path = tmp_path / "p-0"
    path.mkdir()
    reported: dict[int, bytes] = {}
    rounds_with_batches = 0
    opened_before = False
    for number in range(8):
        why = f"seed {seed}, flush {flush}, round {number}"
        result = _run_child(path, number, flush, rng, tmp_path / f"out-{number}")
        if result.opened is not None:
            # Once a child has opened the log, no one closes it again: every
            # later open is after a crash.
            assert result.opened["clean"] is not opened_before, why
            opened_before = True
        reported.update(result.reported)
        rounds_with_batches += bool(result.reported)
        _verify_copy(path, tmp_path / "scratch", flush, reported, why)
    assert rounds_with_batches >= 2, f"seed {seed}: too few rounds appended anything"
    # The original directory, recovered in place, holds it all too.
    _verify_copy(path, tmp_path / "final", flush, reported, f"seed {seed}, flush {flush}, final")


# -- (b) damage at random positions -------------------------------------------------

DAMAGE_CONFIG = LogConfig(segment_bytes=600, index_interval_bytes=100)


@dataclass(frozen=True)
class BatchAt:
    file: str
    position: int
    size: int
    base_offset: int
    next_offset: int


def _batches(path: Path) -> list[BatchAt]:
    return [
        BatchAt(s.file, b.position, b.header.size, b.header.base_offset, b.header.next_offset)
        for s in dump(OsDirectory(path)).segments
        for b in s.batches
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_damage_at_random_positions_is_cut_exactly_or_refused(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    pristine = tmp_path / "pristine"
    write_log(pristine, batches=24)
    batches = _batches(pristine)
    files = sorted({b.file for b in batches})
    assert len(files) >= 4
    outcomes = {"refused": 0, "cut": 0}
    for trial in range(25):
        path = tmp_path / f"trial-{trial}"
        shutil.copytree(pristine, path)
        (path / CLEAN_SHUTDOWN_FILE).unlink()
        # The recovery point: at a batch boundary of some segment (a crash
        # leaves it at a roll or a flush).
        point_batch = rng.choice(batches)
        recovery_point = rng.choice([point_batch.base_offset, point_batch.next_offset])
        (path / RECOVERY_POINT_FILE).write_bytes(b"0\n%d\n" % recovery_point)
        # Damage in the segment holding the recovery point or a later one
        # (earlier ones are not rescanned, as in Kafka).
        holding = max(f for f in files if int(f[:20]) <= recovery_point)
        damaged_file = rng.choice([f for f in files if f >= holding])
        in_file = [b for b in batches if b.file == damaged_file]
        victim = rng.choice(in_file)
        segment = path / damaged_file
        data = bytearray(segment.read_bytes())
        if rng.random() < 0.5:
            # A bit flip where the batch checks it: the length, the magic and
            # the CRC-covered bytes (the base offset and the leader epoch are
            # outside the CRC: docs/partition-log.md).
            where = victim.position + rng.choice([*range(8, 12), 16, *range(17, victim.size)])
            data[where] ^= 1 << rng.randrange(8)
            kind = f"bit flip at {where}"
        else:
            # A truncation inside the batch (one at a batch boundary leaves
            # whole batches: nothing to cut).
            where = victim.position + rng.randrange(1, victim.size)
            del data[where:]
            kind = f"truncation at {where}"
        segment.write_bytes(bytes(data))
        why = (
            f"seed {seed}, trial {trial}: {kind} of {damaged_file} (batch at "
            f"{victim.position}, offset {victim.base_offset}), recovery point {recovery_point}"
        )
        # The tool names the same place before anything is recovered.
        found = [f for f in check(OsDirectory(path)) if f.file == damaged_file]
        assert found and found[0].position == victim.position, why
        assert found[0].kind in (FindingKind.CORRUPT_BATCH, FindingKind.TORN_TAIL), why
        before = file_digests(path)
        if victim.base_offset < recovery_point:
            with pytest.raises(PartitionLogError) as refused:
                PartitionLog.open(OsDirectory(path), DAMAGE_CONFIG, now_ms=0)
            message = str(refused.value)
            assert refused.value.code is Errors.CORRUPT_MESSAGE, why
            assert damaged_file in message, f"{why}: {message}"
            assert f"offset {victim.base_offset}" in message, f"{why}: {message}"
            assert file_digests(path) == before, why
            outcomes["refused"] += 1
            continue
        log = PartitionLog.open(OsDirectory(path), DAMAGE_CONFIG, now_ms=0)
        recovery = log.recovery
        assert not recovery.clean, why
        assert recovery.cut_segment == damaged_file, f"{why}: {recovery}"
        assert recovery.cut_position == victim.position, f"{why}: {recovery}"
        assert recovery.truncated_bytes == len(data) - victim.position, f"{why}: {recovery}"
        assert recovery.reason and f"position {victim.position}" in recovery.reason, why
        later = tuple(f for f in files if f > damaged_file)
        assert recovery.dropped_segments == later, f"{why}: {recovery}"
        assert log.log_end_offset == victim.base_offset, why
        kept = [b for b in batches if b.base_offset < victim.base_offset]
        stored = read_all(log)
        assert len(stored) == len(kept), why
        for batch, data_kept in zip(kept, stored, strict=True):
            original = (pristine / batch.file).read_bytes()
            assert data_kept == original[batch.position : batch.position + batch.size], why
        log.close()
        findings = check(OsDirectory(path))
        assert findings == [], f"{why}: {[str(f) for f in findings]}"
        shutil.rmtree(path)
        outcomes["cut"] += 1
    assert all(outcomes.values()), f"seed {seed}: {outcomes}"
