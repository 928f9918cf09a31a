"""Stale reads and version forks from the versions the servers report."""

from __future__ import annotations

from spark_verify.versions import stale_reads, version_forks
from tests.spark_verify.histories import History


def test_a_read_older_than_a_completed_write_is_stale() -> None:
    h = History()
    h.write(0, "a", 0, 10, offset=3, epoch=1)
    b = h.write(1, "b", 20, 30, offset=5, epoch=1)
    c = h.write(1, "c", 31, 39, offset=6, epoch=2)
    h.read(2, "b", 35, 45, offset=5, epoch=1)  # concurrent with c: fine
    stale = h.read(2, "a", 40, 50, offset=3, epoch=1, node=2)
    h.read(2, "c", 60, 70, offset=6, epoch=2)
    found = stale_reads(h.ops)
    assert len(found) == 1
    (anomaly,) = found
    assert (anomaly.check, anomaly.kind, anomaly.node) == ("stale-reads", "stale-read", 2)
    assert anomaly.witness == (stale.to_json(), c.to_json())  # the newest such write
    assert anomaly.message.startswith("read of 'a' by process 2 [40, 50] at offset 3 (epoch 1)")
    assert b.index not in [w["index"] for w in anomaly.witness]


def test_a_write_returning_as_the_read_is_invoked_is_concurrent() -> None:
    h = History()
    h.write(0, "a", 0, 10, offset=3, epoch=1)
    h.write(1, "b", 20, 30, offset=5, epoch=1)
    h.read(2, "a", 30, 50, offset=3, epoch=1)
    assert stale_reads(h.ops) == []
    h.read(2, "a", 31, 50, offset=3, epoch=1)
    assert len(stale_reads(h.ops)) == 1


def test_null_reads() -> None:
    h = History()
    w = h.write(0, "a", 0, 10, offset=3, epoch=1)
    empty = h.read(1, None, 20, 30)  # nothing, after a completed write: stale
    (anomaly,) = stale_reads(h.ops)
    assert anomaly.witness == (empty.to_json(), w.to_json())
    h.delete(0, 40, 50, offset=4, epoch=1)
    h.read(1, None, 60, 70)  # after the delete: fine
    assert len(stale_reads(h.ops)) == 1
    h2 = History()
    h2.write(0, "a", 0, 10, offset=3, epoch=1)
    h2.delete(1, 15, None, type="info")  # may have emptied the key: not judged
    h2.read(2, None, 20, 30)
    assert stale_reads(h2.ops) == []


def test_info_and_failed_writes_do_not_make_reads_stale() -> None:
    h = History()
    h.write(0, "a", 0, 10, offset=3, epoch=1)
    h.write(1, "b", 11, None, type="info")
    h.cas(2, "z", "c", 12, 18, type="fail", error="precondition", offset=9, epoch=1)
    h.read(3, "a", 20, 30, offset=3, epoch=1)
    assert stale_reads(h.ops) == []


def test_appends_and_puts_have_versions_too() -> None:
    h = History()
    h.append(0, "x;", 0, 10, offset=3, epoch=1)
    h.append(0, "y;", 20, 30, offset=4, epoch=1)
    h.read(1, "x;", 40, 50, offset=3, epoch=1, f="get")
    h.write(0, "p", 60, 70, offset=8, epoch=1, f="put")
    h.read(1, "x;y;", 80, 90, offset=4, epoch=1, f="get")
    assert [a.witness[0]["result"] for a in stale_reads(h.ops)] == ["x;", "x;y;"]


def test_stale_reads_are_per_key() -> None:
    h1, h2 = History(key="k1"), History(key="k2")
    h1.write(0, "a", 0, 10, offset=3, epoch=1)
    h2.write(1, "b", 0, 10, offset=7, epoch=1)
    h1.read(2, "a", 20, 30, offset=3, epoch=1)
    assert stale_reads(h1.ops + h2.ops) == []


def test_one_offset_with_two_epochs() -> None:
    h = History()
    a = h.write(0, "a", 0, 10, offset=3, epoch=1)
    h.read(1, "a", 20, 30, offset=3, epoch=1)
    b = h.read(1, "a", 40, 50, offset=3, epoch=2)
    found = version_forks(h.ops)
    assert [(f.check, f.kind) for f in found] == [("version-forks", "offset-epochs")]
    assert found[0].witness == (a.to_json(), b.to_json())
    assert found[0].message.startswith("offset 3 is named with epochs 1, 2")


def test_one_version_with_two_values() -> None:
    h = History()
    a = h.write(0, "a", 0, 10, offset=3, epoch=1)
    r = h.read(1, "b", 20, 30, offset=3, epoch=1)
    h.write(2, "b", 0, 10, offset=5, epoch=1)
    kinds = sorted(f.kind for f in version_forks(h.ops))
    # 'b' is also seen at two versions (written at 5, read at 3).
    assert kinds == ["value-versions", "version-values"]
    (values,) = [f for f in version_forks(h.ops) if f.kind == "version-values"]
    assert values.witness == (a.to_json(), r.to_json())


def test_two_writes_claim_one_record() -> None:
    h = History()
    h.write(0, "a", 0, 10, offset=3, epoch=1)
    h.cas(1, "x", "y", 0, 10, type="fail", error="precondition", offset=3, epoch=1)
    assert [f.kind for f in version_forks(h.ops)] == ["version-values"]


def test_appends_compare_reads_only() -> None:
    h = History()
    h.append(0, "x;", 0, 10, offset=3, epoch=1)
    h.read(1, "x;", 20, 30, offset=3, epoch=1)
    h.append(0, "y;", 40, 50, offset=4, epoch=1)
    h.read(1, "x;y;", 60, 70, offset=4, epoch=1)
    assert version_forks(h.ops) == []
    h.read(2, "y;", 80, 90, offset=4, epoch=1)
    assert [f.kind for f in version_forks(h.ops)] == ["version-values"]


def test_a_consistent_history_has_no_forks() -> None:
    h = History()
    h.write(0, "a", 0, 10, offset=3, epoch=1)
    h.read(1, "a", 20, 30, offset=3, epoch=1)
    h.cas(0, "a", "b", 40, 50, offset=4, epoch=1)
    h.read(1, "b", 60, 70, offset=4, epoch=1)
    h.read(1, "b", 80, 90, offset=4, epoch=1)
    h.cas(2, "q", "c", 91, 95, type="fail", error="precondition", offset=5, epoch=2)
    h.write(3, "d", 96, None, type="info")
    assert version_forks(h.ops) == []
