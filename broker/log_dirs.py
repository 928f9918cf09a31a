"""The seam of a broker's log directories (Kafka's ``log.dirs``): each a
directory of partition directories, and its in-memory twin.

A partition directory is a :class:`~partition_log.files.FileDirectory` (the
partition log's own seam); :class:`LogDirectory` adds what the log manager
needs one level up: list, create, open, rename and remove the partition
directories, and make their names durable. The real one is
:class:`broker.os_log_dirs.OsLogDirectory`.

Durability, as in :mod:`partition_log.files`: a create, rename or removal
of a partition directory survives a power loss only after
:meth:`LogDirectory.sync_directory`.
"""

from __future__ import annotations

import random
from typing import Protocol

from partition_log.files import FileDirectory, MemoryDirectory, check_name, storage_error

__all__ = ["LogDirectory", "MemoryLogDirectory"]


class LogDirectory(Protocol):
    """One log directory: partition directories by name."""

    @property
    def name(self) -> str:
        """What messages call it (its path)."""
        ...

    def list(self) -> list[str]:
        """The names of the directories in it, sorted (files are ignored:
        a log directory also holds the broker's own small files)."""
        ...

    def exists(self, name: str) -> bool: ...

    def create(self, name: str) -> FileDirectory:
        """A new empty directory; refused if ``name`` exists."""
        ...

    def open(self, name: str) -> FileDirectory:
        """An existing directory."""
        ...

    def rename(self, old: str, new: str) -> None:
        """Give directory ``old`` the name ``new``; refused if ``new`` exists."""
        ...

    def remove(self, name: str) -> None:
        """Remove directory ``name`` and every file in it."""
        ...

    def sync_directory(self) -> None:
        """Make the directory names durable (fsync of the log directory)."""
        ...


class MemoryLogDirectory:
    """A :class:`LogDirectory` in memory; :meth:`crash` keeps the names as of
    the last :meth:`sync_directory` and crashes every partition directory."""

    def __init__(self, name: str = "memory") -> None:
        self._name = name
        self._dirs: dict[str, MemoryDirectory] = {}
        self._synced: dict[str, MemoryDirectory] = {}

    @property
    def name(self) -> str:
        return self._name

    def list(self) -> list[str]:
        return sorted(self._dirs)

    def exists(self, name: str) -> bool:
        check_name(name)
        return name in self._dirs

    def _get(self, name: str) -> MemoryDirectory:
        check_name(name)
        found = self._dirs.get(name)
        if found is None:
            raise storage_error(f"directory {name} does not exist in {self._name}")
        return found

    def create(self, name: str) -> MemoryDirectory:
        check_name(name)
        if name in self._dirs:
            raise storage_error(f"directory {name} already exists in {self._name}")
        directory = self._dirs[name] = MemoryDirectory()
        return directory

    def open(self, name: str) -> MemoryDirectory:
        return self._get(name)

    def rename(self, old: str, new: str) -> None:
        check_name(new)
        directory = self._get(old)
        if new in self._dirs:
            raise storage_error(f"directory {new} already exists in {self._name}")
        del self._dirs[old]
        self._dirs[new] = directory

    def remove(self, name: str) -> None:
        self._get(name)
        del self._dirs[name]

    def sync_directory(self) -> None:
        self._synced = dict(self._dirs)

    def crash(self, rng: random.Random | None = None) -> None:
        """A power loss: names back to the last sync, each partition
        directory crashed as :meth:`MemoryDirectory.crash` does."""
        self._dirs = dict(self._synced)
        for directory in {id(d): d for d in self._dirs.values()}.values():
            directory.crash(rng)
