"""``chaos.workloads.run_workers``: the time limit of a workload's main phase."""

from __future__ import annotations

import asyncio

import pytest

from chaos.workloads import run_workers


def test_run_workers_cancels_the_ones_still_running_at_the_limit() -> None:
    cancelled: list[int] = []
    finished: list[int] = []

    async def worker(i: int, seconds: float) -> None:
        try:
            await asyncio.sleep(seconds)
            finished.append(i)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise

    asyncio.run(run_workers([worker(0, 0.0), worker(1, 30.0)], 0.2))
    assert finished == [0]
    assert cancelled == [1]


def test_run_workers_raises_the_error_of_a_worker_that_ended() -> None:
    cancelled: list[str] = []

    async def failing() -> None:
        raise RuntimeError("worker broke")

    async def slow() -> None:
        try:
            await asyncio.sleep(30.0)
        except asyncio.CancelledError:
            cancelled.append("slow")
            raise

    with pytest.raises(RuntimeError, match="worker broke"):
        asyncio.run(run_workers([failing(), slow()], 0.2))
    # The error is raised only after the others were cancelled and awaited.
    assert cancelled == ["slow"]
