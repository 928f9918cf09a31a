"""The transactional producer's pure core: Kafka's ``TransactionManager``
states and transitions, the partitions new, pending and added, the drain
gate, each answer's reading (done, retried, abortable, fatal) for
InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit,
EndTxn and a failed send, and the accumulator under a transaction (the
transactional attribute, no drain before the partition is added, an
abort's dropped batches, sequences from 0 in each new epoch)."""

from __future__ import annotations

import random

import pytest

from broker.client.accumulator import ProduceAnswer, RecordAccumulator
from broker.client.errors import (
    CLIENT_ERROR,
    FORCE_CLOSED,
    TRANSACTION_ABORTED,
    DeliveryError,
    InvalidProducerEpochError,
    Outcome,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionFatalError,
    TransactionStateError,
)
from broker.client.producer_batch import ProducerConfig, TopicPartition
from broker.client.sequencing import Sequencing
from broker.client.transactions import (
    ADD_PARTITIONS_RETRY_BACKOFF_MS,
    VALID_PREVIOUS,
    ConsumerGroupMetadata,
    Retry,
    TransactionManager,
    TxnState,
    backoff_ms,
)
from broker.errors import Errors
from partition_log.batch import BatchScanner

S = TxnState
T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)
U0 = TopicPartition("u", 0)
GROUP = ConsumerGroupMetadata("g", "m-1", 3)


def manager() -> TransactionManager:
    return TransactionManager("tx", Sequencing(True, transactional=True), retry_backoff_ms=100)


def ready() -> TransactionManager:
    txn = manager()
    assert txn.begin_init() == txn.producer  # (-1, -1): no id yet
    assert txn.producer.producer_id == -1
    assert txn.on_init_producer_id(Errors.NONE, 7, 0) is None
    assert txn.state is S.READY
    return txn


def in_transaction(*partitions: TopicPartition) -> TransactionManager:
    txn = ready()
    txn.begin_transaction()
    for tp in partitions:
        txn.maybe_add_partition(tp)
    if partitions:
        asked = txn.partitions_to_add()
        assert txn.on_add_partitions(dict.fromkeys(asked, Errors.NONE)) is None
    return txn


def failure(code: int, name: str | None = None) -> DeliveryError:
    return DeliveryError(
        name or Errors(code).name if code >= 0 else name or "TIMEOUT",
        code,
        "t-0: 1 record(s) failed",
        Outcome.FAIL,
    )


# -- states ---------------------------------------------------------------------------


def test_the_transition_table_is_kafkas() -> None:
    assert VALID_PREVIOUS[S.INITIALIZING] == {S.UNINITIALIZED}
    assert VALID_PREVIOUS[S.READY] == {
        S.INITIALIZING,
        S.COMMITTING_TRANSACTION,
        S.ABORTING_TRANSACTION,
    }
    assert VALID_PREVIOUS[S.IN_TRANSACTION] == {S.READY}
    assert VALID_PREVIOUS[S.COMMITTING_TRANSACTION] == {S.IN_TRANSACTION}
    assert VALID_PREVIOUS[S.ABORTING_TRANSACTION] == {S.IN_TRANSACTION, S.ABORTABLE_ERROR}
    assert VALID_PREVIOUS[S.ABORTABLE_ERROR] == {
        S.IN_TRANSACTION,
        S.COMMITTING_TRANSACTION,
        S.ABORTABLE_ERROR,
    }
    assert VALID_PREVIOUS[S.FATAL_ERROR] == set(TxnState)


def test_a_committed_then_an_aborted_transaction() -> None:
    txn = in_transaction(T0, T1)
    assert txn.partitions == {T0, T1} and txn.transaction_started
    txn.begin_commit()
    assert txn.state is S.COMMITTING_TRANSACTION
    assert txn.end_request() == (7, 0, True)
    assert txn.on_end_txn(Errors.NONE, 7, 1) is None
    assert txn.state is S.READY and txn.producer.epoch == 1
    assert not txn.partitions and not txn.transaction_started
    txn.begin_transaction()
    txn.maybe_add_partition(T0)
    txn.partitions_to_add()
    txn.begin_abort()
    assert txn.end_request() == (7, 1, False)
    assert txn.on_end_txn(Errors.NONE, 7, 2) is None
    assert (txn.state, txn.producer.epoch) == (S.READY, 2)


