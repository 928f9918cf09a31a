"""The transaction simulation (``broker/sim/txn*.py``): KIP-98's
transactions with KIP-890's defences on the simulated brokers, every
invariant checked after every event.

The scenarios of the holes KIP-890 closes pass with every rule and fire
their invariant with the defence switched off; Hypothesis draws the seeds
of random runs with faults, zombies and duplicated messages, and a failure
prints the seed and the call that replays it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from broker.sim.invariants import Violation
from broker.sim.txn import TxnSimCluster
from broker.sim.txn_clients import TxnPlan
from broker.sim.txn_config import TxnSimConfig
from broker.sim.txn_invariants import LogScan, TxnInvariantChecker, check_settled
from broker.sim.txn_scenarios import (
    TXN_SCENARIOS,
    TxnFault,
    TxnSimResult,
    run_txn_random,
    run_txn_scenario,
    settle,
)
from partition_log.batch import build_batch
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.records import Record
from partition_log.txn import ControlType, EndTxnMarker, build_marker_batch
from tests.quorum.test_purity import impurities

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2_500
FAULTY = TxnSimConfig(duplicate_rate=0.05, zombie_rate=0.02, recover_rate=0.1)


def _explain(result: TxnSimResult, config: TxnSimConfig) -> str:
    tail = "\n".join(result.trace[-60:])
    return (
        f"seed {result.seed} failed: {result.violation}\n"
        f"replay: run_txn_random({result.seed}, {result.steps}, {config})\n"
        f"last events:\n{tail}"
    )


# -- scenarios ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TXN_SCENARIOS))
def test_scenario_holds_with_every_rule(name: str) -> None:
    run = run_txn_scenario(name)
    assert run.violation is None, "\n".join(run.cluster.trace[-60:])


@pytest.mark.parametrize("name", sorted(TXN_SCENARIOS))
def test_scenario_fires_with_its_defence_off(name: str) -> None:
    scenario = TXN_SCENARIOS[name]
    run = run_txn_scenario(name, broken=True)
    assert run.violation is not None, f"{name} with {scenario.broken}: nothing fired"
    assert run.violation.rule == scenario.fires, str(run.violation)
    assert f"seed {run.cluster.seed}, event {run.violation.event}" in str(run.violation)


def test_kafka_17754_the_late_end_txn_is_fenced_and_changes_nothing() -> None:
    run = run_txn_scenario("kafka-17754")
    assert run.facts["outcomes"] == ["committed", "aborted"]
    # The retry committed transaction 0; the held first attempt arrived
    # while transaction 1 was open, at an epoch one below it: refused.
    assert run.facts["end_answers"] == [
        (("tx0", 0, 0), True, 0, "NONE"),
        (("tx0", 0, 0), True, 0, "PRODUCER_FENCED"),
        (("tx0", 0, 1), False, 1, "NONE"),
    ]


def test_kafka_17754_with_transaction_version_1_commits_the_open_transaction() -> None:
    run = run_txn_scenario("kafka-17754", broken=True)
    assert run.violation is not None
    assert "never asked to end it" in run.violation.detail
    # The held commit of transaction 0 was taken for transaction 1's.
    assert [a for a in run.cluster.end_txn_answers if a[0][2] == 0][1][3] == "NONE"


def test_late_marker_copy_is_refused_and_the_next_transaction_aborts_alone() -> None:
    run = run_txn_scenario("late-marker")
    assert run.facts["outcomes"] == ["committed", "aborted"]
    # The held first copy of transaction 0's COMMIT arrived with transaction
    # 1 open on p0 at the same epoch, the bumped one: refused there.
    refused = run.facts["refused"]
    assert isinstance(refused, list) and len(refused) == 1, refused
    assert "p0" in refused[0] and "epoch 1: INVALID_PRODUCER_EPOCH" in refused[0]


def test_hanging_unadded_is_refused_and_the_transaction_aborted() -> None:
    run = run_txn_scenario("hanging-unadded")
    assert run.facts["outcomes"] == ["aborted"]
    assert any("INVALID_TXN_STATE: aborting" in line for line in run.cluster.trace)


@pytest.mark.parametrize(
    "switch", [("verify_transactional_produce", False), ("bump_epoch_on_end", False)]
)
def test_hanging_delayed_needs_only_one_of_the_two_defences(switch: tuple[str, bool]) -> None:
    run = run_txn_scenario("hanging-delayed", switches=(switch,))
    assert run.violation is None, str(run.violation)
    assert run.facts["outcomes"] == ["aborted"]


def test_partial_commit_and_lso_scenarios_commit() -> None:
    for name in ("partial-commit", "lso-past-open"):
        assert run_txn_scenario(name).facts["outcomes"] == ["committed"]


def test_unknown_scenario_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown scenario 'x'; known: hanging-delayed"):
        run_txn_scenario("x")


# -- the log scan ----------------------------------------------------------------


def _data(offset: int, epoch: int, sequence: int) -> bytes:
    return build_batch(
        [Record(offset, 0, None, b"v")],
        base_offset=offset,
        partition_leader_epoch=0,
        producer_id=7,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=True,
    )


def test_no_write_after_fence_fires_on_a_fenced_epochs_batch_after_its_marker() -> None:
    # A follower copies what its leader has, unchecked: a leader that let
    # a fenced epoch's batch in after the marker shows in every replica.
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    log.append_as_follower(_data(0, 1, 0))
    marker = EndTxnMarker(ControlType.ABORT, 0)
    log.append_as_follower(
        build_marker_batch(7, 2, marker, 0, base_offset=1, partition_leader_epoch=0)
    )
    scan = LogScan(state=False)
    scan.update(log)
    assert scan.problems == [] and scan.open_first == {} and scan.fence == {7: 2}
    log.append_as_follower(_data(2, 1, 1))
    scan.update(log)
    assert scan.problems == [
        "a batch of producer 7 epoch 1 at offset 2 after its marker of epoch 2"
    ]
    assert scan.open_first == {7: 2}


# -- the end check ---------------------------------------------------------------


def test_a_committed_transaction_is_visible_in_every_partition() -> None:
    checker = TxnInvariantChecker()
    cluster = TxnSimCluster(5, check=checker)
    cluster.run_for(300)
    cluster.start_producer("tx0", [TxnPlan(((0, 2), (1, 1), (0, 1)), commit=True)])
    cluster.start_producer("tx1", [TxnPlan(((1, 1),), commit=False)])
    cluster.run_for(2_000)
    settle(cluster, checker, quiet_ms=3_000)
    txns = sorted(cluster.client_txns.items())
    assert [t.outcome for _, t in txns] == ["committed", "aborted"]
    for p in cluster.data_partitions:
        log = cluster.brokers[0].logs[p]
        assert log.last_stable_offset == log.high_watermark > 0


def test_the_end_check_names_a_transaction_left_open() -> None:
    checker = TxnInvariantChecker()
    cluster = TxnSimCluster(5, check=checker)
    cluster.run_for(300)
    # Checked while the transaction waits to commit, long before it times
    # out: its partition's last stable offset is held at its first batch.
    cluster.start_producer("tx0", [TxnPlan(((0, 1),), commit=True, think_ms=60_000)])
    cluster.run_for(1_000)
    with pytest.raises(Violation) as found:
        check_settled(cluster, checker)
    assert found.value.rule == "hanging-transaction"


# -- random runs -----------------------------------------------------------------


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    faults=st.lists(st.sampled_from(list(TxnFault)), min_size=1, unique=True),
)
def test_random_runs_keep_every_invariant(seed: int, faults: list[TxnFault]) -> None:
    note(f"replay: run_txn_random({seed}, {STEPS}, FAULTY, {tuple(faults)})")
    result = run_txn_random(seed, STEPS, FAULTY, tuple(faults))
    assert result.ok, _explain(result, FAULTY)


@pytest.mark.parametrize("seed", [1, 2])
def test_fixed_seed_smoke(seed: int) -> None:
    result = run_txn_random(seed, STEPS, FAULTY)
    assert result.ok, _explain(result, FAULTY)
    # A run that ended nothing would prove nothing.
    assert result.committed > 0 and result.aborted + result.unknown > 0


def test_a_quiet_run_commits_and_aborts_and_duplicates() -> None:
    config = replace(FAULTY, zombie_rate=0.0)
    result = run_txn_random(3, 1_500, config, faults=())
    assert result.ok, _explain(result, config)
    assert result.committed >= 3 and result.duplicated > 0


HARSH = TxnSimConfig(duplicate_rate=0.2, zombie_rate=0.05, recover_rate=0.2, transactional_ids=3)


def test_a_zombie_recovering_with_its_epoch_gets_no_share_of_the_new_epoch() -> None:
    """Seed 0 of a harsh run: a new instance's InitProducerId bumps tx0 to
    epoch 11, then the fenced instance recovers (KIP-360) naming epoch 10.
    While the coordinator kept 10 as the last epoch of any bump, that was
    taken for a retry and answered epoch 11: both instances wrote one
    transaction, and the new one's commit exposed the zombie's records
    (``read-committed``)."""
    result = run_txn_random(0, 4_000, HARSH)
    assert result.ok, _explain(result, HARSH)


def test_same_seed_same_run() -> None:
    assert run_txn_random(7, 600, FAULTY) == run_txn_random(7, 600, FAULTY)
    assert run_txn_random(7, 600, FAULTY).trace != run_txn_random(8, 600, FAULTY).trace


def test_config_refuses_bad_values_naming_them() -> None:
    with pytest.raises(ValueError, match="duplicate_rate must be in"):
        TxnSimConfig(duplicate_rate=1.0)
    with pytest.raises(ValueError, match="needs a data partition"):
        TxnSimConfig(cluster=replace(TxnSimConfig().cluster, partitions=1))


# -- purity ----------------------------------------------------------------------


def txn_modules() -> list[Path]:
    return sorted((ROOT / "broker" / "sim").glob("txn*.py"))


def test_txn_modules_found() -> None:
    names = {p.name for p in txn_modules()}
    assert {"txn.py", "txn_clients.py", "txn_invariants.py", "txn_scenarios.py"} <= names


@pytest.mark.parametrize("path", txn_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_txn_module_is_pure(path: Path) -> None:
    assert impurities(path.read_text(), str(path.relative_to(ROOT))) == []
