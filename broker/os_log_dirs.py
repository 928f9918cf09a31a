"""The log-directory seam on real directories (:mod:`broker.log_dirs` states
the contract); partition directories are :class:`partition_log.os_files.OsDirectory`."""

from __future__ import annotations

import os

from partition_log.files import check_name, storage_error
from partition_log.os_files import OsDirectory, fsync_directory

__all__ = ["OsLogDirectory"]


class OsLogDirectory:
    """A :class:`~broker.log_dirs.LogDirectory` on an existing directory;
    its partition directories are ``files``
    (:class:`~partition_log.os_files.PowerLossOsDirectory` in the power-loss
    test mode)."""

    def __init__(
        self, path: str | os.PathLike[str], files: type[OsDirectory] = OsDirectory
    ) -> None:
        self.path = os.fspath(path)
        self._files = files
        if not os.path.isdir(self.path):
            raise storage_error(f"log directory {self.path} is not a directory")

    @property
    def name(self) -> str:
        return self.path

    def _path_of(self, name: str) -> str:
        check_name(name)
        return os.path.join(self.path, name)

    def list(self) -> list[str]:
        return sorted(
            entry.name for entry in os.scandir(self.path) if entry.is_dir(follow_symlinks=False)
        )

    def exists(self, name: str) -> bool:
        return os.path.isdir(self._path_of(name))

    def create(self, name: str) -> OsDirectory:
        path = self._path_of(name)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            raise storage_error(f"directory {path} already exists") from None
        except OSError as error:
            raise storage_error(f"creating {path}: {error}") from error
        return self._files(path)

    def open(self, name: str) -> OsDirectory:
        path = self._path_of(name)
        if not os.path.isdir(path):
            raise storage_error(f"directory {path} does not exist")
        return self._files(path)

    def rename(self, old: str, new: str) -> None:
        source, target = self._path_of(old), self._path_of(new)
        if os.path.lexists(target):
            raise storage_error(f"directory {target} already exists")
        try:
            os.rename(source, target)
        except OSError as error:
            raise storage_error(f"renaming {source} to {new}: {error}") from error

    def remove(self, name: str) -> None:
        # Partition directories are flat: their files, then the directory.
        path = self._path_of(name)
        try:
            for entry in os.scandir(path):
                os.unlink(entry.path)
            os.rmdir(path)
        except FileNotFoundError:
            raise storage_error(f"directory {path} does not exist") from None
        except OSError as error:
            raise storage_error(f"removing {path}: {error}") from error

    def sync_directory(self) -> None:
        fsync_directory(self.path)