@pytest.mark.parametrize(
    ("setup", "call"),
    [
        ("uninitialized", "begin_transaction"),
        ("uninitialized", "begin_commit"),
        ("uninitialized", "begin_abort"),
        ("uninitialized", "check_send"),
        ("ready", "begin_init"),
        ("ready", "begin_commit"),
        ("ready", "begin_abort"),
        ("ready", "check_send"),
        ("ready", "begin_send_offsets"),
        ("in_transaction", "begin_transaction"),
        ("in_transaction", "begin_init"),
        ("committing", "begin_abort"),
        ("committing", "check_send"),
        ("committing", "begin_transaction"),
        ("aborting", "begin_commit"),
        ("aborting", "check_send"),
    ],
)
def test_misuse_is_refused_and_changes_nothing(setup: str, call: str) -> None:
    txn = {
        "uninitialized": manager,
        "ready": ready,
        "in_transaction": in_transaction,
    }.get(setup, in_transaction)()
    if setup == "committing":
        txn.begin_commit()
    elif setup == "aborting":
        txn.begin_abort()
    before = txn.state
    with pytest.raises(TransactionStateError):
        if call == "begin_send_offsets":
            txn.begin_send_offsets(GROUP)
        else:
            getattr(txn, call)()
    assert txn.state is before and txn.last_error is None


def test_a_commit_or_abort_called_again_goes_on_at_the_same_epoch() -> None:
    txn = in_transaction(T0)
    txn.begin_commit()
    first = txn.end_request()
    assert txn.on_end_txn(Errors.CONCURRENT_TRANSACTIONS, -1, -1) == Retry(False, 100)
    txn.begin_commit()  # a commit that timed out, called again
    assert txn.end_request() == first == (7, 0, True)
    txn = in_transaction(T0)
    txn.begin_abort()
    txn.begin_abort()
    assert txn.end_request() == (7, 0, False)


def test_init_called_again_goes_on_and_passes_a_known_id() -> None:
    txn = manager()
    txn.begin_init()
    assert txn.on_init_producer_id(Errors.CONCURRENT_TRANSACTIONS, -1, -1) == Retry(False, 100)
    assert txn.begin_init().producer_id == -1  # goes on
    # KIP-360: a producer that has an id and epoch names them.
    txn.sequencing.set_producer_id(5, 3)
    assert (txn.begin_init().producer_id, txn.begin_init().epoch) == (5, 3)


# -- partitions ---------------------------------------------------------------------


def test_partitions_go_new_then_pending_then_added_and_gate_the_drain() -> None:
    txn = in_transaction()
    txn.maybe_add_partition(T0)
    txn.maybe_add_partition(T0)
    assert txn.new_partitions == {T0} and not txn.may_drain(T0)
    assert not txn.transaction_started
    assert txn.partitions_to_add() == {T0}
    assert txn.transaction_started  # the request may add it
    txn.maybe_add_partition(T0)  # pending: not new again
    txn.maybe_add_partition(T1)
    assert txn.new_partitions == {T1} and txn.pending_partitions == {T0}
    # Each request takes every partition not added yet.
    assert txn.partitions_to_add() == {T0, T1}
    assert txn.on_add_partitions({T0: Errors.NONE, T1: Errors.NONE}) is None
    assert txn.may_drain(T0) and txn.may_drain(T1) and not txn.may_drain(U0)
    assert not txn.has_partitions_to_add
    txn.maybe_add_partition(T0)
    assert not txn.new_partitions


def test_a_partition_assumed_added_drains_without_a_request() -> None:
    # KIP-890's buggy client (the chaos workload's unadded_sends): the
    # partition drains at once and no AddPartitionsToTxn will name it.
    txn = in_transaction()
    txn.maybe_add_partition(T0)
    txn.assume_added(T0)
    assert txn.may_drain(T0) and not txn.has_partitions_to_add
    assert not txn.transaction_started
    txn.maybe_add_partition(T0)
    assert not txn.new_partitions


