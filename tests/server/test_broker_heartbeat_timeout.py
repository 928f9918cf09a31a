"""A heartbeat whose answer is late does not hold back the next one. The
active controller counts a heartbeat when it arrives but answers it only
once its earlier writes commit; with thousands of partitions' records that
took longer than a session, and a broker waiting on its one heartbeat was
fenced. The broker now stops waiting after ``heartbeat_timeout_s`` and
sends the next. Here the controller's answers are held back: counted on
arrival, answered two sessions late."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import server.broker
from metadata.client import IndeterminateError
from tests.server.test_broker_heartbeat_during_apply import fenced_by_controller, one_broker
from tests.server.test_broker_process import SETTINGS

LATE_S = SETTINGS.broker_session_timeout_ms / 1000 * 2


async def late_answers(tmp_path: Path) -> int:
    """Heartbeats sent over two sessions whose answers come late."""
    async with one_broker(tmp_path) as (_, process):
        real = process.client.broker_heartbeat
        sent = 0

        async def late(*args: object, timeout_s: float | None = None, **kwargs: bool) -> object:
            nonlocal sent
            sent += 1
            await real(*args, timeout_s=timeout_s, **kwargs)  # type: ignore[arg-type]
            # The answer would come after LATE_S: the caller stops waiting
            # at its deadline.
            await asyncio.sleep(LATE_S if timeout_s is None else min(timeout_s, LATE_S))
            raise IndeterminateError("BrokerHeartbeat timed out", timed_out=True)

        process.client.broker_heartbeat = late  # type: ignore[method-assign, assignment]
        await asyncio.sleep(LATE_S)
        return sent


@pytest.mark.parametrize("waits_out_late_answers", [False, True])
def test_a_late_heartbeat_answer_does_not_get_the_broker_fenced(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    waits_out_late_answers: bool,
) -> None:
    if waits_out_late_answers:
        # The rule broken: a heartbeat waits as long as the client's default.
        monkeypatch.setattr(server.broker, "heartbeat_timeout_s", lambda interval_ms: None)
    sent = asyncio.run(asyncio.wait_for(late_answers(tmp_path), 60))
    if waits_out_late_answers:
        assert sent == 1 and fenced_by_controller(caplog)
    else:
        # One every timeout (2 s) plus the interval, inside the 3 s session.
        assert sent >= 2 and not fenced_by_controller(caplog)
