"""The power-loss test mode of a process's storage, read once at its start.

With ``KQ_LOSE_UNSYNCED=1`` in its environment, a controller or broker
keeps every write it has not synced in its own memory, where its reads see
it, and hands it to the OS only at the sync that covers it: the quorum's
RocksDB (:class:`quorum.driver.rocks.PowerLossRocksStorage`) and a broker's
partition logs (:class:`partition_log.os_files.PowerLossOsDirectory`).  A
kill -9 of the process then drops exactly what a power loss of its machine
may drop, which is what the chaos harness's ``power-loss`` fault needs
(``docs/chaos.md``; Jepsen gets the same from its lazyfs file system).  Off
by default: a process's normal writes reach the OS at once, and a kill
loses nothing.

Only process assembly (``server/``) reads the variable; it passes a flag
down to the storage it opens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["LOSE_UNSYNCED_VARIABLE", "StorageModeError", "lose_unsynced_from_environment"]

LOSE_UNSYNCED_VARIABLE: Final = "KQ_LOSE_UNSYNCED"


class StorageModeError(ValueError):
    """The variable holds something other than on or off."""


def lose_unsynced_from_environment(env: Mapping[str, str]) -> bool:
    """Whether ``env`` turns the power-loss test mode on: ``1`` on, unset,
    empty or ``0`` off; anything else refused, naming the variable (a typo
    must not silently run the normal mode in a test that means to lose
    writes)."""
    value = env.get(LOSE_UNSYNCED_VARIABLE, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise StorageModeError(
        f"environment variable {LOSE_UNSYNCED_VARIABLE} must be 1 (the power-loss test mode: "
        f"unsynced writes are lost at a kill) or 0, got {value!r}"
    )
