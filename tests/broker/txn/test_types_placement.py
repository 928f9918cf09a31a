"""The transaction states' allowed transitions are Kafka's
(``TransactionState.validPreviousStates``), and a transactional id's
partition of ``__transaction_state`` is Kafka's (``partitionFor``)."""

from __future__ import annotations

import pytest

from broker.txn.placement import TRANSACTION_STATE_TOPIC, partition_for
from broker.txn.types import TransactionState, is_epoch_exhausted
from metadata.image import INTERNAL_TOPICS

S = TransactionState

# TransactionState.java, written out.
KAFKA_PREVIOUS = {
    S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.PREPARE_COMMIT: {S.ONGOING},
    S.PREPARE_ABORT: {
        S.ONGOING,
        S.PREPARE_EPOCH_FENCE,
        S.EMPTY,
        S.COMPLETE_COMMIT,
        S.COMPLETE_ABORT,
    },
    S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
    S.COMPLETE_ABORT: {S.PREPARE_ABORT},
    S.DEAD: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.PREPARE_EPOCH_FENCE: {S.ONGOING},
}


@pytest.mark.parametrize("state", list(S), ids=lambda s: s.name)
def test_valid_previous_states_are_kafkas(state: TransactionState) -> None:
    assert state.valid_previous_states == KAFKA_PREVIOUS[state]
    for previous in S:
        assert state.can_follow(previous) == (previous in KAFKA_PREVIOUS[state])


def test_ids_and_names_are_kafkas() -> None:
    assert [(s.value, s.kafka_name) for s in S] == [
        (0, "Empty"),
        (1, "Ongoing"),
        (2, "PrepareCommit"),
        (3, "PrepareAbort"),
        (4, "CompleteCommit"),
        (5, "CompleteAbort"),
        (6, "Dead"),
        (7, "PrepareEpochFence"),
    ]


def test_epoch_exhaustion() -> None:
    assert not is_epoch_exhausted(32765)
    assert is_epoch_exhausted(32766)
    assert is_epoch_exhausted(32767)


def test_partition_for_is_kafkas() -> None:
    # "hello".hashCode() == 99162322 in Java.
    assert partition_for("hello", 50) == 99162322 % 50
    # "polygenelubricants".hashCode() == Integer.MIN_VALUE: Utils.abs maps
    # it to 0, where abs() would overflow.
    assert partition_for("polygenelubricants", 50) == 0
    with pytest.raises(ValueError, match="partition count 0 is not positive"):
        partition_for("t", 0)


def test_the_transaction_log_is_internal() -> None:
    assert TRANSACTION_STATE_TOPIC == "__transaction_state"
    assert TRANSACTION_STATE_TOPIC in INTERNAL_TOPICS