def test_only_an_open_transaction_takes_a_partition_assumed_added() -> None:
    txn = in_transaction()
    txn.begin_commit()
    with pytest.raises(TransactionStateError, match="not one in state COMMITTING_TRANSACTION"):
        txn.assume_added(T0)
    assert not txn.partitions


@pytest.mark.parametrize(
    ("code", "retry"),
    [
        (Errors.NOT_COORDINATOR, Retry(True, 100)),
        (Errors.COORDINATOR_NOT_AVAILABLE, Retry(True, 100)),
        (Errors.COORDINATOR_LOAD_IN_PROGRESS, Retry(False, 100)),
        (Errors.UNKNOWN_TOPIC_OR_PARTITION, Retry(False, 100)),
        (Errors.CONCURRENT_TRANSACTIONS, Retry(False, ADD_PARTITIONS_RETRY_BACKOFF_MS)),
    ],
)
def test_add_partitions_retries(code: Errors, retry: Retry) -> None:
    txn = in_transaction()
    txn.maybe_add_partition(T0)
    asked = txn.partitions_to_add()
    assert txn.on_add_partitions({T0: code}) == retry
    assert txn.pending_partitions == asked and txn.state is S.IN_TRANSACTION


def test_concurrent_transactions_backs_off_briefly_only_for_the_first_add() -> None:
    txn = in_transaction(T0)
    txn.maybe_add_partition(T1)
    txn.partitions_to_add()
    assert txn.on_add_partitions({T1: Errors.CONCURRENT_TRANSACTIONS}) == Retry(False, 100)
    assert backoff_ms(20, 0, 1000) == 20
    assert [backoff_ms(20, a, 1000) for a in range(1, 8)] == [40, 80, 160, 320, 640, 1000, 1000]
    assert backoff_ms(100, 3, 50) == 100


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (Errors.PRODUCER_FENCED, ProducerFencedError),
        (Errors.INVALID_PRODUCER_EPOCH, ProducerFencedError),
        (Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TransactionFatalError),
        (Errors.INVALID_TXN_STATE, TransactionFatalError),
        (Errors.INVALID_PRODUCER_ID_MAPPING, TransactionFatalError),
    ],
)
def test_add_partitions_fatal(code: Errors, error: type[Exception]) -> None:
    txn = in_transaction()
    txn.maybe_add_partition(T0)
    txn.partitions_to_add()
    with pytest.raises(error) as raised:
        txn.on_add_partitions({T0: code})
    assert raised.value.code == code  # type: ignore[attr-defined]
    assert txn.state is S.FATAL_ERROR and not txn.may_drain(T0)
    # Every later call raises it again, a new instance each time.
    for call in (txn.begin_transaction, txn.check_send, txn.begin_commit, txn.begin_abort):
        with pytest.raises(error) as again:
            call()
        assert again.value is not raised.value


@pytest.mark.parametrize(
    "code",
    [
        Errors.TOPIC_AUTHORIZATION_FAILED,
        Errors.INVALID_TOPIC_EXCEPTION,
        Errors.UNKNOWN_PRODUCER_ID,
        Errors.UNKNOWN_SERVER_ERROR,
    ],
)
def test_add_partitions_abortable(code: Errors) -> None:
    txn = in_transaction()
    txn.maybe_add_partition(T0)
    txn.maybe_add_partition(U0)
    txn.partitions_to_add()
    with pytest.raises(TransactionAbortableError) as raised:
        txn.on_add_partitions({T0: Errors.OPERATION_NOT_ATTEMPTED, U0: code})
    assert raised.value.code == code
    assert txn.state is S.ABORTABLE_ERROR
    assert not txn.pending_partitions and not txn.partitions
    assert txn.drops_unsent and not txn.may_send_request()
    # A commit is refused (the transaction must abort); so are sends.
    with pytest.raises(TransactionAbortableError):
        txn.begin_commit()
    with pytest.raises(TransactionAbortableError):
        txn.check_send()
    txn.begin_abort()
    assert txn.state is S.ABORTING_TRANSACTION
    assert txn.on_end_txn(Errors.NONE, 7, 1) is None
    assert txn.state is S.READY
    txn.begin_transaction()  # and the producer goes on


