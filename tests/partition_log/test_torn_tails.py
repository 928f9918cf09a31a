"""The torn-tail mode of the file seam (TornTailOsDirectory): a segment
file mirrors its unsynced tail beside it, and after a SIGKILL the next
start writes back a random prefix of that tail with whole sectors zeroed
(tear_unsynced_tails), as a power loss of a real disk may leave it.  A
correct recovery cuts the log at the first damaged batch; B14's recovery,
which skips the CRCs, keeps a damaged batch."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

import bugs
from bugs import Bug
from partition_log.batch import BatchScanner, verify
from partition_log.errors import PartitionLogError
from partition_log.log import LogConfig, PartitionLog
from partition_log.os_files import (
    SECTOR_BYTES,
    TornTailOsDirectory,
    TornTailOsFile,
    mirror_name,
    tear_unsynced_tails,
    torn_bytes,
)
from tests.partition_log.test_crash_files import read_all
from tests.partition_log.test_power_loss_files import _append_then_kill


def test_torn_bytes_keep_a_prefix_with_whole_sectors_zeroed() -> None:
    tail = bytes(range(1, 256)) * 20  # no zero byte of its own
    base = 700  # not on a sector boundary
    lengths = set()
    for seed in range(200):
        data, zeroed = torn_bytes(base, tail, random.Random(seed))
        lengths.add(len(data))
        assert len(data) <= len(tail)
        if not data:
            assert zeroed == ()
            continue
        assert 1 <= len(zeroed) <= 3
        for start, end in zeroed:
            # Within the kept part, never below the synced base, and inside
            # one sector: whole sectors, clipped at the tail's ends.
            assert base <= start < end <= base + len(data)
            assert start // SECTOR_BYTES == (end - 1) // SECTOR_BYTES
            assert start % SECTOR_BYTES == 0 or start == base
            assert end % SECTOR_BYTES == 0 or end == base + len(data)
        for i, byte in enumerate(data):
            position = base + i
            inside = any(a <= position < b for a, b in zeroed)
            assert byte == (0 if inside else tail[i])
    assert len(lengths) > 100  # the kept length varies over the whole tail
    # Seeded: the same draw gives the same tear.
    assert torn_bytes(base, tail, random.Random(3)) == torn_bytes(base, tail, random.Random(3))


def test_a_segment_mirrors_its_unsynced_tail_until_the_sync(tmp_path: Path) -> None:
    directory = TornTailOsDirectory(tmp_path)
    f = directory.create("00000000000000000000.log")
    assert isinstance(f, TornTailOsFile)
    mirror = tmp_path / mirror_name("00000000000000000000.log")
    f.append(b"synced")
    f.sync()
    assert not mirror.exists()
    f.append(b"abc")
    f.append(b"defg")
    assert mirror.read_bytes()[-7:] == b"abcdefg"
    f.truncate(8)  # within the tail: the mirror follows
    assert mirror.read_bytes()[-2:] == b"ab"
    # The mirror is not part of the log's directory.
    assert directory.list() == ["00000000000000000000.log"]
    f.truncate(3)  # below the synced base: no tail left
    assert not mirror.exists()
    f.append(b"xy")
    assert mirror.exists()
    f.sync()
    assert not mirror.exists()
    f.append(b"z")
    f.close()  # a close hands the tail to the OS
    assert not mirror.exists()
    # Only segment files are mirrored.
    other = directory.create("leader-epoch-checkpoint")
    other.append(b"1\n")
    assert not (tmp_path / mirror_name("leader-epoch-checkpoint")).exists()
    other.close()


def test_deleting_or_renaming_a_segment_drops_its_mirror(tmp_path: Path) -> None:
    directory = TornTailOsDirectory(tmp_path)
    f = directory.create("00000000000000000000.log")
    f.append(b"abc")
    directory.rename("00000000000000000000.log", "00000000000000000000.log.deleted")
    assert not (tmp_path / mirror_name("00000000000000000000.log")).exists()
    g = directory.create("00000000000000000000.log")
    g.append(b"new")
    f.close()  # the renamed file's close leaves the new file's mirror alone
    assert (tmp_path / mirror_name("00000000000000000000.log")).exists()
    directory.delete("00000000000000000000.log")
    assert not (tmp_path / mirror_name("00000000000000000000.log")).exists()
    g.close()


def _killed(tmp_path: Path) -> tuple[Path, int, list[bytes]]:
    """A log directory under ``tmp_path/logs`` whose process appended 20
    batches over TornTailOsDirectory, synced the first 12 and was killed."""
    logs = tmp_path / "logs"
    logs.mkdir()
    recovery_point, end, batches = _append_then_kill(logs / "p-0", "TornTailOsDirectory", 1 << 20)
    assert (recovery_point, end) == (36, 60)
    return logs, recovery_point, batches


def test_a_torn_tail_is_cut_by_a_correct_recovery(tmp_path: Path) -> None:
    logs, recovery_point, batches = _killed(tmp_path)
    segment = logs / "p-0" / "00000000000000000000.log"
    synced = segment.stat().st_size
    (torn,) = tear_unsynced_tails(logs, random.Random(11))
    assert torn.path == "p-0/00000000000000000000.log" and torn.base == synced
    assert torn.unsynced == sum(len(b) for b in batches[12:])
    assert segment.stat().st_size == synced + torn.kept
    assert not (logs / "p-0" / mirror_name(segment.name)).exists()
    assert tear_unsynced_tails(logs, random.Random(11)) == []  # torn once
    log = PartitionLog.open(TornTailOsDirectory(logs / "p-0"), LogConfig(), now_ms=0)
    try:
        kept = read_all(log)
        # Whole batches as written, from the synced ones up to the first
        # one the tear damaged or cut.
        assert kept == batches[: len(kept)] and len(kept) >= recovery_point // 3
        end_position = synced + sum(len(b) for b in kept[12:])
        first_damage = min([torn.base + torn.kept, *(a for a, _ in torn.zeroed)])
        assert end_position <= first_damage
    finally:
        log.close()


def _damaged_batches(log: PartitionLog) -> list[bytes]:
    data = log.read(0, 1 << 20)
    out = []
    for scanned in BatchScanner(data, check_crc=False):
        raw = data[scanned.position : scanned.end]
        try:
            verify(raw)
        except PartitionLogError:
            out.append(raw)
    return out


def test_b14_keeps_a_batch_the_tear_damaged(tmp_path: Path) -> None:
    """Over seeds, some tear zeroes a sector from inside a batch whose
    header stays whole: a correct recovery cuts it, B14's keeps it."""
    killed, _, _ = _killed(tmp_path)
    kept_damaged = 0
    for seed in range(60):
        logs = tmp_path / f"torn-{seed}"
        shutil.copytree(killed, logs)
        tear_unsynced_tails(logs, random.Random(seed))
        copy = tmp_path / f"copy-{seed}"
        shutil.copytree(logs / "p-0", copy)
        correct = PartitionLog.open(TornTailOsDirectory(logs / "p-0"), LogConfig(), now_ms=0)
        try:
            assert _damaged_batches(correct) == []
        finally:
            correct.close()
        with bugs.injected(Bug.RECOVERY_SKIPS_CRC):
            broken = PartitionLog.open(TornTailOsDirectory(copy), LogConfig(), now_ms=0)
        try:
            kept_damaged += bool(_damaged_batches(broken))
        finally:
            broken.close()
    assert kept_damaged >= 3


@pytest.mark.parametrize("size_differs", [True, False])
def test_a_mirror_of_a_file_gone_or_resized_is_only_removed(
    tmp_path: Path, size_differs: bool
) -> None:
    logs, _, _ = _killed(tmp_path)
    segment = logs / "p-0" / "00000000000000000000.log"
    before = segment.read_bytes()
    if size_differs:
        with segment.open("ab") as f:
            f.write(b"x")
        before += b"x"
    else:
        segment.unlink()
    assert tear_unsynced_tails(logs, random.Random(1)) == []
    assert not (logs / "p-0" / mirror_name(segment.name)).exists()
    if size_differs:
        assert segment.read_bytes() == before
