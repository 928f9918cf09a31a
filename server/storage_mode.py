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

``KQ_LOSE_UNSYNCED=torn`` is the same mode with torn writes: a broker's
segment files also mirror their unsynced tails beside them
(:class:`partition_log.os_files.TornTailOsDirectory`), and at its next
start the broker writes back a random prefix of each tail a kill left, with
some of its sectors zeroed (:func:`partition_log.os_files.tear_unsynced_tails`),
as a power loss of a real disk may leave it.  The quorum's RocksDB is not
torn (its write-ahead log checks its own records).

Only process assembly (``server/``) reads the variable; it passes a flag
down to the storage it opens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = [
    "LOSE_UNSYNCED_VARIABLE",
    "TORN",
    "StorageModeError",
    "lose_unsynced_from_environment",
    "torn_tails_from_environment",
]

LOSE_UNSYNCED_VARIABLE: Final = "KQ_LOSE_UNSYNCED"
TORN: Final = "torn"
"""The variable's value for the mode with torn writes."""


class StorageModeError(ValueError):
    """The variable holds something other than on or off."""


def lose_unsynced_from_environment(env: Mapping[str, str]) -> bool:
    """Whether ``env`` turns the power-loss test mode on: ``1`` or ``torn``
    on, unset, empty or ``0`` off; anything else refused, naming the
    variable (a typo must not silently run the normal mode in a test that
    means to lose writes)."""
    value = env.get(LOSE_UNSYNCED_VARIABLE, "").strip()
    if value in ("", "0"):
        return False
    if value in ("1", TORN):
        return True
    raise StorageModeError(
        f"environment variable {LOSE_UNSYNCED_VARIABLE} must be 1 (the power-loss test mode: "
        f"unsynced writes are lost at a kill), {TORN} (the same, and a broker's segment files "
        f"keep a torn part of them) or 0, got {value!r}"
    )


def torn_tails_from_environment(env: Mapping[str, str]) -> bool:
    """Whether ``env`` turns the power-loss test mode on with torn writes
    (``torn``); refuses what :func:`lose_unsynced_from_environment` refuses."""
    return lose_unsynced_from_environment(env) and env[LOSE_UNSYNCED_VARIABLE].strip() == TORN
