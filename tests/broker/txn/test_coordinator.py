"""The transaction coordinator's rules, one test each (Kafka's
TransactionCoordinator with KIP-360 and KIP-890 part 2): the records each
decision writes, the answer, and every error code where it fires."""

from __future__ import annotations

import dataclasses

import pytest

from broker.errors import Errors
from broker.group.placement import partition_for as offsets_partition_for
from broker.txn.api import PendingMarkers, Result, TxnMarker
from broker.txn.coordinator import IllegalTransitionError, TransactionCoordinatorShard
from broker.txn.records import TransactionLogKey, TxnRecord
from broker.txn.state import TransactionMetadata
from broker.txn.types import TopicPartition, TransactionState
from tests.broker.txn.harness import Log, compacted, new_shard, rebuilt

S = TransactionState
TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
U0 = TopicPartition("u", 0)
TIMEOUT = 60_000


def init(
    shard: TransactionCoordinatorShard, log: Log, tid: str = "tx", pid: int = -1, epoch: int = -1
) -> tuple[int, int]:
    response = log.apply(shard, shard.init_producer_id(tid, TIMEOUT, pid, epoch, now_ms=0)).response
    assert response.error is Errors.NONE, response
    return response.producer_id, response.producer_epoch


def meta(shard: TransactionCoordinatorShard, tid: str = "tx") -> TransactionMetadata:
    found = shard.transactions.get(tid)
    assert found is not None
    return found


def ongoing(
    shard: TransactionCoordinatorShard, log: Log, tid: str = "tx", now: int = 0
) -> tuple[int, int]:
    pid, epoch = init(shard, log, tid)
    result = log.apply(shard, shard.add_partitions(tid, pid, epoch, [TP0, U0], now))
    assert result.response.error is Errors.NONE
    return pid, epoch


def complete(shard: TransactionCoordinatorShard, log: Log, pending: PendingMarkers | None) -> None:
    assert pending is not None
    result = shard.complete_txn(
        pending.transactional_id, pending.producer_id, pending.producer_epoch, 0
    )
    assert log.apply(shard, result).response.error is Errors.NONE


# -- InitProducerId ------------------------------------------------------------


def test_a_new_id_gets_a_new_producer_id_at_epoch_0() -> None:
    shard, log, ids = new_shard()
    result = shard.init_producer_id("tx", TIMEOUT, now_ms=5)
    assert (result.response.producer_id, result.response.producer_epoch) == (1000, 0)
    assert ids.given == [1000]
    (record,) = result.records
    assert record.key == TransactionLogKey("tx")
    assert record.value is not None
    assert record.value.state is S.EMPTY
    assert (record.value.timeout_ms, record.value.last_update_ms) == (TIMEOUT, 5)
    # Deciding changed nothing: only replay does.
    assert shard.transactions.get("tx") is None


def test_init_again_bumps_the_epoch_of_the_same_producer_id() -> None:
    shard, log, ids = new_shard()
    assert init(shard, log) == (1000, 0)
    assert init(shard, log) == (1000, 1)
    # A new producer's bump keeps no last epoch (Kafka's
    # prepareIncrementProducerEpoch without an expected epoch).
    assert meta(shard).last_producer_epoch == -1
    assert ids.given == [1000]


def test_a_new_producers_init_fences_the_old_one_recovering_with_its_epoch() -> None:
    """The old producer at epoch 1 recovers (KIP-360) after a new
    producer's InitProducerId bumped the id to epoch 2: naming epoch 1 is
    no retry of anything it asked, so it is fenced, not given epoch 2 (two
    producers at one epoch would share a transaction)."""
    shard, log, _ = new_shard()
    init(shard, log)
    assert init(shard, log) == (1000, 1)
    assert init(shard, log) == (1000, 2)
    result = shard.init_producer_id("tx", TIMEOUT, 1000, 1, now_ms=0)
    assert (result.response.error, result.records) == (Errors.PRODUCER_FENCED, ())
    # Its own bump naming epoch 2 is remembered for its retry.
    assert init(shard, log, pid=1000, epoch=2) == (1000, 3)
    assert init(shard, log, pid=1000, epoch=2) == (1000, 3)


