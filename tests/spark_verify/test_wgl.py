"""Known answers of the per-key linearizability checker and the aborted-reads check."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import pytest

from spark_verify.ops import KEYS_COLUMNS, CheckOp
from spark_verify.wgl import (
    KeyResult,
    check_key,
    find_aborted_reads,
    keys_row_to_anomaly,
    validity_of_keys_row,
)
from tests.spark_verify.histories import History


def indexes(result: KeyResult) -> list[int]:
    return [op.index for op in result.witness]


def test_no_ops_and_sequential_ops() -> None:
    assert check_key([], "register").valid is True
    h = History()
    h.write(0, "a", 0, 10)
    h.read(1, "a", 20, 30)
    h.cas(0, "a", "b", 40, 50)
    h.read(1, "b", 60, 70)
    result = check_key(h.ops, "register")
    assert result.valid is True and result.kind is None and result.witness == ()
    assert result.ops == 4 and result.states >= 4


def test_stale_read_has_a_minimal_witness_and_a_message_naming_the_read() -> None:
    h = History()
    a = h.write(0, "a", 0, 10)
    b = h.write(1, "b", 20, 30)
    h.read(3, "b", 31, 33)  # unrelated to the violation: shrunk away
    h.read(4, "b", 32, 60)
    h.write(5, "c", 45, 65)
    r = h.read(2, "a", 40, 50)
    result = check_key(h.ops, "register")
    assert result.valid is False and result.kind == "nonlinearizable"
    assert indexes(result) == [a.index, b.index, r.index] and result.minimal
    assert result.message == (
        "read of 'a' by process 2 [40, 50]: no order of the ops overlapping it leaves 'a' in "
        "the register (a minimal witness of 3 ops)"
    )


@pytest.mark.parametrize("seen", ["a", "b"])
def test_a_read_concurrent_with_a_write_may_see_either_value(seen: str) -> None:
    h = History()
    h.write(0, "a", 0, 10)
    h.write(1, "b", 20, 50)
    h.read(2, seen, 30, 40)
    assert check_key(h.ops, "register").valid is True


@pytest.mark.parametrize(("call", "valid"), [(10, True), (11, False)])
def test_a_return_and_a_call_at_the_same_nanosecond_are_concurrent(call: int, valid: bool) -> None:
    h = History()
    h.write(0, "a", 0, 10)
    h.read(1, None, call, 20)  # at 10 the read may still come first
    assert check_key(h.ops, "register").valid is valid


def test_info_write_that_took_effect_late() -> None:
    h = History()
    h.write(0, "a", 0, 10)
    h.write(1, "b", 20, None, type="info")
    h.read(2, "a", 30, 40)
    h.read(2, "b", 100, 110)  # long after the write timed out
    assert check_key(h.ops, "register").valid is True


def test_info_write_that_never_took_effect() -> None:
    h = History()
    h.write(0, "a", 0, 10)
    h.write(1, "b", 20, None, type="info")
    h.read(2, "a", 30, 40)
    h.read(2, "a", 100, 110)
    assert check_key(h.ops, "register").valid is True


def test_a_read_of_an_info_write_before_it_was_invoked() -> None:
    h = History()
    r = h.read(0, "b", 0, 5)
    w = h.write(1, "b", 10, None, type="info")
    result = check_key(h.ops, "register")
    assert result.valid is False and indexes(result) == [r.index, w.index]
    assert result.message is not None
    assert "must take effect before read of 'b' by process 0 [0, 5] returns" in result.message


def test_a_precondition_failure_is_a_definite_outcome() -> None:
    # Linearizable only if the refused cas is ignored: the register holds 'a'
    # for the whole of the cas's interval, so it cannot have found another value.
    h = History()
    w = h.write(0, "a", 0, 10)
    c = h.cas(1, "a", "c", 20, 30, type="fail", error="precondition")
    result = check_key(h.ops, "register")
    assert result.valid is False and indexes(result) == [w.index, c.index]
    assert result.message is not None and result.message.startswith(
        "refused cas from 'a' to 'c' by process 1 [20, 30]: it found a value other than 'a'"
    )
    # The same cas with its failure not definite (not-leader): no effect, not in the search.
    h2 = History()
    h2.write(0, "a", 0, 10)
    h2.cas(1, "a", "c", 20, 30, type="fail", error="not-leader")
    assert check_key(h2.ops, "register").valid is True


@pytest.mark.parametrize("type", ["ok", "info"])
def test_a_precondition_failure_explained_by_a_concurrent_write(type: str) -> None:
    h = History()
    h.write(0, "a", 0, 10)
    h.write(2, "b", 15, 25, type=type)
    h.cas(1, "a", "c", 20, 30, type="fail", error="precondition")
    h.read(0, "b", 40, 50)
    assert check_key(h.ops, "register").valid is True


def test_a_precondition_failure_proves_an_info_write_took_effect() -> None:
    # Without the refused cas the info write could simply never have happened.
    # With it, 'b' was written by 30, so the later read of 'a' is stale.
    h = History()
    h.write(0, "a", 0, 10)
    h.write(1, "b", 5, None, type="info")
    h.cas(2, "a", "c", 20, 30, type="fail", error="precondition")
    h.read(3, "a", 40, 50)
    result = check_key(h.ops, "register")
    assert result.valid is False and len(result.witness) == 4 and result.minimal
    without_cas = [op for op in h.ops if op.f != "cas"]
    assert check_key(without_cas, "register").valid is True


def jepsen_register(*, stale: bool) -> list[CheckOp]:
    """Key k1 of the register example of docs/history-format.md, three workers.

    Process 2's cas times out (info) and its worker continues as process 5.
    """
    h = History(key="k1")
    h.write(0, "v0-1", 1200345, 5630022, offset=7, epoch=2, node=2)
    h.read(1, "v0-1", 1201100, 5690022, offset=7, epoch=2, node=2)
    h.cas(2, "v0-1", "v2-1", 6000000, None, type="info", node=2)
    h.read(0, None, 7000000, 1007000000, type="fail", error="timeout", node=2)
    h.read(0, "v2-1", 2500100000, 2510000000, offset=8, epoch=2, node=3)
    h.write(5, "v5-2", 2520000000, None, type="info", error="run-ended")
    if stale:
        h.read(5 + 3, "v0-1", 2600000000, 2610000000, offset=7, epoch=2, node=1)
    return h.ops


def test_jepsen_style_history_with_retired_processes() -> None:
    assert check_key(jepsen_register(stale=False), "register").valid is True
    result = check_key(jepsen_register(stale=True), "register")
    assert result.valid is False and result.minimal
    reads = [(op.process, op.result) for op in result.witness if op.f == "read"]
    assert reads == [("0", "v2-1"), ("8", "v0-1")]


def test_kv_put_get_delete() -> None:
    h = History()
    h.write(0, "a", 0, 10, f="put")
    h.delete(1, 20, 30)
    h.read(2, None, 40, 50, f="get")
    h.cas(0, None, "c", 60, 70)
    h.read(2, "c", 80, 90, f="get")
    assert check_key(h.ops, "kv").valid is True
    h2 = History()
    h2.write(0, "a", 0, 10, f="put")
    h2.delete(1, 20, 30)
    g = h2.read(2, "a", 40, 50, f="get")
    result = check_key(h2.ops, "kv")
    assert result.valid is False and result.witness[-1] == g
    assert result.message is not None and "leaves 'a' in the key" in result.message


@pytest.mark.parametrize(
    ("seen", "valid"),
    [("x;y;", True), ("y;x;", False), ("x;", False), ("y;", False), ("x;y;z;", False)],
)
def test_kv_appends_concatenate(seen: str, valid: bool) -> None:
    h = History()
    h.append(0, "x;", 0, 10)
    h.append(1, "y;", 20, 30)
    h.read(2, seen, 40, 50, f="get")
    assert check_key(h.ops, "kv").valid is valid


@pytest.mark.parametrize(("seen", "valid"), [("x;", True), ("x;y;", True), ("y;x;", False)])
def test_kv_a_read_concurrent_with_an_append(seen: str, valid: bool) -> None:
    h = History()
    h.append(0, "x;", 0, 10)
    h.append(1, "y;", 20, 50)
    h.read(2, seen, 30, 40)
    assert check_key(h.ops, "kv").valid is valid


@pytest.mark.parametrize(("seen", "valid"), [("b", True), ("ab", False), ("a", False)])
def test_kv_append_after_delete_starts_afresh(seen: str, valid: bool) -> None:
    h = History()
    h.write(0, "a", 0, 10)
    h.delete(0, 20, 30)
    h.append(0, "b", 40, 50)
    h.read(1, seen, 60, 70)
    assert check_key(h.ops, "kv").valid is valid


def test_kv_info_append_and_delete() -> None:
    h = History()
    h.append(0, "x;", 0, 10)
    h.append(1, "y;", 20, None, type="info")
    h.delete(2, 25, None, type="info")
    h.read(3, "x;", 30, 40)
    h.read(3, "x;y;", 50, 60)
    h.read(3, None, 70, 80)
    assert check_key(h.ops, "kv").valid is True
    h.read(3, "x;y;", 90, 100)  # the key was emptied, and nothing appended since
    assert check_key(h.ops, "kv").valid is False


def test_many_unread_info_writes_stay_cheap() -> None:
    h = History()
    for p in range(40):  # each could take effect at any time, or never
        h.write(p, f"lost-{p}", p, None, type="info")
    h.write(100, "a", 100, 110)
    for i in range(20):
        h.read(101, "a", 200 + 10 * i, 205 + 10 * i)
    result = check_key(h.ops, "register")
    assert result.valid is True and result.states < 100


def fake_clock(*times: float) -> Iterator[float]:
    """Times handed out in turn, then the last one forever."""
    return itertools.chain(times, itertools.repeat(times[-1]))


def test_the_budget_gives_unknown_never_a_guess() -> None:
    h = History()
    for i in range(300):
        h.write(0, f"v{i}", 10 * i, 10 * i + 5)
    ticks = fake_clock(0.0, 100.0)
    result = check_key(h.ops, "register", budget_s=1.0, clock=lambda: next(ticks))
    assert result.valid == "unknown" and result.kind is None and result.witness == ()
    assert result.message == (
        "undecided: the search stopped as it ran out of its 1 s budget, after 255 states "
        "(at most 255 of the key's 300 ops linearized at once)"
    )
    # The reference loop looks at the clock at the same steps, and says the same.
    ticks = fake_clock(0.0, 100.0)
    reference = check_key(
        h.ops, "register", budget_s=1.0, clock=lambda: next(ticks), compiled=False
    )
    assert reference.message == result.message
    assert check_key(h.ops, "register", budget_s=1.0, clock=lambda: 0.0).valid is True


def test_shrinking_stops_at_the_budget_and_says_so() -> None:
    h = History()
    h.write(0, "a", 0, 10)
    h.write(1, "b", 20, 30)
    h.read(3, "b", 31, 33)
    h.read(2, "a", 40, 50)
    ticks = fake_clock(0.0, 100.0)  # the search is short: the first look is while shrinking
    result = check_key(h.ops, "register", budget_s=1.0, clock=lambda: next(ticks))
    assert result.valid is False and not result.minimal and len(result.witness) == 4
    assert result.message is not None and "not shown minimal" in result.message


def test_bad_input_is_refused() -> None:
    h = History()
    h.write(0, "a", 0, 10)
    other = History(key="k2")
    other.write(0, "b", 0, 10)
    with pytest.raises(ValueError, match="ops of one key"):
        check_key(h.ops + other.ops, "register")
    with pytest.raises(ValueError, match=r"op 2 \(delete of key 'k'\): register has no f"):
        check_key([*h.ops, h.delete(1, 0, 5)], "register")
    with pytest.raises(ValueError, match="no linearizability model 'log'"):
        check_key(h.ops, "log")


def test_keys_rows_round_trip() -> None:
    h = History()
    h.write(0, "a", 0, 10)
    h.write(1, "b", 20, 30)
    h.read(2, "a", 40, 50)
    result = check_key(h.ops, "register")
    row = result.to_row("r", "k")
    assert tuple(row) == KEYS_COLUMNS
    assert row["valid"] == "false" and row["ops"] == 3 and row["kind"] == "nonlinearizable"
    witness = json.loads(row["witness"])
    assert [w["index"] for w in witness] == [0, 2, 4] and witness[2]["result"] == "a"
    anomaly = keys_row_to_anomaly(row)
    assert anomaly is not None
    assert (anomaly.check, anomaly.kind, anomaly.run, anomaly.key) == (
        "linearizable",
        "nonlinearizable",
        "r",
        "k",
    )
    assert anomaly.message == result.message and list(anomaly.witness) == witness
    ok_row = check_key(h.ops[:2], "register").to_row("r", "k")
    assert ok_row["valid"] == "true" and json.loads(ok_row["witness"]) == []
    assert keys_row_to_anomaly(ok_row) is None
    assert validity_of_keys_row({"valid": "unknown"}) == "unknown"
    with pytest.raises(ValueError, match="valid must be"):
        validity_of_keys_row({"key": "k", "valid": "maybe"})


def test_aborted_and_phantom_reads() -> None:
    h = History()
    failed = h.write(0, "a", 0, 10, type="fail", error="not-leader")
    h.write(1, "b", 20, 30)
    aborted = h.read(2, "a", 40, 50, node=3)
    phantom = h.read(2, "z", 60, 70)
    h.read(2, "b", 80, 90)
    found = find_aborted_reads(h.ops)
    assert [(a.check, a.kind) for a in found] == [
        ("aborted-reads", "aborted-read"),
        ("aborted-reads", "phantom-read"),
    ]
    assert found[0].witness == (aborted.to_json(), failed.to_json())
    assert found[0].node == 3 and (found[0].run, found[0].key) == ("r", "k")
    assert "only failed ops wrote: write 0 (error not-leader)" in found[0].message
    assert found[1].witness == (phantom.to_json(),)
    assert check_key(h.ops, "register").valid is False


def test_aborted_reads_counts_info_and_refused_cas_right() -> None:
    h = History()
    h.write(0, "a", 0, 10, type="info")  # may have happened: not aborted
    h.cas(1, "a", "c", 20, 30, type="fail", error="precondition")
    h.read(2, "a", 40, 50)
    h.read(2, "c", 60, 70)  # only the refused cas wrote 'c'
    found = find_aborted_reads(h.ops)
    assert [(a.kind, a.witness[0]["result"]) for a in found] == [("aborted-read", "c")]


def test_integer_values_and_values_of_another_type() -> None:
    # A Jepsen register history: integers written and read.
    h = History()
    h.write(0, 1, 0, 10)
    h.write(1, 2, 20, 30)
    h.read(2, 1, 40, 50)
    stale = check_key(h.ops, "register")
    assert stale.valid is False and "read of 1" in (stale.message or "")
    assert indexes(stale) == [0, 2, 4]
    for read, valid in ((2, True), ("2", False), (2.0, False), (True, False)):
        g = History()
        g.write(0, 1, 0, 10)
        g.write(1, 2, 20, 30)
        g.read(2, read, 40, 50)
        assert check_key(g.ops, "register").valid is valid, read
    # true and 1 are different values, also as a cas's expected value.
    b = History()
    b.write(0, True, 0, 10)
    b.cas(1, 1, 5, 20, 30)
    assert check_key(b.ops, "register").valid is False
    b.cas(2, True, 6, 40, 50, type="fail", error="precondition")
    assert check_key(b.ops[:1] + b.ops[2:], "register").valid is False


def test_aborted_reads_of_integer_values() -> None:
    h = History()
    h.write(0, 7, 0, 10, type="fail")
    h.read(1, 7, 20, 30)
    found = find_aborted_reads(h.ops)
    assert [a.kind for a in found] == ["aborted-read"]
