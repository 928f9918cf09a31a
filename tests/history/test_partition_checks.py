"""The partition checks (history.partition_checks) on synthetic exports:
quiet on a clean run, each firing on its planted anomaly and only there."""

from __future__ import annotations

from pathlib import Path

import pytest

from history.exports import record_hash
from history.partition_checks import (
    PARTITION_CHECKS,
    PartitionExports,
    check_partitions,
    read_partition_exports,
)
from tests.history.partition_exports import Partitions, T, clean


def fired(p: Partitions) -> dict[str, list[tuple[object, ...]]]:
    found = check_partitions(p.exports())
    assert list(found) == list(PARTITION_CHECKS)
    return {c: [a.ident() for a in found[c]] for c in PARTITION_CHECKS if found[c]}


def test_a_clean_run_raises_nothing() -> None:
    # Truncations of uncommitted tails, a HW that restarts from its
    # checkpoint after a restart, leader changes: all allowed.
    assert fired(clean()) == {}


def test_replicas_that_differ_below_their_hw_diverge() -> None:
    p = clean()
    p.records[3 * 0 + 1] = {**p.records[1], "hash": record_hash(b"99")}  # node 1, offset 1
    found = check_partitions(p.exports())["replica-divergence"]
    assert [a.ident() for a in found] == [("replica-divergence", T, 0, (1, 2, 3), (1,), ())]
    assert "offset 1" in found[0].message and "node 1" in found[0].message


@pytest.mark.parametrize("field", ["epoch", "producer_id", "sequence"])
def test_the_same_value_from_another_batch_diverges_too(field: str) -> None:
    p = clean()
    p.records[0] = {**p.records[0], field: p.records[0][field] + 7}
    assert fired(p) == {"replica-divergence": [("replica-divergence", T, 0, (1, 2, 3), (0,), ())]}


def test_a_stale_tail_above_the_replicas_own_hw_is_not_divergence() -> None:
    # Broker 4 never saw a HW above 3: its offsets 3 and 4 are a tail it has
    # not truncated yet (it would on its next fetch), not a divergence,
    # though the partition's highest HW is 5.
    p = clean()
    p.state(4, 500, 3, 5, 0, 1)
    p.log(4, [1, 2, 3, 40, 41], epoch=0)
    p.checkpoint(4, 3, 5)
    assert fired(p) == {}
    # Once its HW passed offset 3, its record there must agree.
    p.state(4, 600, 4, 5, 0, 1)
    assert fired(p) == {
        "replica-divergence": [("replica-divergence", T, 0, (1, 2, 3, 4), (3,), ())]
    }


def test_a_hw_that_goes_down_within_a_life() -> None:
    p = clean()
    p.state(2, 1500, 4, 5, 1, 2, (2, 3))
    got = fired(p)
    assert got == {"hw-regression": [("hw-regression", T, 0, (2,), (5, 4), (4, 5))]}
    message = check_partitions(p.exports())["hw-regression"][0].message
    assert "from 5 down to 4" in message


def test_a_log_start_above_the_hw() -> None:
    p = clean()
    # Retention on node 2 removed segments up to 6, past its HW 5.
    p.state(2, 1500, 5, 7, 1, 2, (2, 3), start=6)
    got = fired(p)
    assert got == {"log-start-above-hw": [("log-start-above-hw", T, 0, (2,), (6, 5), (5,))]}
    message = check_partitions(p.exports())["log-start-above-hw"][0].message
    assert "log start offset of queue-0 is 6, above its HW 5" in message


def test_a_log_start_at_the_hw_or_unknown_is_not_above_it() -> None:
    p = clean()
    p.state(2, 1500, 5, 7, 1, 2, (2, 3), start=5)
    p.state(3, 1500, 5, 7, 1, 2, (2, 3), start=None)
    assert fired(p) == {}


def test_a_hw_after_a_restart_or_a_removal_starts_again() -> None:
    p = clean()
    p.restart(2)
    p.state(2, 1500, 1, 5, 1, 2, (2, 3))
    p.removed(3, 1600)
    p.state(3, 1700, 0, 0, 1, 2, (2, 3))
    assert fired(p) == {}


def test_a_leader_epoch_that_goes_down_even_across_a_restart() -> None:
    p = clean()
    p.restart(3)
    p.state(3, 1600, 5, 5, 0, 1)
    assert fired(p) == {"epoch-regression": [("epoch-regression", T, 0, (3,), (1, 0), (6, 8))]}