@pytest.mark.parametrize(
    ("tid", "timeout", "pid", "epoch", "code"),
    [
        ("", TIMEOUT, -1, -1, Errors.INVALID_REQUEST),
        ("tx", 0, -1, -1, Errors.INVALID_TRANSACTION_TIMEOUT),
        ("tx", 900_001, -1, -1, Errors.INVALID_TRANSACTION_TIMEOUT),
        ("tx", TIMEOUT, 1000, -1, Errors.INVALID_REQUEST),
        ("tx", TIMEOUT, -1, 0, Errors.INVALID_REQUEST),
    ],
)
def test_init_refuses_bad_requests(
    tid: str, timeout: int, pid: int, epoch: int, code: Errors
) -> None:
    shard, _, _ = new_shard()
    result = shard.init_producer_id(tid, timeout, pid, epoch, now_ms=0)
    assert result.response.error is code
    assert result.records == ()


def test_init_with_the_longest_timeout_is_allowed() -> None:
    shard, _, _ = new_shard()
    assert shard.init_producer_id("tx", 900_000, now_ms=0).response.error is Errors.NONE


def test_kip360_expected_epoch_bumps_a_retry_is_answered_alike_others_are_fenced() -> None:
    shard, log, _ = new_shard()
    init(shard, log)
    assert init(shard, log) == (1000, 1)
    # The producer at epoch 1 recovers: the next epoch.
    assert init(shard, log, pid=1000, epoch=1) == (1000, 2)
    # Its answer was lost; the retry names epoch 1 again, the last epoch:
    # the same answer, not a second bump.
    assert init(shard, log, pid=1000, epoch=1) == (1000, 2)
    # Epoch 0 is neither the current nor the last: fenced.
    result = shard.init_producer_id("tx", TIMEOUT, 1000, 0, now_ms=0)
    assert result.response.error is Errors.PRODUCER_FENCED
    assert result.records == ()
    # Another producer id altogether: fenced.
    result = shard.init_producer_id("tx", TIMEOUT, 77, 2, now_ms=0)
    assert result.response.error is Errors.PRODUCER_FENCED


def test_an_exhausted_epoch_gets_a_new_producer_id() -> None:
    shard, log, ids = new_shard()
    init(shard, log)
    log.apply(shard, _set(shard, producer_epoch=32766))
    assert init(shard, log, pid=1000, epoch=32766) == (1001, 0)
    assert (meta(shard).previous_producer_id, meta(shard).last_producer_epoch) == (1000, 32766)
    # The retry of the rotation (the old id at its exhausted epoch) is the
    # same answer (KIP-360's isValidProducerId).
    assert init(shard, log, pid=1000, epoch=32766) == (1001, 0)
    assert ids.given == [1000, 1001]


def test_init_fences_an_ongoing_transaction_by_aborting_it_first() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    result = log.apply(shard, shard.init_producer_id("tx", TIMEOUT, now_ms=9))
    assert result.response.error is Errors.CONCURRENT_TRANSACTIONS
    fenced = meta(shard)
    assert fenced.state is S.PREPARE_ABORT
    assert (fenced.producer_epoch, fenced.last_producer_epoch) == (epoch + 1, -1)
    assert result.response.pending == PendingMarkers(
        "tx",
        pid,
        epoch + 1,
        False,
        (TxnMarker("t", 0, pid, epoch + 1, False, 2), TxnMarker("u", 0, pid, epoch + 1, False, 2)),
    )
    # Until the abort completes the answer stays CONCURRENT_TRANSACTIONS.
    again = shard.init_producer_id("tx", TIMEOUT, now_ms=9)
    assert (again.response.error, again.records) == (Errors.CONCURRENT_TRANSACTIONS, ())
    complete(shard, log, result.response.pending)
    # The retry bumps the epoch a second time.
    assert init(shard, log) == (pid, epoch + 2)
    # The fenced producer's EndTxn is not a retry of anything.
    end = shard.end_txn("tx", pid, epoch, True, 10)
    assert end.response.error is Errors.PRODUCER_FENCED


# -- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------


