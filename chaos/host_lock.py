"""One local cluster with network faults per host at a time.

Every local cluster gives node ``i`` the same loopback address and the
same DSCP mark (:mod:`chaos.local`), so the iptables rules of one cluster's
partition match the packets of another's nodes: two such clusters at once
cut each other's nodes without either history saying so, and their
verdicts would be about faults nobody recorded.  A cluster with network
faults holds an exclusive ``flock`` on a file of the host while it runs;
a second one is refused, naming the first (its process and folder).  The
kernel drops the lock when its process dies, so a crashed run never
leaves it behind."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import TextIO

__all__ = ["HostLock", "HostLockBusy", "default_lock_path"]

LOCK_NAME = "kq-chaos-network-faults.lock"


def default_lock_path() -> Path:
    """The host's lock directory (``/run/lock``, FHS) if it has one, else
    the temporary directory."""
    run_lock = Path("/run/lock")
    base = run_lock if run_lock.is_dir() else Path(tempfile.gettempdir())
    return base / LOCK_NAME


class HostLockBusy(RuntimeError):
    """Another local cluster with network faults holds the host's lock."""


class HostLock:
    """The host's lock for the cluster in ``directory`` (:meth:`acquire`,
    :meth:`release`; a context manager too)."""

    def __init__(self, directory: Path, path: Path | None = None) -> None:
        self.directory = directory
        self.path = path if path is not None else default_lock_path()
        self._file: TextIO | None = None

    def acquire(self) -> None:
        """Take the lock at once or raise :class:`HostLockBusy` naming its
        holder; never waits."""
        if self._file is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "a process that has not written its name yet"
            f.close()
            raise HostLockBusy(
                f"another local chaos cluster with network faults runs on this host "
                f"({holder}; lock {self.path}): local clusters share loopback addresses and "
                "DSCP marks, so each one's partitions would cut the other's nodes; run one "
                "at a time, or use --backend docker"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}, cluster {self.directory}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        f, self._file = self._file, None
        if f is None:
            return
        with contextlib.suppress(OSError):
            f.truncate(0)
        f.close()  # closing the only descriptor drops the flock

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
