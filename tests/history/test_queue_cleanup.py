"""The queue checks on topics with retention or compaction
(history.queue_checks.Cleanup): a record legitimately gone (below the log
start the final reads saw; superseded by a later record of its record key
that the final reads returned) counts as neither lost nor unseen, and a
poll may skip it; a record missing above the log start, the latest record
of a record key, or a kept record at another offset still fires."""

from __future__ import annotations

from typing import Any

import pytest

from history.queue_checks import CHECKS, NO_CLEANUP, Cleanup, check_queue
from tests.history.queue_histories import Queue

K = "0"


def fired(q: Queue, cleanup: Cleanup = NO_CLEANUP, **kw: Any) -> set[str]:
    return {c for c in CHECKS if check_queue(q.ops, cleanup=cleanup, **kw).anomalies[c]}


def five_sent() -> Queue:
    """Values 1..5 sent ok to key 0 at offsets 0..4."""
    q = Queue()
    for v in range(1, 6):
        q.send(0, [(K, v, v - 1)])
    return q


def final_reads(q: Queue, reads: dict[str, list[tuple[int, Any]]]) -> None:
    q.heal()
    q.assign(9, list(reads), seek=True)
    q.poll(9, reads)


def retained() -> Queue:
    """A consumer read 1, fell behind retention and went on at 4; the final
    reads start at the log start, offset 3."""
    q = five_sent()
    q.poll(1, {K: [(0, 1)]})
    q.poll(1, {K: [(3, 4)]})
    final_reads(q, {K: [(3, 4), (4, 5)]})
    return q


def test_records_below_the_log_start_are_gone_not_lost() -> None:
    q = retained()
    # On a plain topic the same history loses 2 and 3.
    assert fired(q) == {"lost-write", "unseen", "poll-skip", "no-loss"}
    assert fired(q, Cleanup(log_start={K: 3})) == set()


def test_a_record_missing_above_the_log_start_is_still_lost() -> None:
    q = five_sent()
    q.poll(1, {K: [(0, 1)]})
    q.poll(1, {K: [(3, 4)]})
    final_reads(q, {K: [(3, 4)]})
    r = check_queue(q.ops, cleanup=Cleanup(log_start={K: 3}))
    assert r.fired == ["unseen", "no-loss"]
    assert [a.values for a in r.anomalies["no-loss"]] == [(5,)]
    # A log start that another key saw exempts nothing here.
    assert "no-loss" in fired(retained(), Cleanup(log_start={"1": 3}))


def test_a_skip_over_a_record_above_the_log_start_is_still_a_poll_skip() -> None:
    q = retained()
    r = check_queue(q.ops, cleanup=Cleanup(log_start={K: 2}))
    (skip,) = r.anomalies["poll-skip"]
    assert skip.values == (1, 4) and skip.message.endswith("record(s): 3")
    assert {a.values for a in r.anomalies["no-loss"]} == {(3,)}


def compacted(final: list[tuple[int, Any]]) -> Queue:
    """Values 1..4 at offsets 0..3, record keys v mod 2: 3 supersedes 1 and 4
    supersedes 2. A consumer read 1 then 3 and 4 (the cleaner ran between)."""
    q = Queue()
    for v in range(1, 5):
        q.send(0, [(K, v, v - 1)])
    q.poll(1, {K: [(0, 1)]})
    q.poll(1, {K: [(2, 3), (3, 4)]})
    final_reads(q, {K: final})
    return q


def test_records_superseded_under_compaction_are_gone_not_lost() -> None:
    q = compacted([(2, 3), (3, 4)])
    assert fired(q) == {"lost-write", "unseen", "poll-skip", "no-loss"}
    assert fired(q, Cleanup(record_keys=2)) == set()
    # Without record keys of their own every record of a partition shares
    # the key's: only the last one stays.
    q = compacted([(3, 4)])
    assert fired(q, Cleanup(record_keys=0)) == set()
    assert "no-loss" in fired(q, Cleanup(record_keys=2))


def test_the_latest_record_of_a_record_key_is_never_gone() -> None:
    q = compacted([(3, 4)])
    r = check_queue(q.ops, cleanup=Cleanup(record_keys=2))
    # 3 is the latest of record key 1 and 1 is superseded by nothing read.
    assert {a.values for a in r.anomalies["no-loss"]} == {(1,), (3,)}


def test_a_skip_over_the_latest_record_of_a_record_key_fires() -> None:
    q = Queue()
    for v in range(1, 5):
        q.send(0, [(K, v, v - 1)])
    q.poll(1, {K: [(0, 1)]})
    q.poll(1, {K: [(3, 4)]})
    final_reads(q, {K: [(2, 3), (3, 4)]})
    (skip,) = check_queue(q.ops, cleanup=Cleanup(record_keys=2)).anomalies["poll-skip"]
    # 2 is superseded by 4; 3, the latest of its record key, was in the log.
    assert skip.values == (1, 4) and skip.message.endswith("record(s): 3")


def test_a_kept_record_at_another_offset_fires_under_compaction() -> None:
    # B16's shape: the cleaner gave the kept records 3 and 4 new offsets.
    q = compacted([(0, 3), (1, 4)])
    r = check_queue(q.ops, cleanup=Cleanup(record_keys=2))
    assert {"inconsistent-offsets", "duplicate", "no-loss"} <= set(r.fired)
    assert {a.values for a in r.anomalies["no-loss"]} >= {(3,), (4,)}


def test_superseded_needs_the_final_reads() -> None:
    q = compacted([(2, 3), (3, 4)])
    # No final reads: nothing is known superseded.
    assert "unseen" in fired(q, Cleanup(record_keys=2), final_index=None)


def test_cleanup_of_a_run() -> None:
    summary = {"final_polls": {"from_index": 3, "log_start": {"0": 7, "1": 0}}}
    plain = {"queue": {"min_isr": 2}}
    assert Cleanup.of_run(plain, summary) == NO_CLEANUP
    assert Cleanup.of_run({}, {}) == NO_CLEANUP
    # A policy that deletes without a limit of the run's keeps everything.
    kept = {"queue": {"cleanup_policy": "delete", "retention_ms": None}}
    assert Cleanup.of_run(kept, summary) == NO_CLEANUP
    retention = {"queue": {"cleanup_policy": "delete", "retention_ms": 2000, "record_keys": 3}}
    assert Cleanup.of_run(retention, summary) == Cleanup({"0": 7, "1": 0}, None)
    both = {"queue": {"cleanup_policy": "compact,delete", "retention_bytes": 0, "record_keys": 3}}
    assert Cleanup.of_run(both, summary) == Cleanup({"0": 7, "1": 0}, 3)
    compact = {"queue": {"cleanup_policy": "compact", "retention_ms": 5, "record_keys": 3}}
    assert Cleanup.of_run(compact, summary) == Cleanup({}, 3)
    with pytest.raises(ValueError, match=r"log_start\['0'\] is an offset"):
        Cleanup.of_run(retention, {"final_polls": {"log_start": {"0": -2}}})
    with pytest.raises(ValueError, match="record_keys is an integer"):
        Cleanup.of_run({"queue": {"cleanup_policy": "compact", "record_keys": "x"}}, {})