def test_add_partitions_opens_the_transaction_at_the_first() -> None:
    shard, log, _ = new_shard()
    pid, epoch = init(shard, log)
    log.apply(shard, shard.add_partitions("tx", pid, epoch, [TP0], 100))
    assert (meta(shard).state, meta(shard).start_ms, meta(shard).partitions) == (
        S.ONGOING,
        100,
        frozenset({TP0}),
    )
    log.apply(shard, shard.add_partitions("tx", pid, epoch, [TP1], 200))
    assert (meta(shard).start_ms, meta(shard).last_update_ms) == (100, 200)
    assert meta(shard).partitions == {TP0, TP1}


def test_add_partitions_already_added_writes_nothing() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    result = shard.add_partitions("tx", pid, epoch, [TP0], 300)
    assert (result.response.error, result.records) == (Errors.NONE, ())


@pytest.mark.parametrize(
    ("tid", "pid", "epoch", "code"),
    [
        ("", 1000, 0, Errors.INVALID_REQUEST),
        ("other", 1000, 0, Errors.INVALID_PRODUCER_ID_MAPPING),
        ("tx", 999, 1, Errors.INVALID_PRODUCER_ID_MAPPING),
        ("tx", 1000, 0, Errors.PRODUCER_FENCED),
        ("tx", 1000, 2, Errors.INVALID_PRODUCER_EPOCH),
    ],
)
def test_add_partitions_of_the_wrong_producer(tid: str, pid: int, epoch: int, code: Errors) -> None:
    shard, log, _ = new_shard()
    init(shard, log)
    init(shard, log)
    result = shard.add_partitions(tid, pid, epoch, [TP0], 0)
    assert (result.response.error, result.records) == (code, ())


@pytest.mark.parametrize(
    "partitions", [[], [TopicPartition("", 0)], [TopicPartition("t", -1)]], ids=str
)
def test_add_partitions_refuses_bad_partitions(partitions: list[TopicPartition]) -> None:
    shard, log, _ = new_shard()
    pid, epoch = init(shard, log)
    result = shard.add_partitions("tx", pid, epoch, partitions, 0)
    assert (result.response.error, result.records) == (Errors.INVALID_REQUEST, ())


def test_add_partitions_while_completing_is_concurrent() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    log.apply(shard, shard.end_txn("tx", pid, epoch, True, 0))
    result = shard.add_partitions("tx", pid, epoch + 1, [TP1], 0)
    assert (result.response.error, result.records) == (Errors.CONCURRENT_TRANSACTIONS, ())


def test_add_offsets_adds_the_groups_offsets_partition() -> None:
    shard, log, _ = new_shard()
    pid, epoch = init(shard, log)
    log.apply(shard, shard.add_offsets("tx", pid, epoch, "group-7", 50, 0))
    partition = offsets_partition_for("group-7", 50)
    assert meta(shard).partitions == {TopicPartition("__consumer_offsets", partition)}
    result = shard.add_offsets("tx", pid, epoch, "", 50, 0)
    assert result.response.error is Errors.INVALID_GROUP_ID
    assert shard.add_offsets("tx", pid, epoch - 1, "g", 50, 0).response.error is (
        Errors.PRODUCER_FENCED
    )


def test_verify_only_passes_the_partitions_of_this_producers_ongoing_transaction() -> None:
    """KIP-890 part 1: a leader's verification passes only a partition in
    the ongoing transaction of exactly this producer id and epoch."""
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    found = shard.verify_partitions("tx", pid, epoch, [TP0, TP1])
    assert found[TP0] == (Errors.NONE, "")
    assert found[TP1][0] is Errors.INVALID_TXN_STATE and "t-1" in found[TP1][1]
    # Verifying writes nothing and changes nothing.
    assert meta(shard).partitions == {TP0, U0}
    # An older epoch is fenced, another producer id is not the id's.
    assert shard.verify_partitions("tx", pid, epoch - 1, [TP0])[TP0][0] is Errors.PRODUCER_FENCED
    assert shard.verify_partitions("tx", pid + 1, epoch, [TP0])[TP0][0] is (
        Errors.INVALID_PRODUCER_ID_MAPPING
    )
    assert shard.verify_partitions("nope", pid, epoch, [TP0])[TP0][0] is (
        Errors.INVALID_PRODUCER_ID_MAPPING
    )
    # Once the transaction ends (its epoch bumped), its epoch verifies
    # nothing: a late batch of it is refused, not taken into the next.
    end = log.apply(shard, shard.end_txn("tx", pid, epoch, True, 5)).response
    complete(shard, log, end.pending)
    assert shard.verify_partitions("tx", pid, epoch, [TP0])[TP0][0] is Errors.PRODUCER_FENCED
    assert shard.verify_partitions("tx", pid, end.producer_epoch, [TP0])[TP0][0] is (
        Errors.INVALID_TXN_STATE
    )


