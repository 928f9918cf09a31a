"""The node's event loop: uvloop unless KQ_UVLOOP=0 or it is not installed."""

from __future__ import annotations

import asyncio
import sys

import pytest

from quorum.driver.loop import loop_factory, loop_name, run, uvloop_wanted


async def _which() -> str:
    return loop_name(asyncio.get_running_loop())


def test_uvloop_runs_the_node_unless_the_environment_says_no() -> None:
    pytest.importorskip("uvloop")
    assert run(_which(), environ={}) == "uvloop"
    assert run(_which(), environ={"KQ_UVLOOP": "1"}) == "uvloop"
    assert run(_which(), environ={"KQ_UVLOOP": "0"}) == "asyncio"
    assert loop_factory({"KQ_UVLOOP": "off"}) is None


def test_without_uvloop_installed_asyncio_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # An import of a module set to None in sys.modules fails, as for a
    # package that is not installed.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert loop_factory({}) is None
    assert run(_which(), environ={}) == "asyncio"


def test_a_bad_switch_is_named() -> None:
    assert uvloop_wanted({})
    with pytest.raises(ValueError, match="KQ_UVLOOP must be 0 or 1, got 'fast'"):
        uvloop_wanted({"KQ_UVLOOP": "fast"})
