"""B13 of the catalogue: a segment's appends wait in a process buffer, not
handed to the OS, when the append returns (when a broker answers the
produce), so a kill -9 of every replica loses acknowledged records (lost-
write). The buffer reaches the file on a flush, a roll or a clean close, so
a run without kills loses nothing. With the bug off a kill -9 loses nothing
that was acknowledged (brokers.md §2.4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bugs
from bugs import ACK_VARIABLE, ACKNOWLEDGEMENT, BUGS_VARIABLE, Bug
from partition_log.errors import PartitionLogError
from partition_log.files import MemoryDirectory, ProcessBufferedFile
from partition_log.log import LogConfig, PartitionLog
from partition_log.os_files import OsDirectory
from tests.partition_log.log_util import batch, read_batches

CHILD = Path(__file__).with_name("unflushed_child.py")
SMALL = LogConfig(segment_bytes=400, index_interval_bytes=100)


def _appended(directory: MemoryDirectory, count: int, config: LogConfig = SMALL) -> PartitionLog:
    log = PartitionLog.open(directory, config, now_ms=0)
    for i in range(count):
        log.append_as_leader(batch(value=b"v%d" % i), 0, now_ms=0)
    return log


def test_without_the_bug_a_dead_process_loses_nothing_it_appended() -> None:
    directory = MemoryDirectory()
    log = _appended(directory, 12)
    # The process dies: nothing closes the log, the files keep what the OS has.
    reopened = PartitionLog.open(directory, SMALL, now_ms=0)
    assert reopened.log_end_offset == log.log_end_offset == 12


def test_b13_a_dead_process_loses_the_appends_after_the_last_roll() -> None:
    directory = MemoryDirectory()
    with bugs.injected(Bug.UNFLUSHED_APPEND):
        log = _appended(directory, 12)
        # The process itself reads everything it appended.
        assert len(read_batches(log)) == 12
    rolled_at = log.segment_base_offsets[-1]
    assert 0 < rolled_at < 12  # the rolls wrote the older segments out
    reopened = PartitionLog.open(directory, SMALL, now_ms=0)
    assert reopened.log_end_offset == rolled_at


def test_b13_a_flush_or_a_clean_close_writes_the_buffer_out() -> None:
    directory = MemoryDirectory()
    with bugs.injected(Bug.UNFLUSHED_APPEND):
        log = _appended(directory, 12)
        log.flush(0)
        log.append_as_leader(batch(value=b"last"), 0, now_ms=0)
        log.close()
    reopened = PartitionLog.open(directory, SMALL, now_ms=0)
    assert reopened.recovery.clean and reopened.log_end_offset == 13


def test_the_process_buffer_reads_truncates_and_syncs_as_one_file() -> None:
    directory = MemoryDirectory()
    inner = directory.create("f.log")
    file = ProcessBufferedFile(inner)
    file.append(b"abc")
    file.sync()
    file.append(b"defgh")
    assert (file.size, inner.size) == (8, 3)
    assert file.read(1, 4) == b"bcde" and file.read(5, 10) == b"fgh" and file.read(9, 2) == b""
    assert file.read(0, 2) == b"ab"
    file.truncate(6)
    assert file.read(0, 10) == b"abcdef"
    file.truncate(2)
    assert (file.size, inner.size, file.read(0, 10)) == (2, 2, b"ab")
    with pytest.raises(PartitionLogError, match="cannot truncate"):
        file.truncate(3)
    file.append(b"xy")
    file.close()
    assert directory.open("f.log").read(0, 10) == b"abxy"


def _kill_after_acks(path: Path, count: int, env: dict[str, str]) -> list[int]:
    """Run the child until it acknowledged ``count`` appends, SIGKILL it;
    the offsets it acknowledged."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(path), str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    acked: list[int] = []
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 30
        for line in child.stdout:
            if line.startswith(b"acked "):
                acked.append(int(line.split()[1]))
            if line == b"done\n" or time.monotonic() > deadline:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        _, err = child.communicate(timeout=20)
    assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")
    return acked


@pytest.mark.parametrize("bug", [False, True], ids=["correct", "B13"])
def test_kill_9_of_a_real_process(tmp_path: Path, bug: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (BUGS_VARIABLE, ACK_VARIABLE)}
    if bug:
        env[BUGS_VARIABLE] = Bug.UNFLUSHED_APPEND.id
        env[ACK_VARIABLE] = ACKNOWLEDGEMENT
    acked = _kill_after_acks(tmp_path, 20, env)
    assert acked == list(range(20))
    reopened = PartitionLog.open(OsDirectory(tmp_path), LogConfig(), now_ms=0)
    try:
        # Without the bug every acknowledged record survives; with it, none
        # of them (one segment, never flushed nor rolled).
        assert reopened.log_end_offset == (0 if bug else 20)
    finally:
        reopened.close()
