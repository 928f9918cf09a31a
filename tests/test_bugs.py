"""The deliberate bugs' switch: off by default, turned on only from the
environment with the acknowledgement, and a process refuses to start on
bugs without it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import bugs
from bugs import ACK_VARIABLE, ACKNOWLEDGEMENT, BUGS_VARIABLE, Bug, BugSwitchError
from kq.cli import main
from tests.driver.cluster_util import free_ports
from tests.server.test_broker_config import write_config


def test_ids_names_and_titles_are_unique_and_parse_back() -> None:
    assert len({b.id for b in Bug}) == len(Bug)
    assert len({b.title for b in Bug}) == len(Bug)
    for bug in Bug:
        assert bugs.parse(bug.id) == {bug}
        assert bugs.parse(bug.title.upper()) == {bug}
        assert bugs.parse(bug.name) == {bug}
    assert bugs.parse(" b1 , Q2,,") == {Bug.TRUNCATE_TO_HW_ON_BECOME_FOLLOWER, Bug.DOUBLE_VOTE}


def test_an_unknown_bug_is_named() -> None:
    with pytest.raises(BugSwitchError, match="unknown bug 'B99'"):
        bugs.parse("B1,B99")


def test_no_bug_is_on_unless_the_environment_acknowledges_it() -> None:
    assert bugs.active() == frozenset()
    assert bugs.from_environment({}) == frozenset()
    assert bugs.from_environment({ACK_VARIABLE: ACKNOWLEDGEMENT}) == frozenset()
    with pytest.raises(BugSwitchError, match="refusing to start unless"):
        bugs.from_environment({BUGS_VARIABLE: "B5"})
    with pytest.raises(BugSwitchError, match="refusing"):
        bugs.from_environment({BUGS_VARIABLE: "B5", ACK_VARIABLE: "yes"})
    found = bugs.from_environment({BUGS_VARIABLE: "B5", ACK_VARIABLE: ACKNOWLEDGEMENT})
    assert found == {Bug.HW_AT_LEADER_LEO}


def test_injected_turns_bugs_on_for_its_body_only() -> None:
    assert not bugs.on(Bug.DOUBLE_VOTE)
    with bugs.injected(Bug.DOUBLE_VOTE):
        assert bugs.on(Bug.DOUBLE_VOTE) and not bugs.on(Bug.FORGET_VOTE)
        with bugs.injected(Bug.FORGET_VOTE):
            assert bugs.active() == {Bug.DOUBLE_VOTE, Bug.FORGET_VOTE}
        assert bugs.active() == {Bug.DOUBLE_VOTE}
    assert bugs.active() == frozenset()


@pytest.mark.parametrize("command", ["broker", "controller"])
def test_a_process_given_bugs_without_the_acknowledgement_refuses_to_start(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (port,) = free_ports(1)
    voter = 1 if command == "broker" else 11
    path = write_config(tmp_path, f"{voter}@127.0.0.1:{port}", port)
    monkeypatch.setenv(BUGS_VARIABLE, "B1")
    monkeypatch.delenv(ACK_VARIABLE, raising=False)
    with caplog.at_level(logging.ERROR):
        assert main([command, "start", "--config", str(path)]) == 1
    assert f"refusing to start unless {ACK_VARIABLE}={ACKNOWLEDGEMENT}" in caplog.text
    assert bugs.active() == frozenset()
    # Nothing was opened: the data directory is not even created.
    assert not (tmp_path / "metadata").exists()