# -- a failed send ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "name", "error"),
    [
        (Errors.INVALID_TXN_STATE, None, TransactionAbortableError),
        (Errors.TOPIC_AUTHORIZATION_FAILED, None, TransactionAbortableError),
        (Errors.MESSAGE_TOO_LARGE, None, TransactionAbortableError),
        (Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, None, TransactionAbortableError),
        (CLIENT_ERROR, "TIMEOUT", TransactionAbortableError),
        (Errors.PRODUCER_FENCED, None, ProducerFencedError),
        (Errors.INVALID_PRODUCER_EPOCH, None, InvalidProducerEpochError),
        (Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None, TransactionFatalError),
        (Errors.CLUSTER_AUTHORIZATION_FAILED, None, TransactionFatalError),
        (Errors.INVALID_PRODUCER_ID_MAPPING, None, TransactionFatalError),
    ],
)
def test_a_failed_send_is_abortable_or_fatal(
    code: int, name: str | None, error: type[Exception]
) -> None:
    txn = in_transaction(T0)
    txn.on_batch_failed(failure(code, name))
    assert isinstance(txn.last_error, error)
    fatal = issubclass(error, TransactionFatalError)
    assert txn.state is (S.FATAL_ERROR if fatal else S.ABORTABLE_ERROR)
    with pytest.raises(error):
        txn.begin_commit()
    if not fatal:
        # The first cause is kept.
        txn.on_batch_failed(failure(Errors.NOT_ENOUGH_REPLICAS))
        assert txn.last_error is not None and txn.last_error.code == code


def test_a_send_failing_while_the_commit_flushes_fails_the_commit() -> None:
    txn = in_transaction(T0)
    txn.begin_commit()
    txn.on_batch_failed(failure(Errors.INVALID_TXN_STATE))
    assert txn.state is S.ABORTABLE_ERROR
    with pytest.raises(TransactionAbortableError, match="INVALID_TXN_STATE"):
        txn.check_completing()
    with pytest.raises(TransactionAbortableError):
        txn.begin_commit()
    txn.begin_abort()
    assert txn.end_request() == (7, 0, False)


def test_failures_of_dropped_or_force_closed_batches_change_nothing() -> None:
    txn = in_transaction(T0)
    txn.on_batch_failed(failure(CLIENT_ERROR, TRANSACTION_ABORTED))
    txn.on_batch_failed(failure(CLIENT_ERROR, FORCE_CLOSED))
    assert txn.state is S.IN_TRANSACTION
    txn.begin_abort()
    txn.on_batch_failed(failure(Errors.INVALID_TXN_STATE))
    assert txn.state is S.ABORTING_TRANSACTION
    # Outside a transaction (a late failure) nothing happens either.
    txn = ready()
    txn.on_batch_failed(failure(Errors.INVALID_TXN_STATE))
    assert txn.state is S.READY


# -- ending -----------------------------------------------------------------------------


def test_a_transaction_nothing_joined_ends_without_endtxn() -> None:
    txn = in_transaction()
    txn.begin_commit()
    assert not txn.end_needs_request
    txn.complete()
    assert txn.state is S.READY and txn.producer.epoch == 0


@pytest.mark.parametrize(
    ("code", "retry"),
    [
        (Errors.NOT_COORDINATOR, Retry(True, 100)),
        (Errors.COORDINATOR_NOT_AVAILABLE, Retry(True, 100)),
        (Errors.COORDINATOR_LOAD_IN_PROGRESS, Retry(False, 100)),
        (Errors.CONCURRENT_TRANSACTIONS, Retry(False, 100)),
    ],
)
def test_end_txn_retries(code: Errors, retry: Retry) -> None:
    txn = in_transaction(T0)
    txn.begin_commit()
    assert txn.on_end_txn(code, -1, -1) == retry
    assert txn.state is S.COMMITTING_TRANSACTION


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (Errors.PRODUCER_FENCED, ProducerFencedError),
        (Errors.INVALID_PRODUCER_EPOCH, ProducerFencedError),
        (Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TransactionFatalError),
        (Errors.INVALID_TXN_STATE, TransactionFatalError),
        (Errors.INVALID_PRODUCER_ID_MAPPING, TransactionFatalError),
        (Errors.UNKNOWN_SERVER_ERROR, TransactionFatalError),
    ],
)
def test_end_txn_fatal(code: Errors, error: type[Exception]) -> None:
    txn = in_transaction(T0)
    txn.begin_commit()
    with pytest.raises(error):
        txn.on_end_txn(code, -1, -1)
    assert txn.state is S.FATAL_ERROR


