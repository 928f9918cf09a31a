"""The event loop a quorum node runs on: uvloop when it is installed, else
asyncio's own.

uvloop (libuv under asyncio's API) makes the loop's own work, the
callbacks and wake-ups every RPC schedules, cheaper than asyncio's pure
Python loop; grpc.aio runs on it unchanged.  ``KQ_UVLOOP=0`` in the
environment keeps asyncio's loop (to compare the two, or to rule uvloop
out); without uvloop installed asyncio's loop is used, so a node never
needs it to start.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from quorum.driver.switches import env_switch

__all__ = ["loop_factory", "loop_name", "run", "uvloop_wanted"]

log = logging.getLogger("kq.loop")

T = TypeVar("T")


def uvloop_wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment allows uvloop (``KQ_UVLOOP``, default 1)."""
    return env_switch("KQ_UVLOOP", environ)


def loop_factory(
    environ: Mapping[str, str] = os.environ,
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when allowed and importable; None: asyncio's."""
    if not uvloop_wanted(environ):
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``, for the node's start-up log line."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], environ: Mapping[str, str] = os.environ) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` chooses."""
    factory = loop_factory(environ)
    with asyncio.Runner(loop_factory=factory) as runner:
        log.debug("event loop: %s", loop_name(runner.get_loop()))
        return runner.run(main)
