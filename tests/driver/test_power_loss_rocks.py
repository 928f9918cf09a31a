"""The power-loss test mode of the quorum's storage (PowerLossRocksStorage):
a process killed with SIGKILL loses exactly the writes it did not sync."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from quorum.driver.rocks import PowerLossRocksStorage, RocksStorage
from quorum.driver.storage_format import format_storage, open_node_storage
from quorum.ready import Ready
from quorum.types import Batch, QuorumState, SnapshotId, VoterSet
from tests.power_loss_child import ROOT, kill_when_ready

# The child writes, says "ready" and waits to be killed.  Synced: the log
# 0..9 with the vote of epoch 1 (Ready.must_sync), then 10..11 with the
# vote of epoch 2 through the LogStore and QuorumStateStore and their
# flush.  Unsynced: the log's prefix below 5 deleted (a compaction, the
# one unsynced write of a correct quorum core), then 12..14 appended and
# epoch 3 voted without a flush.
_CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from quorum.driver.rocks import {cls}
    from quorum.ready import Ready
    from quorum.types import Batch, QuorumState, SnapshotId
    s = {cls}(sys.argv[1])
    s.persist(Ready(entries=tuple(Batch(i, 1, (b"x%d" % i,)) for i in range(10)),
                    quorum_state=QuorumState(1, 1, None), must_sync=True))
    s.log.append([Batch(10, 2, (b"x10", b"x11"))])
    s.state.write(QuorumState(2, 2, None))
    s.log.flush()
    s.persist(Ready(compact_to=SnapshotId(5, 1)))
    s.log.append([Batch(12, 3, (b"x12", b"x13", b"x14"))])
    s.state.write(QuorumState(3, 3, None))
    assert [b.base_offset for b in s.log.read_all()][0] == 5  # the process sees them
    assert s.state.read() == QuorumState(3, 3, None)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def _write_then_kill(path: Path, cls: str) -> None:
    """Run the child on ``path`` and SIGKILL it (by its pid) once it wrote."""
    assert kill_when_ready(_CHILD.format(root=str(ROOT), cls=cls), path) == []


def test_a_kill_drops_the_unsynced_writes_and_keeps_the_synced(tmp_path: Path) -> None:
    _write_then_kill(tmp_path, "PowerLossRocksStorage")
    with RocksStorage(tmp_path) as storage:
        # The compaction, the last append and the last vote are gone.
        assert [b.base_offset for b in storage.log.read_all()] == [*range(10), 10]
        assert storage.log.end_offset() == 12
        assert storage.state.read() == QuorumState(2, 2, None)


def test_the_normal_storage_loses_nothing_at_a_kill(tmp_path: Path) -> None:
    """The same writes in the normal mode: RocksDB hands even an unsynced
    write to the OS at once, which a kill of the process does not lose
    (this is what the test mode is for)."""
    _write_then_kill(tmp_path, "RocksStorage")
    with RocksStorage(tmp_path) as storage:
        assert [b.base_offset for b in storage.log.read_all()] == [5, 6, 7, 8, 9, 10, 12]
        assert storage.state.read() == QuorumState(3, 3, None)


def test_a_synced_write_makes_the_held_ones_before_it_durable(tmp_path: Path) -> None:
    """An unsynced write followed by a synced one is kept with it, in order:
    the held writes are flushed before the synced one is written."""
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from quorum.driver.rocks import PowerLossRocksStorage
        from quorum.ready import Ready
        from quorum.types import Batch, QuorumState, SnapshotId
        s = PowerLossRocksStorage(sys.argv[1])
        s.persist(Ready(entries=tuple(Batch(i, 1, (b"x",)) for i in range(6)), must_sync=True))
        s.persist(Ready(compact_to=SnapshotId(3, 1)))
        s.log.append([Batch(6, 1, (b"x",))])
        s.persist(Ready(entries=(Batch(7, 2, (b"y",)),), quorum_state=QuorumState(2, 2, None),
                        must_sync=True))
        s.log.append([Batch(8, 2, (b"z",))])
        os.kill(os.getpid(), 9)
        """
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], timeout=60)
    assert done.returncode == -signal.SIGKILL
    with RocksStorage(tmp_path) as storage:
        assert [b.base_offset for b in storage.log.read_all()] == [3, 4, 5, 6, 7]
        assert storage.state.read() == QuorumState(2, 2, None)


def test_a_clean_close_keeps_the_held_writes(tmp_path: Path) -> None:
    with PowerLossRocksStorage(tmp_path) as storage:
        storage.persist(Ready(entries=(Batch(0, 1, (b"a", b"b")),), must_sync=True))
        storage.log.append([Batch(2, 1, (b"c",))])
        storage.state.write(QuorumState(1, 1, None))
        storage.persist(Ready(compact_to=SnapshotId(2, 1)))
    with RocksStorage(tmp_path) as storage:
        assert [b.base_offset for b in storage.log.read_all()] == [2]
        assert storage.state.read() == QuorumState(1, 1, None)


def test_open_node_storage_chooses_the_mode(tmp_path: Path) -> None:
    format_storage(tmp_path, "kq-cluster-1", 1, VoterSet(frozenset({1})))
    with open_node_storage(tmp_path, "kq-cluster-1", 1) as normal:
        assert type(normal) is RocksStorage
    with open_node_storage(tmp_path, "kq-cluster-1", 1, lose_unsynced=True) as lossy:
        assert isinstance(lossy, PowerLossRocksStorage)
