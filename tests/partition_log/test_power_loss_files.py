"""The power-loss test mode of the file seam (PowerLossOsDirectory): a
process killed with SIGKILL loses exactly what it did not sync, which the
normal OsDirectory never loses (test_crash_files.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.os_files import OsDirectory, PowerLossOsDirectory, PowerLossOsFile
from tests.partition_log.test_crash_files import read_all
from tests.power_loss_child import ROOT, kill_when_ready

# Appends batches as leader over the directory class named, flushes after
# the 12th, appends 8 more, prints the log's recovery point (the end of
# what it synced: a roll syncs the old segment too), its end and every
# batch as the log holds it, then waits to be killed.
_CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from partition_log.batch import build_batch
    from partition_log.log import LogConfig, PartitionLog
    from partition_log.os_files import {cls}
    from partition_log.records import Record
    log = PartitionLog.open({cls}(sys.argv[1]), LogConfig(segment_bytes={segment}), now_ms=0)
    for i in range(20):
        records = [Record(j, 1000 + i, b"k%d" % j, b"v%d-%d" % (i, j)) for j in range(3)]
        data = build_batch(records, producer_id=7, producer_epoch=0, base_sequence=3 * i)
        log.append_as_leader(data, 1, 1000 + i)
        if i == 11:
            log.flush(1000 + i)
    print(log.recovery_point, log.log_end_offset, flush=True)
    offset = 0
    while offset < log.log_end_offset:
        stored = log.read(offset, 1)
        print(stored.hex(), flush=True)
        offset += 3
    print("ready", flush=True)
    time.sleep(60)
    """
)


def _append_then_kill(path: Path, cls: str, segment: int) -> tuple[int, int, list[bytes]]:
    """Run the child on ``path``, SIGKILL it (by its pid) once it appended:
    its recovery point, log end and batches."""
    path.mkdir()
    first, *lines = kill_when_ready(_CHILD.format(root=str(ROOT), cls=cls, segment=segment), path)
    recovery_point, end = map(int, first.split())
    return recovery_point, end, [bytes.fromhex(line) for line in lines]


def test_a_kill_drops_the_appends_after_the_last_sync(tmp_path: Path) -> None:
    recovery_point, end, batches = _append_then_kill(
        tmp_path / "p-0", "PowerLossOsDirectory", 1 << 20
    )
    assert (recovery_point, end) == (36, 60)
    log = PartitionLog.open(OsDirectory(tmp_path / "p-0"), LogConfig(), now_ms=0)
    try:
        assert not log.recovery.clean
        assert log.log_end_offset == recovery_point
        assert read_all(log) == batches[:12]
    finally:
        log.close()


def test_a_kill_keeps_the_segments_a_roll_synced(tmp_path: Path) -> None:
    """Small segments: every roll syncs the segment it closes, so the log
    keeps everything up to the last roll's base."""
    recovery_point, end, batches = _append_then_kill(tmp_path / "p-0", "PowerLossOsDirectory", 400)
    assert 36 < recovery_point < end == 60
    log = PartitionLog.open(OsDirectory(tmp_path / "p-0"), LogConfig(), now_ms=0)
    try:
        assert log.log_end_offset == recovery_point
        assert read_all(log) == batches[: recovery_point // 3]
    finally:
        log.close()


def test_the_normal_files_lose_nothing_at_a_kill(tmp_path: Path) -> None:
    recovery_point, end, batches = _append_then_kill(tmp_path / "p-0", "OsDirectory", 1 << 20)
    assert (recovery_point, end) == (36, 60)
    log = PartitionLog.open(OsDirectory(tmp_path / "p-0"), LogConfig(), now_ms=0)
    try:
        assert log.log_end_offset == end
        assert read_all(log) == batches
    finally:
        log.close()


# -- one file against the in-memory twin ----------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.binary(min_size=1, max_size=40)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("sync"), st.none()),
        st.tuples(st.just("read"), st.tuples(st.integers(0, 200), st.integers(0, 200))),
        st.tuples(st.just("reopen"), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=200)
@given(ops=_OPS)
def test_a_file_is_the_twin_and_the_os_holds_only_what_was_synced(
    ops: list[tuple[str, object]],
) -> None:
    """Every step: the process sees what the in-memory twin sees, and the
    OS file (what a kill of the process leaves) holds exactly the twin's
    synced bytes (what a power loss leaves).  A reopen closes the handle,
    which hands the held bytes to the OS as a clean close does."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        real_dir = PowerLossOsDirectory(directory)
        twin_dir = MemoryDirectory()
        real = real_dir.create("f")
        twin = twin_dir.create("f")
        twin_dir.sync_directory()
        path = Path(directory) / "f"
        try:
            for op, arg in ops:
                if op == "append":
                    assert isinstance(arg, bytes)
                    real.append(arg)
                    twin.append(arg)
                elif op == "truncate":
                    assert isinstance(arg, float)
                    size = int(real.size * arg)
                    real.truncate(size)
                    twin.truncate(size)
                elif op == "sync":
                    real.sync()
                    twin.sync()
                elif op == "read":
                    assert isinstance(arg, tuple)
                    assert real.read(*arg) == twin.read(*arg)
                else:
                    real.close()
                    twin.sync()  # a clean close keeps everything
                    real = real_dir.open("f")
                assert isinstance(real, PowerLossOsFile)
                assert real.size == twin.size
                assert real.read(0, real.size) == twin.read(0, twin.size)
                assert path.read_bytes() == twin_dir.durable_bytes("f")
        finally:
            real.close()
