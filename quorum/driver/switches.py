"""The quorum driver's process-wide on/off switches, read from ``KQ_*``
environment variables (not configuration: ``server.config.IGNORED_ENV``):
``KQ_FETCH_STREAM`` (:mod:`quorum.driver.transport`) and ``KQ_UVLOOP``
(:mod:`quorum.driver.loop`)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["env_switch"]


def env_switch(name: str, environ: Mapping[str, str]) -> bool:
    """Whether switch ``name`` is on in ``environ``: unset, empty, 1, true,
    yes or on (any case) is on; 0, false, no or off is off; anything else
    is a ValueError naming the variable."""
    value = environ.get(name, "1").strip().lower()
    if value in ("1", "true", "yes", "on", ""):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 0 or 1, got {value!r}")
