"""The coordinator's transaction-version-1 mode (``bump_epoch_on_end``
off), kept for the simulation that shows what KIP-890 part 2 defends
against: EndTxn keeps the epoch, a retry is an EndTxn of the current
epoch in a completing or completed state, and a late EndTxn of the
current epoch ends whichever transaction is ongoing (KAFKA-17754)."""

from __future__ import annotations

from broker.errors import Errors
from broker.txn.api import PendingMarkers, TxnMarker
from broker.txn.coordinator import TransactionCoordinatorShard, TxnConfig
from broker.txn.types import TopicPartition, TransactionState
from tests.broker.txn.harness import CountingProducerIds, Log

S = TransactionState
TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
TIMEOUT = 60_000


def tv1_shard() -> tuple[TransactionCoordinatorShard, Log]:
    ids = CountingProducerIds()
    return TransactionCoordinatorShard(TxnConfig(), ids, bump_epoch_on_end=False), Log()


def started(shard: TransactionCoordinatorShard, log: Log) -> tuple[int, int]:
    init = log.apply(shard, shard.init_producer_id("tx", TIMEOUT, now_ms=0)).response
    assert init.error is Errors.NONE
    added = shard.add_partitions("tx", init.producer_id, init.producer_epoch, [TP0], 0)
    assert log.apply(shard, added).response.error is Errors.NONE
    return init.producer_id, init.producer_epoch


def ended(
    shard: TransactionCoordinatorShard, log: Log, pid: int, epoch: int, commit: bool
) -> PendingMarkers:
    answer = log.apply(shard, shard.end_txn("tx", pid, epoch, commit, 0)).response
    assert answer.error is Errors.NONE, answer
    assert answer.pending is not None
    done = shard.complete_txn("tx", answer.pending.producer_id, answer.pending.producer_epoch, 0)
    assert log.apply(shard, done).response.error is Errors.NONE
    return answer.pending


def test_the_default_is_transaction_version_2() -> None:
    shard = TransactionCoordinatorShard(TxnConfig(), CountingProducerIds())
    assert shard.bump_epoch_on_end


def test_end_txn_keeps_the_epoch_and_its_markers_carry_it() -> None:
    shard, log = tv1_shard()
    pid, epoch = started(shard, log)
    answer = log.apply(shard, shard.end_txn("tx", pid, epoch, True, 0)).response
    assert (answer.error, answer.producer_epoch) == (Errors.NONE, epoch)
    assert answer.pending == PendingMarkers(
        "tx", pid, epoch, True, (TxnMarker("t", 0, pid, epoch, True, 1),)
    )
    found = shard.transactions.get("tx")
    assert found is not None
    assert (found.state, found.producer_epoch, found.client_transaction_version) == (
        S.PREPARE_COMMIT,
        epoch,
        1,
    )


def test_a_retry_in_a_completed_state_is_told_its_outcome_the_other_outcome_is_invalid() -> None:
    shard, log = tv1_shard()
    pid, epoch = started(shard, log)
    ended(shard, log, pid, epoch, True)
    retry = shard.end_txn("tx", pid, epoch, True, 0)
    assert (retry.response.error, retry.response.producer_epoch, retry.records) == (
        Errors.NONE,
        epoch,
        (),
    )
    other = shard.end_txn("tx", pid, epoch, False, 0)
    assert (other.response.error, other.records) == (Errors.INVALID_TXN_STATE, ())


def test_a_retry_while_completing_is_concurrent() -> None:
    shard, log = tv1_shard()
    pid, epoch = started(shard, log)
    log.apply(shard, shard.end_txn("tx", pid, epoch, False, 0))
    retry = shard.end_txn("tx", pid, epoch, False, 0)
    assert (retry.response.error, retry.records) == (Errors.CONCURRENT_TRANSACTIONS, ())


def test_an_abort_with_nothing_begun_is_invalid() -> None:
    shard, log = tv1_shard()
    init = log.apply(shard, shard.init_producer_id("tx", TIMEOUT, now_ms=0)).response
    result = shard.end_txn("tx", init.producer_id, init.producer_epoch, False, 0)
    assert (result.response.error, result.records) == (Errors.INVALID_TXN_STATE, ())


def test_a_late_end_txn_ends_the_next_transaction_kafka_17754() -> None:
    """Transaction 1's EndTxn(commit), delayed, reaches the coordinator
    while transaction 2 is ongoing at the same epoch: it commits
    transaction 2, which its producer never asked for."""
    shard, log = tv1_shard()
    pid, epoch = started(shard, log)
    ended(shard, log, pid, epoch, True)
    added = shard.add_partitions("tx", pid, epoch, [TP1], 0)
    assert log.apply(shard, added).response.error is Errors.NONE
    late = log.apply(shard, shard.end_txn("tx", pid, epoch, True, 0)).response
    assert late.error is Errors.NONE
    assert late.pending == PendingMarkers(
        "tx", pid, epoch, True, (TxnMarker("t", 1, pid, epoch, True, 1),)
    )


def test_with_transaction_version_2_the_late_end_txn_changes_nothing() -> None:
    ids = CountingProducerIds()
    shard, log = TransactionCoordinatorShard(TxnConfig(), ids), Log()
    pid, epoch = started(shard, log)
    ended(shard, log, pid, epoch, True)
    added = shard.add_partitions("tx", pid, epoch + 1, [TP1], 0)
    assert log.apply(shard, added).response.error is Errors.NONE
    late = shard.end_txn("tx", pid, epoch, True, 0)
    assert (late.response.error, late.records) == (Errors.PRODUCER_FENCED, ())


def test_fences_still_bump_the_epoch() -> None:
    shard, log = tv1_shard()
    pid, epoch = started(shard, log)
    fence = log.apply(shard, shard.init_producer_id("tx", TIMEOUT, now_ms=0)).response
    assert fence.error is Errors.CONCURRENT_TRANSACTIONS
    assert fence.pending is not None and fence.pending.producer_epoch == epoch + 1
    timed_out, log2 = tv1_shard()
    pid, epoch = started(timed_out, log2)
    result = log2.apply(timed_out, timed_out.tick(TIMEOUT + 1))
    assert [p.producer_epoch for p in result.response] == [epoch + 1]
    del pid