def test_epochs_not_yet_known_and_removals_are_not_regressions() -> None:
    p = clean()
    p.state(3, 1600, 5, 5, -1, -1)
    p.removed(2, 1700)
    p.state(2, 1800, 0, 0, 0, 1)
    assert fired(p) == {}


def test_a_follower_log_restarted_at_the_leaders_log_start_is_no_anomaly() -> None:
    # The leader's log starts at 40, past follower 3's log end 5: its log
    # restarts there. Not a truncation below its HW 5 (what it drops is gone
    # from the leader's log too); its HW rises to 40 and it catches up.
    p = clean()
    p.restart_log(3, 1500, 5, 40, 1)
    p.state(3, 1600, 40, 40, 1, 2, (2, 3), start=40)
    p.state(3, 1700, 45, 45, 1, 2, (2, 3), start=40)
    assert fired(p) == {}


def test_a_restart_that_leaves_the_hw_below_the_new_log_start() -> None:
    # truncateFullyAndStartAt sets the HW to the new log end: one left at
    # the old HW is below the log start. The HW series starts again at the
    # restart (as the Spark job's), so this one check says it.
    p = clean()
    p.restart_log(3, 1500, 5, 40, 1)
    p.state(3, 1600, 4, 40, 1, 2, (2, 3), start=40)
    assert fired(p) == {"log-start-above-hw": [("log-start-above-hw", T, 0, (3,), (40, 4), (8,))]}


def test_a_hw_that_goes_down_after_a_log_restart() -> None:
    p = clean()
    p.restart_log(3, 1500, 5, 40, 1)
    p.state(3, 1600, 45, 45, 1, 2, (2, 3), start=40)
    p.state(3, 1700, 42, 45, 1, 2, (2, 3), start=40)
    assert fired(p) == {"hw-regression": [("hw-regression", T, 0, (3,), (45, 42), (8, 9))]}


def test_a_truncation_below_the_committed_hw() -> None:
    p = clean()
    # Leader 2 announced HW 5 at 1.4 s; follower 3 then cuts to 4.
    p.truncate(3, 1500, 5, 4, 1)
    got = fired(p)
    assert got == {
        "truncated-committed": [("truncated-committed", T, 0, (3,), (4, 5), (7,))],
        # The truncation lowers 3's HW, but that is the truncation's fault,
        # reported once.
    }


def test_the_committed_hw_includes_the_replicas_own_last_one() -> None:
    p = Partitions()
    p.state(3, 100, 4, 6, 0, 1)
    p.truncate(3, 100, 6, 2, 0)  # the same millisecond: its own HW 4 counts
    assert fired(p)["truncated-committed"] == [("truncated-committed", T, 0, (3,), (2, 4), (2,))]


def test_an_unclean_election_excuses_later_truncations_only() -> None:
    p = clean()
    p.change(40, 2, 2, [2], unclean=True)
    p.truncate(3, 1500, 5, 4, 2)  # in the unclean leader's epoch: excused
    assert fired(p) == {}
    q = clean()
    q.change(40, 2, 3, [2], unclean=True)
    q.truncate(3, 1500, 5, 4, 2)  # before the unclean election's epoch
    assert list(fired(q)) == ["truncated-committed"]


def test_read_partition_exports_round_trips_and_names_a_bad_line(tmp_path: Path) -> None:
    p = clean()
    p.write(tmp_path)
    read = read_partition_exports(tmp_path)
    assert sorted(map(repr, read.timeline)) == sorted(map(repr, p.timeline))
    assert read.present and len(read.records) == len(p.records)
    assert sorted(map(repr, read.registrations)) == sorted(map(repr, p.registrations))
    assert read_partition_exports(tmp_path / "nowhere") == PartitionExports()
    (tmp_path / "nodes" / "1" / "partition_timeline.jsonl").write_text("{}\nnope\n")
    with pytest.raises(ValueError, match=r"partition_timeline.jsonl: line 2: not JSON"):
        read_partition_exports(tmp_path)


# -- ineligible-isr (KIP-841, KIP-903) -------------------------------------------------


