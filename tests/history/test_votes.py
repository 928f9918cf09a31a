"""vote-durability, the pure reference (``history.votes``): a vote granted
in an epoch survives every restart in that epoch, and no node votes for two
candidates in one epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from history.ops import HistoryFormatError
from history.votes import check_vote_durability, read_run_votes, read_votes
from tests.history.vote_exports import (
    EPOCH_LOST,
    FORGOT_THEN_TWICE,
    KEPT,
    NEW_EPOCH,
    STORED_WITHOUT_VOTE,
    line,
    write_votes,
)


def _check(tmp_path: Path, lines: list[dict[str, object]]) -> list[tuple[str, int, int]]:
    write_votes(tmp_path, lines)
    return [(a.kind, a.node, a.epoch) for a in check_vote_durability(read_run_votes(tmp_path))]


def test_a_restart_that_kept_its_vote_and_a_new_epoch_after_a_restart_are_fine(
    tmp_path: Path,
) -> None:
    assert _check(tmp_path, KEPT + NEW_EPOCH) == []


def test_a_start_that_restored_the_epoch_without_its_vote_then_a_second_vote(
    tmp_path: Path,
) -> None:
    found = check_vote_durability(_written(tmp_path, FORGOT_THEN_TWICE))
    assert [(a.kind, a.node, a.epoch) for a in found] == [
        ("vote-forgotten", 3, 2),  # the start of life 2
        ("double-vote", 3, 2),
        ("vote-forgotten", 3, 2),  # the stored state holds the second vote
    ]
    forgot, twice, _ = found
    assert [(w["event"], w["seq"]) for w in forgot.witness] == [("grant", 1), ("start", 2)]
    assert "voted for node 1 in epoch 2" in forgot.message
    assert "with a vote for nobody" in forgot.message
    assert [(w["voted_for"], w["seq"]) for w in twice.witness] == [(1, 1), (2, 3)]
    # A vote changed within its epoch is a vote forgotten, even with no restart between.
    changed = FORGOT_THEN_TWICE[:2] + FORGOT_THEN_TWICE[4:]
    kinds = [a.kind for a in check_vote_durability(_written(tmp_path / "b", changed))]
    assert kinds == ["vote-forgotten"]


def _written(path: Path, lines: list[dict[str, object]]) -> list[dict[str, object]]:
    write_votes(path, lines)
    return read_run_votes(path)


def test_an_older_epoch_restored_loses_the_vote_with_it(tmp_path: Path) -> None:
    assert _check(tmp_path, EPOCH_LOST) == [("epoch-forgotten", 4, 7)]


def test_a_stored_state_without_the_vote_for_itself(tmp_path: Path) -> None:
    found = check_vote_durability(_written(tmp_path, STORED_WITHOUT_VOTE))
    assert [(a.kind, a.node, a.epoch) for a in found] == [("vote-forgotten", 5, 1)]
    assert "voted for itself" in found[0].message
    assert "its stored quorum state" in found[0].message


def test_only_the_highest_epoch_voted_in_must_be_restored(tmp_path: Path) -> None:
    # Votes of older epochs are over once a newer epoch is restored, with or
    # without a vote in it.
    lines = [
        line(1, 1, "grant", 2, 3),
        line(1, 1, "grant", 4, 2),
        line(1, 2, "start", 4, 2, None),
        line(1, 3, "start", 9, None, 3),
    ]
    assert _check(tmp_path, lines) == []


def test_votes_of_the_same_life_are_not_judged_by_its_start(tmp_path: Path) -> None:
    # A start restores what earlier lives left; votes after it are its own.
    assert _check(tmp_path, [line(1, 1, "start", 1, None, None), line(1, 1, "grant", 1, 2)]) == []


def test_a_bad_line_is_named(tmp_path: Path) -> None:
    write_votes(tmp_path, [line(1, 1, "grant", 2, 3)])
    path = tmp_path / "nodes" / "1" / "votes.jsonl"
    path.write_text(
        path.read_text()
        + '{"node":1,"time":0,"life":1,"event":"vote","epoch":2,"voted_for":3,"leader":null}\n'
    )
    with pytest.raises(HistoryFormatError, match=r"votes.jsonl:2: event must be one of"):
        read_votes(path)
    path.write_text(
        '{"node":1,"time":0,"life":1,"event":"grant","epoch":2,"voted_for":null,"leader":null}\n'
    )
    with pytest.raises(HistoryFormatError, match="must name the node voted for"):
        read_votes(path)
