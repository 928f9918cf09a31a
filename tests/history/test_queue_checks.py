"""The queue checks' reference (history.queue_checks): each check fires on a
history planted with its anomaly and stays quiet on the same history
corrected; simulated correct queues raise nothing, and one planted mutation
is caught by the check that names it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from history.ops import Op
from history.queue_checks import CHECKS, QueueResult, check_queue, final_from, pair_queue
from tests.history.queue_histories import Queue, SimLog

K = "0"


def fired(q: Queue, **kw: Any) -> set[str]:
    return {c for c in CHECKS if check_queue(q.ops, **kw).anomalies[c]}


def three_sent() -> Queue:
    """Values 1, 2, 3 sent ok to key 0 at offsets 0, 1, 2 by process 0."""
    q = Queue()
    q.send(0, [(K, 1, 0)])
    q.send(0, [(K, 2, 1)])
    q.send(0, [(K, 3, 2)])
    return q


def final_all(q: Queue, process: int, reads: dict[str, list[tuple[int, Any]]]) -> None:
    q.heal()
    q.assign(process, list(reads), seek=True)
    q.poll(process, reads)


def test_clean_history_is_valid() -> None:
    q = three_sent()
    q.poll(1, {K: [(0, 1), (1, 2)]})
    q.poll(1, {K: [(2, 3)]})
    final_all(q, 9, {K: [(0, 1), (1, 2), (2, 3)]})
    result = check_queue(q.ops)
    assert result.all() == []
    assert result.valid is True
    assert result.detail["final_from"] is not None


def test_inconsistent_offsets() -> None:
    for offset, expect in ((0, True), (1, False)):
        q = Queue()
        a = q.send(0, [(K, 1, 0)])
        b = q.send(1, [(K, 2, offset)])
        r = check_queue(q.ops, final_index=None)
        assert bool(r.anomalies["inconsistent-offsets"]) is expect
        if expect:
            (anomaly,) = r.anomalies["inconsistent-offsets"]
            assert (anomaly.key, anomaly.values, anomaly.offsets, anomaly.ops) == (
                K,
                (1, 2),
                (0,),
                (a, b),
            )
            assert "offset 0 holds 2 values" in anomaly.message


def test_duplicate() -> None:
    for second, expect in ((1, True), (2, False)):
        q = Queue()
        q.send(0, [(K, 1, 0)])
        q.send(0, [(K, 2, 1)])
        p = q.poll(1, {K: [(0, 1), (1, second)]})
        r = check_queue(q.ops, final_index=None)
        assert bool(r.anomalies["duplicate"]) is expect
        if expect:
            (anomaly,) = r.anomalies["duplicate"]
            assert (anomaly.values, anomaly.offsets) == ((1,), (0, 1))
            assert p in anomaly.ops


@pytest.mark.parametrize("outcome", ["fail", "info"])
def test_g1a_aborted_read(outcome: str) -> None:
    q = Queue()
    w = q.send(0, [(K, 5, None)], outcome)
    r = q.poll(1, {K: [(0, 5)]})
    result = check_queue(q.ops, final_index=None)
    if outcome == "fail":
        (anomaly,) = result.anomalies["G1a"]
        assert (anomaly.values, anomaly.offsets, anomaly.ops) == ((5,), (0,), (w, r))
        assert result.valid is False
    else:
        assert result.anomalies["G1a"] == ()


def test_lost_write() -> None:
    q = three_sent()
    q.poll(1, {K: [(0, 1)]})
    q.poll(2, {K: [(2, 3)]})
    (anomaly,) = check_queue(q.ops, final_index=None).anomalies["lost-write"]
    # three_sent's sends are ops 0, 2 and 4 (each an invoke and its completion).
    assert (anomaly.values, anomaly.offsets, anomaly.ops) == ((2,), (1, 2), (2,))
    q.poll(3, {K: [(1, 2)]})
    assert check_queue(q.ops, final_index=None).anomalies["lost-write"] == ()


def test_unseen() -> None:
    q = three_sent()
    q.poll(1, {K: [(0, 1), (1, 2)]})
    (anomaly,) = check_queue(q.ops, final_index=None).anomalies["unseen"]
    assert (anomaly.values, anomaly.offsets) == ((3,), (2,))
    q.poll(1, {K: [(2, 3)]})
    assert check_queue(q.ops, final_index=None).anomalies["unseen"] == ()


def test_poll_skip_and_its_correction() -> None:
    q = three_sent()
    a = q.poll(1, {K: [(0, 1)]})
    b = q.poll(1, {K: [(2, 3)]})
    r = check_queue(q.ops, final_index=None)
    (anomaly,) = r.anomalies["poll-skip"]
    assert (anomaly.values, anomaly.ops) == ((1, 3), (a, b))
    assert "skipping 1 record(s): 2" in anomaly.message
    q = three_sent()
    q.poll(1, {K: [(0, 1)]})
    q.poll(1, {K: [(1, 2), (2, 3)]})
    assert fired(q, final_index=None) == set()


def test_poll_skip_is_forgotten_by_an_assign_without_the_key() -> None:
    q = three_sent()
    q.poll(1, {K: [(0, 1)]})
    q.assign(1, ["other"])
    q.poll(1, {K: [(2, 3)]})
    q.poll(2, {K: [(1, 2)]})
    assert fired(q, final_index=None) == set()
    # An assign that names the key keeps the last read.
    q = three_sent()
    q.poll(1, {K: [(0, 1)]})
    q.assign(1, [K])
    q.poll(1, {K: [(2, 3)]})
    assert "poll-skip" in fired(q, final_index=None)


def test_an_assign_seeking_to_the_beginning_forgets_where_polls_ended() -> None:
    for seek in (True, False):
        q = three_sent()
        q.poll(1, {K: [(0, 1), (1, 2)]})
        q.assign(1, [K], seek=seek)
        q.poll(1, {K: [(0, 1), (1, 2), (2, 3)]})
        assert ("nonmonotonic-poll" in fired(q, final_index=None)) is not seek


def test_poll_skip_allowed_with_subscribe() -> None:
    q = three_sent()
    q.assign(1, [K], f="subscribe")
    q.poll(1, {K: [(0, 1)]})
    q.poll(1, {K: [(2, 3)]})
    q.poll(2, {K: [(1, 2)]})
    r = check_queue(q.ops, final_index=None)
    assert r.anomalies["poll-skip"]
    assert r.fired == []


def test_nonmonotonic_poll() -> None:
    q = three_sent()
    a = q.poll(1, {K: [(0, 1), (1, 2)]})
    b = q.poll(1, {K: [(1, 2)]})
    (anomaly,) = check_queue(q.ops, final_index=None).anomalies["nonmonotonic-poll"]
    assert (anomaly.values, anomaly.ops) == ((2, 2), (a, b))
    q = three_sent()
    q.poll(1, {K: [(0, 1), (1, 2)]})
    q.poll(1, {K: [(2, 3)]})
    assert fired(q, final_index=None) == set()
    # Only ok polls move "last read": a failed poll in between changes nothing.
    q = three_sent()
    q.poll(1, {K: [(0, 1)]})
    q.poll(1, {}, "fail")
    q.poll(1, {K: [(1, 2), (2, 3)]})
    assert fired(q, final_index=None) == set()


def test_int_poll_skip_and_nonmonotonic() -> None:
    q = three_sent()
    p = q.poll(1, {K: [(0, 1), (2, 3)]})
    r = check_queue(q.ops, final_index=None)
    (anomaly,) = r.anomalies["int-poll-skip"]
    assert (anomaly.values, anomaly.ops) == ((1, 3), (p,))
    q = three_sent()
    q.poll(1, {K: [(1, 2), (0, 1)]})
    assert "int-nonmonotonic-poll" in fired(q, final_index=None)
    q = three_sent()
    q.poll(1, {K: [(0, 1), (1, 2), (2, 3)]})
    assert fired(q, final_index=None) == set()


def test_nonmonotonic_send() -> None:
    q = Queue()
    a = q.send(0, [(K, 2, 1)])
    b = q.send(0, [(K, 1, 0)])
    q.poll(1, {K: [(0, 1), (1, 2)]})
    (anomaly,) = check_queue(q.ops, final_index=None).anomalies["nonmonotonic-send"]
    assert (anomaly.values, anomaly.ops) == ((2, 1), (a, b))
    q = Queue()
    q.send(0, [(K, 1, 0)])
    q.send(0, [(K, 2, 1)])
    q.poll(1, {K: [(0, 1), (1, 2)]})
    assert fired(q, final_index=None) == set()


def test_int_sends() -> None:
    q = Queue()
    op = q.send(0, [(K, 2, 1), (K, 1, 0)])
    q.poll(1, {K: [(0, 1), (1, 2)]})
    (anomaly,) = check_queue(q.ops, final_index=None).anomalies["int-nonmonotonic-send"]
    assert (anomaly.values, anomaly.ops) == ((2, 1), (op,))
    # A skip inside one send is normal (another producer's record between):
    # reported, allowed.
    q = Queue()
    q.send(0, [(K, 1, 0), (K, 3, 2)])
    q.send(1, [(K, 2, 1)])
    q.poll(2, {K: [(0, 1), (1, 2), (2, 3)]})
    r = check_queue(q.ops, final_index=None)
    assert r.anomalies["int-send-skip"]
    assert r.fired == []


def test_no_loss_ok_send_missing_from_final_reads() -> None:
    q = three_sent()
    q.poll(1, {K: [(0, 1), (1, 2), (2, 3)]})
    final_all(q, 9, {K: [(0, 1), (1, 2)]})
    r = check_queue(q.ops)
    # Jepsen's checks are content: every value was read by some ok poll.
    assert r.fired == ["no-loss"]
    (anomaly,) = r.anomalies["no-loss"]
    assert (anomaly.values, anomaly.offsets, anomaly.ops) == ((3,), (2,), (4,))
    assert "offset 2 was not read" in anomaly.message


def test_no_loss_other_value_at_the_offset() -> None:
    q = three_sent()
    final_all(q, 9, {K: [(0, 1), (1, 2), (2, 4)]})
    (anomaly,) = check_queue(q.ops).anomalies["no-loss"]
    assert "offset 2 holds 4" in anomaly.message


def test_no_loss_info_send_seen_by_a_poll() -> None:
    q = Queue()
    q.send(0, [(K, 1, 0)])
    info = q.send(1, [(K, 2, None)], "info")
    q.poll(2, {K: [(0, 1), (1, 2)]})
    final_all(q, 9, {K: [(0, 1)]})
    r = check_queue(q.ops)
    (anomaly,) = r.anomalies["no-loss"]
    assert (anomaly.values, anomaly.ops) == ((2,), (info,))
    # The same info send seen by nobody may never have happened.
    q = Queue()
    q.send(0, [(K, 1, 0)])
    q.send(1, [(K, 2, None)], "info")
    final_all(q, 9, {K: [(0, 1)]})
    assert check_queue(q.ops).valid is True


def test_no_loss_info_send_record_acked_with_its_offset() -> None:
    # An info send whose record came back with an offset: that record was
    # acknowledged on its own, and must be in the final reads.
    for final, expect in (([(0, 1)], True), ([(0, 1), (1, 2)], False)):
        q = Queue()
        q.send(0, [(K, 1, 0)])
        q.send(1, [(K, 2, 1), (K, 3, None)], "info", acked=True)
        final_all(q, 9, {K: final})
        r = check_queue(q.ops)
        assert bool(r.anomalies["no-loss"]) is expect
        assert 3 not in {a.values[0] for a in r.anomalies["no-loss"]}


def test_no_final_reads_leaves_no_loss_unknown() -> None:
    q = three_sent()
    q.poll(1, {K: [(0, 1), (1, 2), (2, 3)]})
    q.heal()  # the nemesis acts after the last poll: no final section
    r = check_queue(q.ops)
    assert r.detail["final_from"] is None
    assert r.valid == "unknown"


def test_final_from_is_the_trailing_final_section() -> None:
    q = three_sent()
    q.poll(1, {K: [(0, 1)]})
    q.heal()
    crash = q.crash(2)
    q.assign(7, [K])
    q.poll(7, {K: [(0, 1), (1, 2), (2, 3)]})
    assert final_from(pair_queue(q.ops), q.ops) == crash


def test_bad_value_is_named() -> None:
    q = Queue()
    q.rec.invoke(0, "poll", value=[["poll"]])
    q.rec.ok(0, value=[["poll", {K: [5]}]])
    with pytest.raises(ValueError, match=r"op 0: a polled record is \[offset, v\], got 5"):
        check_queue(q.ops)


# -- simulated correct queues, and one mutation ------------------------------------

steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("send"),
            st.integers(0, 2),
            st.sampled_from(["0", "1", "2"]),
            st.sampled_from(["ok", "ok", "ok", "fail", "info"]),
            st.booleans(),
        ),
        st.tuples(
            st.just("poll"),
            st.integers(0, 2),
            st.dictionaries(st.sampled_from(["0", "1", "2"]), st.integers(0, 3)),
        ),
        st.tuples(st.just("crash"), st.integers(0, 2)),
    ),
    min_size=1,
    max_size=40,
)


def simulate(plan: list[tuple[Any, ...]]) -> SimLog:
    sim = SimLog()
    for step in plan:
        if step[0] == "send":
            sim.step_send(step[1], step[2], step[3], step[4])
        elif step[0] == "poll":
            sim.step_poll(step[1], step[2])
        else:
            sim.step_crash(step[1])
    sim.final_reads()
    return sim


def check(ops: list[Op]) -> QueueResult:
    return check_queue(ops)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_simulated_correct_queue_is_valid(plan: list[tuple[Any, ...]]) -> None:
    sim = simulate(plan)
    r = check(sim.q.ops)
    assert r.all() == [], [a.message for a in r.all()]
    assert r.valid is True


def _polls_with(ops: list[Op], least: int) -> list[int]:
    """Positions of ok poll completions holding a key with at least ``least`` records."""
    out = []
    for i, op in enumerate(ops):
        if op.f == "poll" and op.type == "ok":
            reads = op.value[0][1]
            if any(len(rs) >= least for rs in reads.values()):
                out.append(i)
    return out


def _mutate_poll(ops: list[Op], at: int, change: Any) -> list[Op]:
    op = ops[at]
    reads = {k: [list(r) for r in rs] for k, rs in op.value[0][1].items()}
    key = next(k for k, rs in sorted(reads.items()) if len(rs) >= 2)
    reads[key] = change(reads[key])
    out = list(ops)
    out[at] = dataclasses.replace(op, value=[["poll", reads]])
    return out


MUTATIONS = {
    # A record missing from every final read.
    "drop": ("no-loss", None),
    # A record's value read again at the next offset.
    "duplicate": ("duplicate", lambda rs: [rs[0], [rs[1][0], rs[0][1]], *rs[2:]]),
    # Two records read out of order.
    "reorder": ("int-nonmonotonic-poll", lambda rs: [rs[1], rs[0], *rs[2:]]),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=steps)
def test_one_mutation_is_caught_by_its_check(mutation: str, plan: list[tuple[Any, ...]]) -> None:
    sim = simulate(plan)
    ops = sim.q.ops
    polls = _polls_with(ops, 2)
    if not polls:
        return
    check_name, change = MUTATIONS[mutation]
    if mutation == "drop":
        # Lost from the log: every final read (the polls after the heal) lacks
        # the key's last record, one an ok send wrote.
        heal = max(i for i, op in enumerate(ops) if op.process == "nemesis")
        key = min(k for k, log in sim.logs.items() if len(log) >= 2)
        acked = {
            (op.value[0][1], op.value[0][2][1]) for op in ops if op.f == "send" and op.type == "ok"
        }
        if (key, sim.logs[key][-1]) not in acked:
            return
        out = list(ops)
        for i in range(heal, len(ops)):
            op = out[i]
            if op.f == "poll" and op.type == "ok" and key in op.value[0][1]:
                reads = dict(op.value[0][1])
                reads[key] = reads[key][:-1]
                out[i] = dataclasses.replace(op, value=[["poll", reads]])
    else:
        out = _mutate_poll(ops, polls[-1], change)
    assert check_name in check(out).fired


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=steps)
def test_a_changed_offset_is_caught(plan: list[tuple[Any, ...]]) -> None:
    sim = simulate(plan)
    ops = sim.q.ops
    sends = [
        i
        for i, op in enumerate(ops)
        if op.f == "send" and op.type == "ok" and op.value[0][2][0] > 0
    ]
    if not sends:
        return
    op = ops[sends[-1]]
    _, k, (offset, v) = op.value[0]
    out = list(ops)
    out[sends[-1]] = dataclasses.replace(op, value=[["send", k, [offset - 1, v]]])
    assert "inconsistent-offsets" in check(out).fired


def test_the_history_formats_queue_example_is_valid() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "history-format.md").read_text()
    [body] = re.findall(r"<!-- example: history queue -->\n```jsonl\n(.*?)```", doc, re.DOTALL)
    ops = [Op.from_json(json.loads(line)) for line in body.splitlines()]
    r = check_queue(ops)
    assert r.all() == [] and r.valid is True
    # The final reads start at the crash before the final assign.
    assert r.detail["final_from"] == 10
    # Had the final poll missed value 2 (sent ok, polled at op 4), no-loss says so;
    # had it missed value 4 (an info send that only it saw), nothing says 4 was written.
    last = ops[-1]
    ops[-1] = dataclasses.replace(last, value=[["poll", {"0": [[0, 1], [1, 4]]}]])
    assert check_queue(ops).fired == ["no-loss"]
    ops[-1] = dataclasses.replace(last, value=[["poll", {"0": [[0, 1]], "1": [[0, 2]]}]])
    assert check_queue(ops).fired == []


def test_final_index_given_by_the_summary() -> None:
    q = three_sent()
    start = q.poll(1, {K: [(0, 1), (1, 2)]})
    q.heal()  # a fault after the poll: no trailing final section to find
    inferred = check_queue(q.ops)
    assert inferred.fired == ["unseen"] and inferred.detail["final_from"] is None
    # The run's summary says the final polls start at that poll: offset 2 is missing.
    r = check_queue(q.ops, final_index=start)
    assert r.fired == ["unseen", "no-loss"]
    assert r.detail["final_from"] == start