# -- EndTxn -------------------------------------------------------------------


def test_end_txn_prepares_at_the_next_epoch_and_names_the_markers() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    result = log.apply(shard, shard.end_txn("tx", pid, epoch, True, 50))
    response = result.response
    assert (response.error, response.producer_id, response.producer_epoch) == (
        Errors.NONE,
        pid,
        epoch + 1,
    )
    assert (meta(shard).state, meta(shard).last_producer_epoch) == (S.PREPARE_COMMIT, epoch)
    assert response.pending == PendingMarkers(
        "tx",
        pid,
        epoch + 1,
        True,
        (TxnMarker("t", 0, pid, epoch + 1, True, 2), TxnMarker("u", 0, pid, epoch + 1, True, 2)),
    )


@pytest.mark.parametrize("commit", [True, False])
def test_complete_txn_ends_the_transaction_and_clears_its_partitions(commit: bool) -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    pending = log.apply(shard, shard.end_txn("tx", pid, epoch, commit, 0)).response.pending
    complete(shard, log, pending)
    done = meta(shard)
    assert done.state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    assert (done.producer_id, done.producer_epoch, done.partitions) == (pid, epoch + 1, frozenset())
    # The next transaction uses the epoch EndTxn answered.
    assert shard.add_partitions("tx", pid, epoch + 1, [TP1], 0).response.error is Errors.NONE


def test_a_retried_end_txn_is_told_its_outcome() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    pending = log.apply(shard, shard.end_txn("tx", pid, epoch, True, 0)).response.pending
    # The retry (the old epoch) while the markers are written.
    retry = shard.end_txn("tx", pid, epoch, True, 0)
    assert (retry.response.error, retry.records) == (Errors.CONCURRENT_TRANSACTIONS, ())
    wrong = shard.end_txn("tx", pid, epoch, False, 0)
    assert (wrong.response.error, wrong.records) == (Errors.INVALID_TXN_STATE, ())
    complete(shard, log, pending)
    retry = shard.end_txn("tx", pid, epoch, True, 0)
    assert retry.records == ()
    assert (retry.response.error, retry.response.producer_id, retry.response.producer_epoch) == (
        Errors.NONE,
        pid,
        epoch + 1,
    )
    wrong = shard.end_txn("tx", pid, epoch, False, 0)
    assert (wrong.response.error, wrong.records) == (Errors.INVALID_TXN_STATE, ())


def test_end_txn_of_the_current_epoch_while_completing_is_concurrent() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    log.apply(shard, shard.end_txn("tx", pid, epoch, False, 0))
    result = shard.end_txn("tx", pid, epoch + 1, False, 0)
    assert (result.response.error, result.records) == (Errors.CONCURRENT_TRANSACTIONS, ())
    result = shard.end_txn("tx", pid, epoch + 1, True, 0)
    assert (result.response.error, result.records) == (Errors.INVALID_TXN_STATE, ())


def test_commit_without_partitions_is_invalid_abort_bumps_the_epoch() -> None:
    shard, log, _ = new_shard()
    pid, epoch = init(shard, log)
    result = shard.end_txn("tx", pid, epoch, True, 0)
    assert (result.response.error, result.records) == (Errors.INVALID_TXN_STATE, ())
    # KIP-890 part 2: an abort with nothing added still bumps the epoch.
    result = log.apply(shard, shard.end_txn("tx", pid, epoch, False, 0))
    assert result.response.producer_epoch == epoch + 1
    assert result.response.pending == PendingMarkers("tx", pid, epoch + 1, False, ())
    complete(shard, log, result.response.pending)
    # And so does an abort after an ended transaction.
    result = log.apply(shard, shard.end_txn("tx", pid, epoch + 1, False, 0))
    assert (result.response.error, meta(shard).state) == (Errors.NONE, S.PREPARE_ABORT)