def test_end_txn_unknown_producer_id_is_abortable() -> None:
    txn = in_transaction(T0)
    txn.begin_commit()
    with pytest.raises(TransactionAbortableError):
        txn.on_end_txn(Errors.UNKNOWN_PRODUCER_ID, -1, -1)
    assert txn.state is S.ABORTABLE_ERROR
    txn.begin_abort()
    with pytest.raises(TransactionAbortableError):
        txn.on_end_txn(Errors.UNKNOWN_PRODUCER_ID, -1, -1)
    assert txn.state is S.ABORTING_TRANSACTION  # the abort goes on when called again


def test_end_txn_adopts_a_new_producer_id_and_restarts_sequences() -> None:
    txn = in_transaction(T0)
    txn.sequencing._entry(T0).next_sequence = 12
    txn.begin_commit()
    assert txn.on_end_txn(Errors.NONE, 9, 0) is None  # an exhausted epoch moved on
    assert (txn.producer.producer_id, txn.producer.epoch) == (9, 0)
    assert txn.sequencing.next_sequence(T0) == 0


def test_end_txn_answered_without_a_producer_is_fatal() -> None:
    txn = in_transaction(T0)
    txn.begin_abort()
    with pytest.raises(TransactionFatalError):
        txn.on_end_txn(Errors.NONE, -1, -1)


# -- InitProducerId and FindCoordinator ------------------------------------------------


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (Errors.NOT_COORDINATOR, Retry(True, 100)),
        (Errors.COORDINATOR_NOT_AVAILABLE, Retry(True, 100)),
        (Errors.COORDINATOR_LOAD_IN_PROGRESS, Retry(False, 100)),
        (Errors.CONCURRENT_TRANSACTIONS, Retry(False, 100)),
        (Errors.PRODUCER_FENCED, ProducerFencedError),
        (Errors.INVALID_PRODUCER_EPOCH, ProducerFencedError),
        (Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TransactionFatalError),
        (Errors.CLUSTER_AUTHORIZATION_FAILED, TransactionFatalError),
        (Errors.INVALID_TRANSACTION_TIMEOUT, TransactionFatalError),
    ],
)
def test_init_producer_id_answers(code: Errors, outcome: object) -> None:
    txn = manager()
    txn.begin_init()
    if isinstance(outcome, Retry):
        assert txn.on_init_producer_id(code, -1, -1) == outcome
        assert txn.state is S.INITIALIZING
    else:
        assert isinstance(outcome, type)
        with pytest.raises(outcome):
            txn.on_init_producer_id(code, -1, -1)
        assert txn.state is S.FATAL_ERROR
        with pytest.raises(outcome):
            txn.begin_init()


def test_find_coordinator_answers() -> None:
    txn = manager()
    assert txn.on_find_coordinator(Errors.NONE) is None
    assert txn.on_find_coordinator(Errors.COORDINATOR_NOT_AVAILABLE) == Retry(False, 100)
    with pytest.raises(TransactionFatalError):
        txn.on_find_coordinator(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)


# -- offsets ----------------------------------------------------------------------------


