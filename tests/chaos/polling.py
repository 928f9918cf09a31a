"""Waiting on a real cluster in the tests: poll a condition until it holds,
within a bound, and fail naming what was awaited and what was last seen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(
    what: str,
    timeout_s: float,
    ready: Callable[[], Awaitable[object]],
    every_s: float = 0.2,
) -> None:
    """Poll ``ready`` every ``every_s`` until it answers True, at most
    ``timeout_s``; AssertionError naming ``what`` and its last answer (what
    it saw, whatever it returns when not ready)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = await ready()
        if last is True:
            return
        await asyncio.sleep(every_s)
    raise AssertionError(f"{what} within {timeout_s:g} s (last seen: {last})")