@pytest.mark.parametrize(
    ("tid", "pid", "epoch", "code"),
    [
        ("", 1000, 1, Errors.INVALID_REQUEST),
        ("other", 1000, 1, Errors.INVALID_PRODUCER_ID_MAPPING),
        ("tx", 999, 1, Errors.INVALID_PRODUCER_ID_MAPPING),
        ("tx", 1000, 0, Errors.PRODUCER_FENCED),
        ("tx", 1000, 2, Errors.INVALID_PRODUCER_EPOCH),
    ],
)
def test_end_txn_of_the_wrong_producer(tid: str, pid: int, epoch: int, code: Errors) -> None:
    shard, log, _ = new_shard()
    init(shard, log)
    init(shard, log)
    log.apply(shard, shard.add_partitions("tx", 1000, 1, [TP0], 0))
    result = shard.end_txn(tid, pid, epoch, True, 0)
    assert (result.response.error, result.records) == (code, ())


def test_an_exhausted_epoch_at_end_moves_to_the_next_producer_id() -> None:
    shard, log, ids = new_shard()
    init(shard, log)
    log.apply(shard, _set(shard, producer_epoch=32766))
    log.apply(shard, shard.add_partitions("tx", 1000, 32766, [TP0], 0))
    result = log.apply(shard, shard.end_txn("tx", 1000, 32766, True, 0))
    assert (result.response.producer_id, result.response.producer_epoch) == (1000, 32767)
    assert meta(shard).next_producer_id == 1001
    assert result.response.pending is not None
    assert {m.producer_epoch for m in result.response.pending.markers} == {32767}
    complete(shard, log, result.response.pending)
    done = meta(shard)
    assert (done.producer_id, done.producer_epoch, done.previous_producer_id) == (1001, 0, 1000)
    assert done.next_producer_id == -1
    # The retry with the old id is told the outcome and the new id.
    retry = shard.end_txn("tx", 1000, 32766, True, 0)
    assert (retry.response.error, retry.response.producer_id, retry.response.producer_epoch) == (
        Errors.NONE,
        1001,
        0,
    )
    assert ids.given == [1000, 1001]


def test_complete_txn_of_another_transaction_is_refused() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    result = shard.complete_txn("tx", pid, epoch, 0)
    assert (result.response.error, result.records) == (Errors.INVALID_TXN_STATE, ())
    log.apply(shard, shard.end_txn("tx", pid, epoch, True, 0))
    result = shard.complete_txn("tx", pid, epoch, 0)
    assert (result.response.error, result.records) == (Errors.INVALID_TXN_STATE, ())
    result = shard.complete_txn("nope", pid, epoch + 1, 0)
    assert result.response.error is Errors.INVALID_PRODUCER_ID_MAPPING


# -- time ---------------------------------------------------------------------


def test_a_timed_out_transaction_is_aborted_and_its_producer_fenced() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log, now=1_000)
    # Kafka's rule: start + timeout < now.
    assert shard.tick(1_000 + TIMEOUT).records == ()
    result = log.apply(shard, shard.tick(1_000 + TIMEOUT + 1))
    aborted = meta(shard)
    assert (aborted.state, aborted.producer_epoch, aborted.last_producer_epoch) == (
        S.PREPARE_ABORT,
        epoch + 1,
        -1,
    )
    (pending,) = result.response
    assert pending.markers == (
        TxnMarker("t", 0, pid, epoch + 1, False, 2),
        TxnMarker("u", 0, pid, epoch + 1, False, 2),
    )
    complete(shard, log, pending)
    # The producer is fenced: its EndTxn is not a retry, its next add fails.
    assert shard.end_txn("tx", pid, epoch, True, 0).response.error is Errors.PRODUCER_FENCED
    assert shard.end_txn("tx", pid, epoch, False, 0).response.error is Errors.PRODUCER_FENCED
    added = shard.add_partitions("tx", pid, epoch, [TP1], 0)
    assert added.response.error is Errors.PRODUCER_FENCED


