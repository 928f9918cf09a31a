"""Turning on deliberate bugs at a process's start (:mod:`bugs`).

A controller or broker process reads the bug switch from its environment
once, before it opens any storage: ``KQ_INJECT_BUGS`` with the exact
``KQ_INJECT_BUGS_ACK``, or nothing. A process given bugs without the
acknowledgement refuses to start, and one that runs with bugs says so in
its log at every start, so that no one mistakes its data for a real run's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bugs import BugSwitchError, from_environment, install

__all__ = ["install_from_environment"]


def install_from_environment(env: Mapping[str, str], log: logging.Logger, what: str) -> bool:
    """Install the bugs ``env`` names; False (and the reason logged) if the
    switch is refused, and the process must not start."""
    try:
        found = from_environment(env)
    except BugSwitchError as exc:
        log.error("cannot start %s: %s", what, exc)
        return False
    install(found)
    if found:
        log.warning(
            "%s runs with deliberate bugs that lose or corrupt data: %s",
            what,
            ", ".join(f"{b.id} {b.title}" for b in sorted(found, key=lambda b: b.id)),
        )
    return True
