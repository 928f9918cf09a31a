"""Transactions in a queue history: the ``txn`` op's shapes and
well-formedness, what the existing checks take from it, and the checks that
only transactions raise (precommitted-read, Elle's cycles, torn-transaction),
each firing on a crafted history and quiet on its correction; simulated
correct transactional queues raise nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from history.ops import Op, check_well_formed
from history.queue import isolation_level, txn_completion_value, txn_invoke_value
from history.queue_checks import CHECKS, QueueResult, check_queue
from history.queue_cycles import Edge, find_cycles, strongly_connected
from tests.history.queue_histories import Queue, SimLog

RC = "read_committed"


def problems(q: Queue) -> list[tuple[str, str]]:
    return [(p.kind, p.message) for p in check_well_formed(q.ops, model="queue")]


def fired(result: QueueResult) -> set[str]:
    return {c for c in CHECKS if result.anomalies[c]}


def final_all(q: Queue, process: int, reads: dict[str, list[tuple[int, Any]]]) -> None:
    q.heal()
    q.assign(process, list(reads), seek=True)
    q.poll(process, reads)


# -- the op ------------------------------------------------------------------------


def test_txn_values_are_built_as_the_format_says() -> None:
    mops = [("send", 0, 5), ("poll",), ("send", 1, 6)]
    assert txn_invoke_value(mops) == [["send", 0, 5], ["poll"], ["send", 1, 6]]
    assert txn_completion_value(mops, {0: 3}, {1: {1: [(0, 2)]}}) == [
        ["send", 0, [3, 5]],
        ["poll", {"1": [[0, 2]]}],
        ["send", 1, [None, 6]],
    ]


def test_well_formed_txns_of_every_outcome() -> None:
    q = Queue()
    # (Sends name integer keys, polls their decimal text.)
    q.txn(0, [("send", 0, 1, 0), ("poll", {"1": [(0, 7)]}), ("send", 1, 2, 1)])
    q.txn(1, [("send", 0, 3, None), ("poll", {})], "fail")
    q.txn(2, [("send", 0, 4, None), ("poll", {})], "fail", acked=True)
    q.txn(3, [("poll", {"0": [(0, 1)]}), ("send", 0, 5, 4)], "info", acked=True)
    q.txn(4, [("send", 0, 6, 5)], "info")
    assert problems(q) == []


@pytest.mark.parametrize(
    ("invoke", "completion", "kind", "says"),
    [
        ([], None, "model-value", "non-empty list of send and poll"),
        ([["read", 0]], None, "model-value", 'a txn micro-op is ["send", key, value]'),
        ([["send", "0", 1]], None, "model-value", "a queue key is an integer"),
        ([["send", 0, "x"]], None, "model-value", "a sent value is an integer"),
        ([["poll", {}]], None, "model-value", 'invoke polls with ["poll"]'),
        ([["poll"]], ("ok", [["poll"]]), "model-value", "an ok txn's poll micro-op"),
        ([["send", 0, 1]], ("ok", [["send", 0, 1]]), "model-value", "[offset, value]"),
        (
            [["send", 0, 1]],
            ("fail", [["send", 0, [3, 1]]]),
            "model-version",
            "aborted transaction's records",
        ),
        (
            [["send", 0, 1], ["poll"]],
            ("ok", [["poll", {}], ["send", 0, [0, 1]]]),
            "model-value",
            "names its invoke's micro-ops in order",
        ),
        (
            [["send", 0, 1]],
            ("ok", [["send", 0, [0, 2]]]),
            "model-value",
            "names its invoke's micro-ops in order",
        ),
        ([["poll"]], ("ok", [["poll", {"0": [[1, 1], [0, 2]]}]]), "model-value", "ascend"),
    ],
)
def test_a_malformed_txn_is_named(
    invoke: Any, completion: tuple[str, Any] | None, kind: str, says: str
) -> None:
    q = Queue()
    q.rec.invoke(0, "txn", value=invoke)
    if completion is None:
        q.rec.info(0, "timeout")
    elif completion[0] == "ok":
        q.rec.ok(0, value=completion[1])
    else:
        q.rec.fail(0, "timeout", value=completion[1])
    found = problems(q)
    assert any(k == kind and says in m for k, m in found), found


def test_a_value_sent_by_a_send_and_a_txn_is_a_duplicate() -> None:
    q = Queue()
    q.send(0, [(0, 1, 0)])
    q.txn(1, [("send", 0, 1, 1)])
    assert [k for k, _ in problems(q)] == ["duplicate-value"]


def test_isolation_level_of_a_run() -> None:
    assert isolation_level({}) == "read_uncommitted"
    assert isolation_level({"queue": {"topics": []}}) == "read_uncommitted"
    assert isolation_level({"queue": {"isolation_level": RC}}) == RC
    with pytest.raises(ValueError, match="queue.isolation_level is one of"):
        isolation_level({"queue": {"isolation_level": "serializable"}})
    with pytest.raises(ValueError, match="isolation is read_uncommitted or read_committed"):
        check_queue([], isolation="snapshot")


def test_the_history_formats_txn_example() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "history-format.md").read_text()
    [body] = re.findall(r"<!-- txn example: history queue -->\n```jsonl\n(.*?)```", doc, re.DOTALL)
    ops = [Op.from_json(json.loads(line)) for line in body.splitlines()]
    assert check_well_formed(ops, model="queue") == []
    result = check_queue(ops, isolation=RC)
    assert result.valid is True, [a.message for a in result.all()]
    assert result.detail["transactions"] == 3


# -- the existing checks -------------------------------------------------------------


def test_a_failed_txns_value_read_is_g1a_under_read_committed_only() -> None:
    q = Queue()
    t = q.txn(0, [("send", "0", 1, None)], "fail")
    r = q.poll(1, {"0": [(0, 1)]})
    g1a = check_queue(q.ops, final_index=None, isolation=RC).anomalies["G1a"]
    assert [(a.values, a.ops) for a in g1a] == [((1,), (t, r))]
    assert check_queue(q.ops, final_index=None).anomalies["G1a"] == ()
    # A failed plain send is G1a whatever the isolation.
    q2 = Queue()
    q2.send(0, [("0", 1, None)], "fail")
    q2.poll(1, {"0": [(0, 1)]})
    assert check_queue(q2.ops, final_index=None).anomalies["G1a"] != ()


def test_reads_of_ok_and_info_txns_are_fine_read_committed() -> None:
    q = Queue()
    q.txn(0, [("send", "0", 1, 0)])
    q.txn(1, [("send", "0", 2, 1)], "info")
    q.poll(2, {"0": [(0, 1), (1, 2)]})
    final_all(q, 9, {"0": [(0, 1), (1, 2)]})
    result = check_queue(q.ops, isolation=RC)
    assert result.all() == [], [a.message for a in result.all()]


def test_a_txns_sends_and_polls_count_as_sends_and_polls() -> None:
    q = Queue()
    q.txn(0, [("send", "0", 1, 0), ("send", "0", 2, 1), ("send", "0", 3, 2)])
    # A txn polling twice: 1 then 3 across its two polls skips 2.
    q.txn(1, [("poll", {"0": [(0, 1)]}), ("poll", {"0": [(2, 3)]})])
    result = check_queue(q.ops, final_index=None, isolation=RC)
    assert [a.values for a in result.anomalies["int-poll-skip"]] == [(1, 3)]
    # 2, sent by an ok txn, never read: lost-write and unseen.
    assert {"int-poll-skip", "lost-write", "unseen"} == fired(result)


def test_an_info_txn_read_by_an_ok_op_must_have_committed() -> None:
    def history(read_it: bool) -> tuple[Queue, int]:
        q = Queue()
        t = q.txn(0, [("send", "0", 1, 0), ("send", "1", 2, 0)], "info", acked=True)
        if read_it:
            q.poll(1, {"1": [(0, 2)]})
        q.send(2, [("0", 3, 1)])
        q.poll(1, {"0": [(1, 3)]})
        return q, t

    q, t = history(True)
    lost = check_queue(q.ops, final_index=None, isolation=RC).anomalies["lost-write"]
    assert [(a.values, a.ops) for a in lost] == [((1,), (t,))]
    # Never read by an ok op: it may have aborted, and its records are not required.
    q, _ = history(False)
    assert check_queue(q.ops, final_index=None, isolation=RC).anomalies["lost-write"] == ()


def test_no_loss_holds_committed_transactions_to_the_final_reads() -> None:
    q = Queue()
    ok = q.txn(0, [("send", "0", 1, 0), ("send", "1", 2, 0)])
    q.txn(1, [("send", "0", 3, 1)], "info", acked=True)  # may have aborted
    seen = q.txn(2, [("send", "0", 4, 3), ("send", "1", 5, None)], "info", acked=True)
    q.poll(4, {"0": [(3, 4)]})
    final_all(q, 9, {"0": [(0, 1), (3, 4)], "1": [(0, 2), (1, 5)]})
    assert check_queue(q.ops, isolation=RC).anomalies["no-loss"] == ()
    # The ok txn's record of key 1 and the seen txn's of key 1 are gone.
    q2 = Queue()
    ok = q2.txn(0, [("send", "0", 1, 0), ("send", "1", 2, 0)])
    seen = q2.txn(2, [("send", "0", 4, 3), ("send", "1", 5, None)], "info", acked=True)
    q2.poll(4, {"0": [(3, 4)]})
    final_all(q2, 9, {"0": [(0, 1), (3, 4)], "1": []})
    no_loss = check_queue(q2.ops, isolation=RC).anomalies["no-loss"]
    assert sorted((a.values, a.ops) for a in no_loss) == [((2,), (ok,)), ((5,), (seen,))]


# -- precommitted-read -------------------------------------------------------------


def test_precommitted_read() -> None:
    q = Queue()
    t = q.txn(0, [("send", "0", 1, 0), ("poll", {"0": [(0, 1)]})])
    q.txn(1, [("send", "0", 2, 1), ("poll", {"0": [(0, 1)]})])  # another's: fine
    rc = check_queue(q.ops, final_index=None, isolation=RC)
    [a] = rc.anomalies["precommitted-read"]
    assert (a.key, a.values, a.offsets, a.ops) == ("0", (1,), (0,), (t,))
    assert "precommitted-read" in rc.fired
    ru = check_queue(q.ops, final_index=None)
    assert ru.anomalies["precommitted-read"] and "precommitted-read" not in ru.fired


# -- Elle's cycles ---------------------------------------------------------------------


def test_g0_write_cycle_is_allowed() -> None:
    q = Queue()
    t1 = q.txn(0, [("send", "0", 1, 0), ("send", "1", 4, 1)])
    t2 = q.txn(1, [("send", "0", 2, 1), ("send", "1", 3, 0)])
    result = check_queue(q.ops, final_index=None, isolation=RC)
    [g0] = result.anomalies["G0"]
    assert g0.ops == (t1, t2) and g0.key == "0,1"
    assert g0.values == (
        {"from": t1, "to": t2, "type": "ww", "key": "0", "values": [1, 2]},
        {"from": t2, "to": t1, "type": "ww", "key": "1", "values": [3, 4]},
    )
    assert "G0" not in result.fired


def test_g1c_read_cycle_is_never_allowed_read_committed() -> None:
    q = Queue()
    # Each polls the other's value: each saw the other commit first.
    t1 = q.txn(0, [("send", "0", 1, 0), ("poll", {"1": [(0, 2)]})])
    t2 = q.txn(1, [("send", "1", 2, 0), ("poll", {"0": [(0, 1)]})])
    result = check_queue(q.ops, final_index=None, isolation=RC)
    [g1c] = result.anomalies["G1c"]
    assert g1c.ops == (t1, t2)
    assert [e["type"] for e in g1c.values] == ["wr", "wr"]
    assert result.anomalies["G1c-ww"] == () and "G1c" in result.fired
    # Reading uncommitted records, each may see the other's before it commits.
    assert "G1c" not in check_queue(q.ops, final_index=None).fired


def test_g1c_needing_a_ww_edge_is_allowed() -> None:
    q = Queue()
    # t1's 1 lands before t2's 2 in key 0 (ww t1 -> t2); t1 polled t2's 3 (wr t2 -> t1).
    t1 = q.txn(0, [("send", "0", 1, 0), ("poll", {"1": [(0, 3)]})])
    t2 = q.txn(1, [("send", "0", 2, 1), ("send", "1", 3, 0)])
    result = check_queue(q.ops, final_index=None, isolation=RC)
    [c] = result.anomalies["G1c-ww"]
    assert c.ops == (t2, t1)
    assert [(e["type"], e["from"], e["to"]) for e in c.values] == [("wr", t2, t1), ("ww", t1, t2)]
    assert result.anomalies["G0"] == () and result.anomalies["G1c"] == ()
    assert "G1c-ww" not in result.fired


def test_no_cycle_in_order() -> None:
    q = Queue()
    q.txn(0, [("send", "0", 1, 0), ("send", "1", 2, 0)])
    q.txn(1, [("poll", {"0": [(0, 1)]}), ("send", "0", 3, 1), ("send", "1", 4, 1)])
    result = check_queue(q.ops, final_index=None, isolation=RC)
    assert fired(result) & {"G0", "G1c-ww", "G1c"} == set()
    assert result.detail["edges"] == 3


def test_the_cycle_search_finds_shortest_cycles_and_components() -> None:
    e = [
        Edge("ww", "0", ("1", "2"), 1, 2),
        Edge("ww", "0", ("2", "3"), 2, 3),
        Edge("ww", "0", ("3", "4"), 3, 1),
        Edge("ww", "1", ("5", "6"), 3, 2),
        Edge("wr", "2", ("7",), 5, 6),
        Edge("wr", "2", ("8",), 6, 5),
        Edge("wr", "2", ("9",), 7, 8),
    ]
    assert strongly_connected({1: {2: e[0]}, 2: {1: e[0]}, 3: {}}) == [[1, 2]]
    cycles = find_cycles(e)
    assert [(c.check, c.ops) for c in cycles] == [("G0", (1, 2, 3)), ("G1c", (5, 6))]
    # A long chain: no recursion limit.
    chain = [Edge("ww", "0", (str(i), str(i + 1)), i, i + 1) for i in range(5000)]
    chain.append(Edge("wr", "1", ("x",), 5000, 0))
    [c] = find_cycles(chain)
    assert c.check == "G1c-ww" and len(c.ops) == 5001 and c.ops[0] == 5000


# -- torn-transaction ----------------------------------------------------------------


def torn_history(final_1: list[tuple[int, Any]]) -> tuple[Queue, int]:
    q = Queue()
    t = q.txn(0, [("send", "0", 1, 0), ("send", "1", 2, 0), ("send", "1", 3, 1)])
    final_all(q, 9, {"0": [(0, 1)], "1": final_1})
    return q, t


def test_torn_transaction() -> None:
    q, t = torn_history([(1, 3)])
    result = check_queue(q.ops, isolation=RC)
    [a] = result.anomalies["torn-transaction"]
    assert a.ops == (t,) and a.key == "0,1"
    assert a.values == (
        {"key": "0", "present": True, "value": 1},
        {"key": "1", "present": False, "value": 2},
        {"key": "1", "present": True, "value": 3},
    )
    assert "torn-transaction" in result.fired
    # Whole: quiet.  Not judged reading uncommitted records.
    whole, _ = torn_history([(0, 2), (1, 3)])
    assert check_queue(whole.ops, isolation=RC).all() == []
    assert check_queue(q.ops).anomalies["torn-transaction"] == ()


def test_a_torn_transaction_needs_final_reads_that_reached_its_records() -> None:
    q = Queue()
    q.send(5, [("1", 7, 0)])
    q.txn(0, [("send", "0", 1, 0), ("send", "1", 2, 5)], "info", acked=True)
    q.poll(3, {"0": [(0, 1)]})
    # The final reads stop below offset 5 of key 1: not reached, not torn.
    final_all(q, 9, {"0": [(0, 1)], "1": [(0, 7)]})
    result = check_queue(q.ops, isolation=RC)
    assert result.anomalies["torn-transaction"] == ()
    assert [a.values for a in result.anomalies["no-loss"]] == [(2,)]


# -- simulated correct transactional queues --------------------------------------------

_keys = st.sampled_from(["0", "1", "2"])
txn_steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("txn"),
            st.integers(0, 2),
            st.lists(
                st.one_of(
                    st.tuples(st.just("send"), _keys),
                    st.tuples(st.just("poll"), st.dictionaries(_keys, st.integers(0, 3))),
                ),
                min_size=1,
                max_size=4,
            ),
            st.sampled_from(["ok", "ok", "ok", "fail", "info"]),
            st.booleans(),
        ),
        st.tuples(
            st.just("send"),
            st.integers(0, 2),
            _keys,
            st.sampled_from(["ok", "ok", "fail", "info"]),
            st.booleans(),
        ),
        st.tuples(st.just("poll"), st.integers(0, 2), st.dictionaries(_keys, st.integers(0, 3))),
    ),
    min_size=1,
    max_size=30,
)


def simulate_txns(plan: list[tuple[Any, ...]]) -> SimLog:
    sim = SimLog()
    for step in plan:
        if step[0] == "txn":
            sim.step_txn(step[1], step[2], step[3], step[4])
        elif step[0] == "send":
            sim.step_send(step[1], step[2], step[3], step[4])
        else:
            sim.step_poll(step[1], step[2])
    sim.final_reads()
    return sim


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(txn_steps)
def test_simulated_correct_transactional_queue_is_valid(plan: list[tuple[Any, ...]]) -> None:
    ops = simulate_txns(plan).q.ops
    r = check_queue(ops, isolation=RC)
    assert r.all() == [], [a.message for a in r.all()]
    assert r.valid is True
