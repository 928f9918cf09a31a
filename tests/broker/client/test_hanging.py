"""The find-hanging decision (broker.client.hanging, Kafka's
FindHangingTransactionsCommand): which open transactions are candidates,
and each reason a candidate hangs or does not."""

from __future__ import annotations

import pytest

from broker.client.hanging import (
    ACTIVE_STATES,
    TRANSACTION_STATES,
    OpenTransaction,
    ProducerState,
    TransactionDescription,
    candidates,
    hanging_reason,
    select_hanging,
)
from broker.client.producer_batch import TopicPartition

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)
NOW = 10_000_000
TIMEOUT = 900_000


def producer(pid: int, *, start: int = 5, last: int = NOW - TIMEOUT - 1) -> ProducerState:
    return ProducerState(pid, 3, 7, last, 2, start)


def described(
    pid: int = 11, state: str = "Ongoing", partitions: tuple[TopicPartition, ...] = (TP,)
) -> TransactionDescription:
    return TransactionDescription("tx", 1, state, pid, 3, 60_000, NOW - 5_000, partitions)


def test_candidates_are_open_transactions_older_than_the_timeout() -> None:
    found = candidates(
        {
            TP: [
                producer(11),  # open, older than the timeout: a candidate
                producer(12, last=NOW - TIMEOUT),  # exactly the timeout: not older
                producer(13, start=-1),  # no open transaction
                producer(14, last=NOW - 1_000),  # open, recent
            ],
            OTHER: [producer(9, start=40)],
        },
        NOW,
        TIMEOUT,
    )
    assert [(c.partition, c.producer.producer_id, c.start_offset) for c in found] == [
        (TP, 11, 5),
        (OTHER, 9, 40),
    ]
    assert found[0].duration_ms(NOW) == TIMEOUT + 1


def test_a_zero_timeout_makes_every_open_transaction_a_candidate() -> None:
    found = candidates({TP: [producer(1, last=NOW - 1), producer(2, start=-1)]}, NOW, 0)
    assert [c.producer.producer_id for c in found] == [1]
    with pytest.raises(ValueError, match=">= 0"):
        candidates({}, NOW, -1)


@pytest.mark.parametrize(
    ("tid", "description", "reason"),
    [
        (None, None, "no transactional id has producer id 11"),
        ("tx", None, "transactional id 'tx' no longer exists"),
        ("tx", described(pid=12), "moved on to producer id 12"),
        ("tx", described(state="CompleteCommit"), "'tx' is CompleteCommit"),
        ("tx", described(state="CompleteAbort"), "'tx' is CompleteAbort"),
        ("tx", described(state="Empty", partitions=()), "'tx' is Empty"),
        ("tx", described(state="Dead"), "'tx' is Dead"),
        ("tx", described(partitions=(OTHER,)), "does not include t-0"),
        ("tx", described(state="PrepareAbort", partitions=()), "does not include t-0"),
    ],
)
def test_each_reason_a_candidate_hangs(
    tid: str | None, description: TransactionDescription | None, reason: str
) -> None:
    found = hanging_reason(OpenTransaction(TP, producer(11)), tid, description)
    assert found is not None and reason in found


@pytest.mark.parametrize("state", sorted(ACTIVE_STATES))
def test_a_transaction_its_coordinator_will_end_does_not_hang(state: str) -> None:
    candidate = OpenTransaction(TP, producer(11))
    assert hanging_reason(candidate, "tx", described(state=state, partitions=(OTHER, TP))) is None


def test_select_hanging_keeps_the_order_and_the_reasons() -> None:
    found = [
        OpenTransaction(TP, producer(11)),  # Ongoing with t-0: fine
        OpenTransaction(OTHER, producer(11)),  # the same producer, t-1 not in it
        OpenTransaction(TP, producer(20)),  # no id
        OpenTransaction(TP, producer(30)),  # its id is gone (not described)
    ]
    out = select_hanging(found, {11: "tx", 30: "gone"}, {"tx": described()})
    assert [(h.transaction.partition, h.transaction.producer.producer_id) for h in out] == [
        (OTHER, 11),
        (TP, 20),
        (TP, 30),
    ]
    assert "does not include t-1" in out[0].reason
    assert "no transactional id" in out[1].reason
    assert "no longer exists" in out[2].reason


def test_the_state_names_are_the_coordinators() -> None:
    from broker.txn.types import TransactionState

    assert set(TRANSACTION_STATES) == {s.kafka_name for s in TransactionState}
    assert set(TRANSACTION_STATES) >= ACTIVE_STATES