def test_offsets_join_the_transaction() -> None:
    txn = in_transaction()
    txn.begin_send_offsets(GROUP)
    assert txn.transaction_started  # AddOffsetsToTxn may add the group
    assert txn.on_add_offsets(Errors.CONCURRENT_TRANSACTIONS, "g") == Retry(False, 100)
    assert txn.on_add_offsets(Errors.NOT_COORDINATOR, "g") == Retry(True, 100)
    assert txn.on_add_offsets(Errors.NONE, "g") is None
    txn.begin_offset_commit({T0: 5, T1: 9})
    retry = txn.on_txn_offset_commit(
        {T0: Errors.NONE, T1: Errors.COORDINATOR_LOAD_IN_PROGRESS}, "g"
    )
    assert retry == Retry(False, 100) and txn.pending_offsets == {T1: 9}
    assert txn.on_txn_offset_commit({T1: Errors.NOT_COORDINATOR}, "g") == Retry(True, 100)
    assert txn.on_txn_offset_commit({T1: Errors.REQUEST_TIMED_OUT}, "g") == Retry(True, 100)
    assert txn.on_txn_offset_commit({T1: Errors.NONE}, "g") is None
    with pytest.raises(ValueError, match="negative"):
        txn.begin_offset_commit({T0: -1})


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (Errors.GROUP_AUTHORIZATION_FAILED, TransactionAbortableError),
        (Errors.UNKNOWN_PRODUCER_ID, TransactionAbortableError),
        (Errors.PRODUCER_FENCED, ProducerFencedError),
        (Errors.INVALID_PRODUCER_EPOCH, ProducerFencedError),
        (Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TransactionFatalError),
        (Errors.INVALID_PRODUCER_ID_MAPPING, TransactionFatalError),
        (Errors.INVALID_TXN_STATE, TransactionFatalError),
    ],
)
def test_add_offsets_refusals(code: Errors, error: type[Exception]) -> None:
    txn = in_transaction()
    txn.begin_send_offsets(GROUP)
    with pytest.raises(error):
        txn.on_add_offsets(code, "g")


@pytest.mark.parametrize(
    ("code", "error", "name"),
    [
        (Errors.GROUP_AUTHORIZATION_FAILED, TransactionAbortableError, None),
        (Errors.UNKNOWN_MEMBER_ID, TransactionAbortableError, "CommitFailedException"),
        (Errors.FENCED_MEMBER_EPOCH, TransactionAbortableError, "CommitFailedException"),
        (Errors.STALE_MEMBER_EPOCH, TransactionAbortableError, "CommitFailedException"),
        (Errors.FENCED_INSTANCE_ID, TransactionAbortableError, "CommitFailedException"),
        (Errors.PRODUCER_FENCED, ProducerFencedError, None),
        (Errors.INVALID_PRODUCER_EPOCH, ProducerFencedError, None),
        (Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TransactionFatalError, None),
        (Errors.UNSUPPORTED_VERSION, TransactionFatalError, None),
    ],
)
def test_txn_offset_commit_refusals(code: Errors, error: type[Exception], name: str | None) -> None:
    txn = in_transaction()
    txn.begin_send_offsets(GROUP)
    txn.begin_offset_commit({T0: 5})
    with pytest.raises(error) as raised:
        txn.on_txn_offset_commit({T0: code}, "g")
    if name is not None:
        assert raised.value.name == name  # type: ignore[attr-defined]
    assert not txn.pending_offsets


def test_group_coordinator_errors() -> None:
    txn = in_transaction()
    with pytest.raises(TransactionAbortableError):
        txn.on_group_coordinator_error(Errors.GROUP_AUTHORIZATION_FAILED, "g", "no")
    txn = in_transaction()
    with pytest.raises(TransactionFatalError):
        txn.on_group_coordinator_error(Errors.INVALID_REQUEST, "g", "no")


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="transactional_id"):
        TransactionManager("", Sequencing(True, transactional=True))
    with pytest.raises(ValueError, match="timeout"):
        TransactionManager("tx", Sequencing(True, transactional=True), transaction_timeout_ms=0)
    with pytest.raises(ValueError, match="transactional"):
        TransactionManager("tx", Sequencing(True))
    with pytest.raises(ValueError, match="idempotent"):
        Sequencing(False, transactional=True)
    with pytest.raises(ValueError, match="no group"):
        in_transaction().begin_send_offsets(ConsumerGroupMetadata(""))


# -- the accumulator under a transaction ---------------------------------------------------

CONFIG = ProducerConfig(linger_ms=0)
LEADERS = {T0: 1, T1: 1}


