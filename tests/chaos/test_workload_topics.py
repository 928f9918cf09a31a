"""The topics workload's final check against the history."""

from __future__ import annotations

from chaos.ops import Op
from chaos.workloads.topics import check_final_metadata


def history(*ops: tuple[str, str, str]) -> list[Op]:
    """Invoke and completion of each (f, key, completion type)."""
    out: list[Op] = []
    for p, (f, key, type) in enumerate(ops):
        i = len(out)
        error = None if type == "ok" else "timeout"
        out.append(Op(i, i, "invoke", p, f, key=key))
        out.append(Op(i + 1, i + 1, type, p, f, key=key, error=error))  # type: ignore[arg-type]
    return out


def kinds(ops: list[Op], topics: list[str], brokers: list[int]) -> list[tuple[str, str]]:
    return [(p.kind, p.target) for p in check_final_metadata(ops, topics, brokers)]


def test_agreeing_metadata_has_no_problem() -> None:
    ops = history(
        ("create-topic", "t1", "ok"),
        ("create-topic", "t2", "ok"),
        ("delete-topic", "t2", "ok"),
        ("create-topic", "t3", "info"),
        ("create-topic", "t4", "fail"),
        ("register-broker", "1", "ok"),
        ("register-broker", "2", "info"),
        ("heartbeat", "1", "ok"),
    )
    assert kinds(ops, ["t1"], [1]) == []
    assert kinds(ops, ["t1", "t3"], [1, 2]) == []  # info may have happened


def test_a_lost_topic_unless_a_delete_may_have_happened() -> None:
    ops = history(("create-topic", "t1", "ok"), ("delete-topic", "t1", "fail"))
    assert kinds(ops, [], []) == [("lost-topic", "t1")]
    ops = history(("create-topic", "t1", "ok"), ("delete-topic", "t1", "info"))
    assert kinds(ops, [], []) == []


def test_phantom_and_resurrected_topics() -> None:
    ops = history(
        ("create-topic", "t1", "fail"),
        ("create-topic", "t2", "ok"),
        ("delete-topic", "t2", "ok"),
    )
    assert kinds(ops, ["t1", "t2", "zz"], []) == [
        ("phantom-topic", "t1"),
        ("resurrected-topic", "t2"),
        ("phantom-topic", "zz"),
    ]


def test_lost_and_phantom_brokers() -> None:
    ops = history(("register-broker", "1", "ok"), ("register-broker", "2", "fail"))
    assert kinds(ops, [], [2, 3]) == [
        ("lost-broker", "1"),
        ("phantom-broker", "2"),
        ("phantom-broker", "3"),
    ]