def test_a_broker_brought_into_the_isr_before_it_was_unfenced() -> None:
    # Broker 1 registered again at offset 25 (fenced) and the controllers
    # took it into the ISR at 26, before its unfencing at 27: B8.
    p = clean()
    p.change(26, 2, 1, [2, 3, 1])
    found = check_partitions(p.exports())["ineligible-isr"]
    assert [a.ident() for a in found] == [("ineligible-isr", T, 0, (1,), (26,), ())]
    assert found[0].message == (
        "the controllers brought broker 1 into the ISR [2, 3, 1] of queue-0 at metadata "
        "offset 26 while it was fenced (broker epoch 25): only a registered, unfenced broker "
        "not in controlled shutdown may join an ISR (KIP-841, KIP-903)"
    )
    assert list(fired(p)) == ["ineligible-isr"]


def test_the_check_fails_without_the_fencing_rule() -> None:
    # The same history with the fence-and-register lines of broker 1 taken
    # out is clean: the anomaly comes from the registrations, nothing else.
    p = clean()
    p.change(26, 2, 1, [2, 3, 1])
    p.registrations = [
        r for r in p.registrations if not (r["broker"] == 1 and r["offset"] in (19, 25))
    ]
    assert fired(p) == {}


def test_a_fenced_broker_unfenced_again_may_rejoin() -> None:
    # In clean(): 1 fenced at 19 (ISR [2, 3] at 20), registered again at 25,
    # unfenced at 27, back in the ISR at 30. Also fenced and unfenced at the
    # same epoch (a lost session, no restart), then back.
    p = clean()
    p.registration(31, 3, "fence")
    p.change(32, 2, 1, [1, 2])
    p.registration(33, 3, "unfence")
    p.change(34, 2, 1, [1, 2, 3])
    assert fired(p) == {}
    # Back one offset before its unfencing: caught.
    q = clean()
    q.registration(31, 3, "fence")
    q.change(32, 2, 1, [1, 2])
    q.change(33, 2, 1, [1, 2, 3])
    q.registration(34, 3, "unfence")
    assert fired(q) == {"ineligible-isr": [("ineligible-isr", T, 0, (3,), (33,), ())]}


def test_shutting_down_and_unregistered_brokers_may_not_join() -> None:
    p = clean()
    p.registration(31, 3, "shutdown")
    p.change(32, 2, 1, [1, 2])
    p.change(33, 2, 1, [1, 2, 3])  # still shutting down
    p.registration(34, 3, "unregister")
    p.change(35, 2, 1, [1, 2])
    p.change(36, 2, 1, [1, 2, 3])  # no longer registered
    p.change(37, 2, 1, [1, 2, 3, 9], partition_epoch=37)  # never registered
    found = check_partitions(p.exports())["ineligible-isr"]
    assert [a.ident() for a in found] == [
        ("ineligible-isr", T, 0, (3,), (33,), ()),
        ("ineligible-isr", T, 0, (3,), (36,), ()),
        ("ineligible-isr", T, 0, (9,), (37,), ()),
    ]
    assert "was in controlled shutdown (broker epoch 3)" in found[0].message
    assert "was not registered" in found[1].message and "was not registered" in found[2].message


def test_members_that_stay_are_not_judged() -> None:
    # Broker 2 is fenced while it stays in the ISR (the controllers keep a
    # fenced last member when no ELR takes it): no broker joined.
    p = clean()
    p.registration(31, 2, "fence")
    p.change(32, -1, 2, [1, 2, 3])
    assert fired(p) == {}


def test_a_new_partition_counts_every_member_as_joining() -> None:
    p = clean()
    p.registration(31, 3, "fence")
    p.change(40, 1, 0, [1, 2, 3], partition_epoch=0)  # created again
    assert fired(p) == {"ineligible-isr": [("ineligible-isr", T, 0, (3,), (40,), ())]}


def test_each_controller_by_its_own_registrations_and_once() -> None:
    p = clean()
    p.change(26, 2, 1, [2, 3, 1])
    # Controller 2 committed the same log: the same lines, the anomaly once.
    for c in list(p.changes):
        p.change(c["offset"], c["leader"], c["leader_epoch"], c["isr"], node=2)
    for r in list(p.registrations):
        p.registrations.append({**r, "node": 2})
    # Controller 3 exported its changes but no registrations: not judged.
    p.change(50, 2, 1, [2, 3, 7], node=3)
    assert fired(p) == {"ineligible-isr": [("ineligible-isr", T, 0, (1,), (26,), ())]}
