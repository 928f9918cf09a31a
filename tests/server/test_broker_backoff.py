"""The broker's backoff after a failed registration or replica fetch
(server.broker._back_off): it waits the delay given and doubles it, up to
the longest."""

from __future__ import annotations

import asyncio
import time

from server.broker import _BACKOFF_S, _back_off


def test_the_delay_doubles_up_to_the_longest() -> None:
    async def go() -> list[float]:
        delays = [_BACKOFF_S[0]]
        while delays[-1] < _BACKOFF_S[1] and len(delays) < 10:
            delays.append(await _back_off(delays[-1]))
        return delays

    assert asyncio.run(go()) == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]


def test_it_waits_the_delay_given() -> None:
    started = time.monotonic()
    assert asyncio.run(_back_off(0.3)) == 0.6
    assert time.monotonic() - started >= 0.3
