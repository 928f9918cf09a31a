"""The real-cluster tests' wait (tests.chaos.polling.until): it returns
once the condition holds, and fails at its bound naming what was awaited
and the last answer."""

from __future__ import annotations

import asyncio

import pytest

from tests.chaos.polling import until


def test_until_returns_once_the_condition_answers_true() -> None:
    answers = iter([[1], [1, 2], True, "never asked"])
    asked: list[object] = []

    async def ready() -> object:
        asked.append(answer := next(answers))
        return answer

    asyncio.run(until("the third answer", 5.0, ready, every_s=0.01))
    assert asked == [[1], [1, 2], True]


def test_until_fails_at_its_bound_naming_what_and_the_last_answer() -> None:
    async def ready() -> object:
        # Anything but True is not ready, a truthy answer too.
        return [4, 5]

    with pytest.raises(
        AssertionError, match=r"broker 6 in the ISR within 0.05 s \(last seen: \[4, 5\]\)"
    ):
        asyncio.run(until("broker 6 in the ISR", 0.05, ready, every_s=0.01))