def accumulator() -> tuple[RecordAccumulator, TransactionManager]:
    txn = ready()
    acc = RecordAccumulator(CONFIG, random.Random(0), transactions=txn)
    return acc, txn


def test_a_batch_waits_for_its_partition_then_is_transactional() -> None:
    acc, txn = accumulator()
    txn.begin_transaction()
    acc.append("t", b"k", b"v", now_ms=0, partitions=2, partition=0)
    txn.maybe_add_partition(T0)
    assert acc.ready(0, LEADERS).nodes == frozenset()
    assert acc.drain(0, LEADERS, [1]) == {}
    txn.on_add_partitions(dict.fromkeys(txn.partitions_to_add(), Errors.NONE))
    assert acc.ready(0, LEADERS).nodes == {1}
    request = acc.drain(0, LEADERS, [1])[1]
    (batch,) = request.batches
    header = next(iter(BatchScanner(request.payloads()[T0]))).header
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 0, 0)
    acc.on_answer(batch, ProduceAnswer(Errors.NONE, 0), 1)
    assert batch.done and acc.incomplete == 0


def test_the_next_epoch_starts_every_partition_at_sequence_zero() -> None:
    acc, txn = accumulator()
    for epoch in range(3):
        txn.begin_transaction()
        for _ in range(2):
            acc.append("t", None, b"v", now_ms=0, partitions=2, partition=0)
            acc.begin_flush()
        txn.maybe_add_partition(T0)
        txn.on_add_partitions(dict.fromkeys(txn.partitions_to_add(), Errors.NONE))
        (batch,) = acc.drain(0, LEADERS, [1])[1].batches
        assert (batch.producer_epoch, batch.base_sequence) == (epoch, 0)
        acc.on_answer(batch, ProduceAnswer(Errors.NONE, 0), 1)
        txn.begin_commit()
        txn.on_end_txn(Errors.NONE, 7, epoch + 1)


def test_an_abort_drops_the_batches_not_awaiting_answers() -> None:
    acc, txn = accumulator()
    txn.begin_transaction()
    sent = acc.append("t", None, b"a", now_ms=0, partitions=2, partition=0)
    txn.maybe_add_partition(T0)
    txn.on_add_partitions(dict.fromkeys(txn.partitions_to_add(), Errors.NONE))
    (batch,) = acc.drain(0, LEADERS, [1])[1].batches
    queued = acc.append("t", None, b"b", now_ms=0, partitions=2, partition=1)
    txn.begin_abort()
    dropped = acc.abort_undrained("the transaction is being aborted")
    assert [b.topic_partition for b in dropped] == [T1]
    assert queued.error is not None and queued.error.name == TRANSACTION_ABORTED
    assert queued.outcome is Outcome.FAIL
    assert not sent.done and acc.incomplete == 1
    # A retry decided for the batch in flight is dropped by the next pass.
    acc.on_answer(batch, ProduceAnswer(Errors.NOT_ENOUGH_REPLICAS), 1)
    assert not sent.done
    assert acc.abort_undrained("again") == [batch]
    assert sent.error is not None and acc.incomplete == 0


def test_a_transactional_producer_never_bumps_its_epoch_itself() -> None:
    acc, txn = accumulator()
    txn.begin_transaction()
    acc.append("t", None, b"a", now_ms=0, partitions=2, partition=0)
    txn.maybe_add_partition(T0)
    txn.on_add_partitions(dict.fromkeys(txn.partitions_to_add(), Errors.NONE))
    (batch,) = acc.drain(0, LEADERS, [1])[1].batches
    # UNKNOWN_PRODUCER_ID would bump an idempotent producer's epoch and
    # retry; a transactional one fails the batch (the transaction aborts).
    result = acc.on_answer(batch, ProduceAnswer(Errors.UNKNOWN_PRODUCER_ID, -1, 0), 1)
    assert result.decision.value == "fail" and batch.done
    assert acc.sequencing.maybe_bump() == [] and txn.producer.epoch == 0
    txn.on_batch_failed(batch.futures[0].error)  # type: ignore[arg-type]
    assert txn.state is S.ABORTABLE_ERROR