def test_an_idle_id_expires() -> None:
    shard, log, _ = new_shard(transactional_id_expiration_ms=1_000)
    init(shard, log, "idle")
    ongoing(shard, log, "busy")
    assert shard.tick(999).records == ()
    result = log.apply(shard, shard.tick(1_000))
    assert result.records == (TxnRecord(TransactionLogKey("idle"), None),)
    assert shard.transactions.get("idle") is None
    assert shard.transactions.get("busy") is not None


# -- loading and reads ------------------------------------------------------------


def test_become_loaded_names_the_prepared_transactions_markers() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log, "a")
    pending_a = log.apply(shard, shard.end_txn("a", pid, epoch, True, 0)).response.pending
    ongoing(shard, log, "b")
    pid_c, epoch_c = ongoing(shard, log, "c")
    pending_c = log.apply(shard, shard.end_txn("c", pid_c, epoch_c, False, 0)).response.pending
    complete(shard, log, pending_c)
    loaded, _, _ = new_shard()
    for record in compacted(log.records):
        loaded.replay(record)
    assert loaded.become_loaded(0) == (pending_a,)


def test_list_and_describe() -> None:
    shard, log, _ = new_shard()
    ongoing(shard, log, "a")
    init(shard, log, "b")
    assert [(t.transactional_id, t.state) for t in shard.list_transactions()] == [
        ("a", S.ONGOING),
        ("b", S.EMPTY),
    ]
    assert [t.transactional_id for t in shard.list_transactions(states=[S.EMPTY])] == ["b"]
    assert [t.transactional_id for t in shard.list_transactions(producer_ids=[1000])] == ["a"]
    described = shard.describe_transaction("a")
    assert (described.error, described.state, described.partitions) == (
        Errors.NONE,
        S.ONGOING,
        frozenset({TP0, U0}),
    )
    missing = shard.describe_transaction("zz")
    assert missing.error is Errors.TRANSACTIONAL_ID_NOT_FOUND


def test_the_log_rebuilds_the_same_state() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    complete(
        shard, log, log.apply(shard, shard.end_txn("tx", pid, epoch, True, 0)).response.pending
    )
    ongoing(shard, log, "other")
    assert list(rebuilt(log.records)) == list(shard.transactions)
    assert list(rebuilt(compacted(log.records))) == list(shard.transactions)


def _set(shard: TransactionCoordinatorShard, **change: int) -> Result[None]:
    """A record that puts ``tx`` in the given state directly (as if the log
    held it), for states that take thousands of steps to reach."""
    return Result((dataclasses.replace(meta(shard), **change).record(),), None)  # type: ignore[arg-type]


def test_a_decision_that_breaks_a_transition_rule_raises() -> None:
    shard, log, _ = new_shard()
    pid, epoch = ongoing(shard, log)
    current = meta(shard)
    transit = TransactionCoordinatorShard._transit
    with pytest.raises(IllegalTransitionError, match="ONGOING -> COMPLETE_COMMIT"):
        transit(current, dataclasses.replace(current, state=S.COMPLETE_COMMIT))
    with pytest.raises(IllegalTransitionError, match="EMPTY -> PREPARE_COMMIT"):
        transit(None, dataclasses.replace(current, state=S.PREPARE_COMMIT))
    with pytest.raises(IllegalTransitionError, match="ONGOING -> PREPARE_EPOCH_FENCE"):
        transit(current, dataclasses.replace(current, state=S.PREPARE_EPOCH_FENCE))
    with pytest.raises(IllegalTransitionError, match="ONGOING -> DEAD"):
        transit(current, None)
    with pytest.raises(IllegalTransitionError, match=f"epoch {epoch} -> {epoch - 1}"):
        transit(current, dataclasses.replace(current, producer_epoch=epoch - 1))
    assert transit(current, dataclasses.replace(current, state=S.PREPARE_ABORT)).value is not None
    assert pid == current.producer_id
