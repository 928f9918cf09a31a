"""The idempotent producer's reading of every answer (Kafka's
TransactionManager and Sender.canRetry), and which outcomes are definite."""

from __future__ import annotations

import random

import pytest

from broker.client.accumulator import ProduceAnswer, RecordAccumulator
from broker.client.errors import MAY_HAVE_WRITTEN, NETWORK_EXCEPTION, RETRIABLE, Outcome
from broker.client.producer_batch import ProducerBatch, ProducerConfig
from broker.client.sequencing import Decision, Sequencing
from broker.errors import Errors
from tests.broker.client.producer_state import (
    LEADERS,
    TP,
    header_of,
    make,
    make_kafka,
    put,
    resend_after_a_timeout,
    send,
    send_all,
    send_one,
    send_two,
)

# -- success --------------------------------------------------------------------


def test_success_resolves_each_record_at_base_offset_plus_index() -> None:
    acc = make(batch_size=1000)
    futures = [put(acc, b"a"), put(acc, b"b"), put(acc, b"c")]
    (batch,) = send(acc)
    result = acc.on_answer(batch, ProduceAnswer(base_offset=100), 1)
    assert result.decision is Decision.COMPLETE
    assert [f.offset for f in futures] == [100, 101, 102]
    assert all(f.outcome is Outcome.OK for f in futures)
    assert acc.sequencing.last_acked_sequence(TP) == 2


def test_duplicate_sequence_number_is_a_success_without_offsets() -> None:
    acc = make()
    future, batch = send_one(acc)
    acc.on_answer(batch, ProduceAnswer(Errors.DUPLICATE_SEQUENCE_NUMBER), 1)
    assert future.outcome is Outcome.OK and future.offset == -1 and future.error is None


def test_futures_resolve_once() -> None:
    acc = make()
    future, batch = send_one(acc)
    acc.on_answer(batch, ProduceAnswer(base_offset=5), 1)
    # A second answer to the same batch changes nothing.
    result = acc.on_answer(batch, ProduceAnswer(Errors.MESSAGE_TOO_LARGE), 2)
    assert result.decision is Decision.IGNORED
    assert future.offset == 5
    with pytest.raises(RuntimeError, match="resolved twice"):
        future._resolve(6, None, Outcome.OK)


# -- retriable errors --------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(RETRIABLE))
def test_retriable_errors_retry_with_the_same_epoch_and_sequence(code: int) -> None:
    acc = make()
    _, batch = send_one(acc)
    before = header_of(batch)
    if code == NETWORK_EXCEPTION:
        result = acc.on_network_failure(batch, 1)
    else:
        result = acc.on_answer(batch, ProduceAnswer(Errors(code)), 1)
    assert result.decision is Decision.RETRY
    (again,) = send(acc, 2)
    assert again is batch and header_of(again) == before
    assert batch.maybe_written is (code in MAY_HAVE_WRITTEN)


@pytest.mark.parametrize(
    "code", [Errors.NOT_LEADER_OR_FOLLOWER, Errors.FENCED_LEADER_EPOCH, NETWORK_EXCEPTION]
)
def test_leadership_errors_ask_for_a_metadata_refresh(code: int) -> None:
    acc = make()
    _, batch = send_one(acc)
    if code == NETWORK_EXCEPTION:
        result = acc.on_network_failure(batch, 1)
    else:
        result = acc.on_answer(batch, ProduceAnswer(Errors(code)), 1)
    assert result.refresh_metadata


def test_the_kip_951_leader_hint_is_passed_on() -> None:
    acc = make()
    _, batch = send_one(acc)
    answer = ProduceAnswer(Errors.NOT_LEADER_OR_FOLLOWER, current_leader=2, current_leader_epoch=8)
    assert acc.on_answer(batch, answer, 1).leader_hint == (2, 8)


def test_a_late_answer_is_ignored() -> None:
    acc = make()
    future, batch = send_one(acc)
    acc.on_network_failure(batch, 1)
    # The real answer arrives after the batch was queued again.
    result = acc.on_answer(batch, ProduceAnswer(base_offset=3), 2)
    assert result.decision is Decision.IGNORED and not future.done


@pytest.mark.parametrize(
    ("answers", "outcome"),
    [
        ([Errors.NOT_ENOUGH_REPLICAS, Errors.NOT_ENOUGH_REPLICAS], Outcome.FAIL),
        ([Errors.REQUEST_TIMED_OUT, Errors.NOT_ENOUGH_REPLICAS], Outcome.INFO),
        ([Errors.NOT_ENOUGH_REPLICAS, Errors.NOT_LEADER_OR_FOLLOWER], Outcome.INFO),
        ([Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND, Errors.UNKNOWN_LEADER_EPOCH], Outcome.INFO),
    ],
)
def test_a_failure_is_definite_only_if_no_attempt_may_have_been_written(
    answers: list[Errors], outcome: Outcome
) -> None:
    acc = make(retries=len(answers) - 1)
    future = put(acc, b"a")
    for now, code in enumerate(answers):
        (batch,) = send(acc, now)
        acc.on_answer(batch, ProduceAnswer(code), now)
    assert future.error is not None
    assert future.error.name == answers[-1].name
    assert future.outcome is outcome


# -- non-retriable errors ----------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        Errors.MESSAGE_TOO_LARGE,
        Errors.RECORD_LIST_TOO_LARGE,
        Errors.INVALID_PRODUCER_EPOCH,
        Errors.INVALID_RECORD,
        Errors.CLUSTER_AUTHORIZATION_FAILED,
        Errors.UNSUPPORTED_COMPRESSION_TYPE,
    ],
)
def test_fatal_errors_fail_definitely_and_bump_the_epoch(code: Errors) -> None:
    acc = make()
    (future, later), (first, second) = send_two(acc)
    acc.on_answer(first, ProduceAnswer(code), 1)
    assert future.outcome is Outcome.FAIL and future.error is not None
    assert future.error.name == code.name and "t-0" in future.error.message
    # The gap asks for a new epoch; it comes once nothing awaits an answer.
    assert acc.sequencing.bump_required(TP)
    assert send(acc, 2) == []
    acc.on_answer(second, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 3)
    (again,) = send(acc, 4)
    assert again is second and header_of(again) == (9, 4, 0)
    acc.on_answer(again, ProduceAnswer(base_offset=0), 5)
    assert later.outcome is Outcome.OK


def test_unknown_server_error_fails_as_unknown() -> None:
    acc = make()
    future, batch = send_one(acc)
    acc.on_answer(batch, ProduceAnswer(Errors.UNKNOWN_SERVER_ERROR), 1)
    assert future.outcome is Outcome.INFO


# -- OUT_OF_ORDER_SEQUENCE_NUMBER and UNKNOWN_PRODUCER_ID (KIP-360) ---------------


def test_out_of_order_for_the_next_batch_bumps_the_epoch_and_retries() -> None:
    acc = make()
    future, batch = send_one(acc)
    result = acc.on_answer(batch, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 1)
    assert result.decision is Decision.RETRY
    (again,) = send(acc, 2)
    assert header_of(again) == (9, 4, 0)
    assert acc.sequencing.bumps == 1
    acc.on_answer(again, ProduceAnswer(base_offset=0), 3)
    assert future.outcome is Outcome.OK


def test_out_of_order_after_a_maybe_written_attempt_fails_as_unknown() -> None:
    # A new sequence for a batch that may be in the log could duplicate it
    # (Redpanda #3039): kq fails it rather than bumping and resending.
    acc = make()
    future, batch = send_one(acc)
    batch = resend_after_a_timeout(acc, batch)
    result = acc.on_answer(batch, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 3)
    assert result.decision is Decision.FAIL
    assert future.outcome is Outcome.INFO
    assert acc.sequencing.bump_required(TP)


def test_out_of_order_behind_a_later_batch_that_may_be_written_fails() -> None:
    # A broker without state for the producer takes any sequence: a later
    # batch can be in the log first; resending the earlier one under a new
    # epoch would put it after that one.
    acc = make()
    (first_future, _), (first, second) = send_two(acc)
    acc.on_answer(second, ProduceAnswer(Errors.NOT_LEADER_OR_FOLLOWER), 1)
    acc.on_answer(first, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 1)
    assert first_future.outcome is Outcome.FAIL
    # The second, which may be in the log, is not resent under a new epoch.
    send(acc, 2)
    failed = acc.take_failed()
    assert failed == [second] and second.futures[0].outcome is Outcome.INFO


def test_kafka_out_of_order_resends_a_maybe_written_batch_under_a_new_epoch() -> None:
    # TransactionManager.canRetry: the next expected batch refused out of
    # order is retried under a bumped epoch from sequence 0, even after an
    # attempt that may be in the log (where kq's default fails it, above).
    acc = make_kafka()
    future, batch = send_one(acc)
    batch = resend_after_a_timeout(acc, batch)
    assert header_of(batch) == (9, 3, 0)
    result = acc.on_answer(batch, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 3)
    assert result.decision is Decision.RETRY
    (again,) = send(acc, 4)
    assert header_of(again) == (9, 4, 0)
    assert acc.sequencing.bumps == 1 and acc.take_failed() == []
    acc.on_answer(again, ProduceAnswer(base_offset=7), 5)
    assert future.outcome is Outcome.OK


def test_kafka_out_of_order_resends_every_later_batch_in_order() -> None:
    # The later batches, which timed out too, go again after it from
    # sequence 1 of the new epoch (startSequencesAtBeginning).
    acc = make_kafka()
    _, (first, second) = send_two(acc)
    acc.on_answer(first, ProduceAnswer(Errors.REQUEST_TIMED_OUT), 1)
    acc.on_answer(second, ProduceAnswer(Errors.REQUEST_TIMED_OUT), 1)
    (retry,) = send(acc, 2)
    assert retry is first
    acc.on_answer(first, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 3)
    assert send_all(acc, 4) == [first, second]
    assert [header_of(b) for b in (first, second)] == [(9, 4, 0), (9, 4, 1)]
    assert acc.take_failed() == []


def test_kafka_out_of_order_fails_the_batch_once_it_may_not_retry() -> None:
    acc = make_kafka()
    future, batch = send_one(acc)
    batch = resend_after_a_timeout(acc, batch)
    late = acc.config.delivery_timeout_ms + 1
    result = acc.on_answer(batch, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), late)
    assert result.decision is Decision.FAIL
    assert future.outcome is Outcome.INFO


def test_out_of_order_below_the_acknowledged_sequence_fails_at_once() -> None:
    acc = make()
    (first_future, _), (first, second) = send_two(acc)
    acc.on_answer(first, ProduceAnswer(Errors.NOT_ENOUGH_REPLICAS), 1)
    acc.on_answer(second, ProduceAnswer(base_offset=0), 1)  # taken: no state
    (again,) = send(acc, 2)
    result = acc.on_answer(again, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 3)
    assert result.decision is Decision.FAIL
    assert first_future.outcome is Outcome.FAIL


def test_out_of_order_for_a_batch_after_a_gap_retries_without_a_bump() -> None:
    acc = make()
    _, (first, second) = send_two(acc)
    acc.on_answer(first, ProduceAnswer(Errors.NOT_ENOUGH_REPLICAS), 1)
    result = acc.on_answer(second, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 1)
    assert result.decision is Decision.RETRY
    assert not acc.sequencing.bump_required(TP)
    assert send(acc, 2) == [first]
    acc.on_answer(first, ProduceAnswer(base_offset=0), 3)
    assert send(acc, 4) == [second]
    assert header_of(second)[1:] == (3, 1)


def test_unknown_producer_id_without_log_start_retries_as_is() -> None:
    acc = make()
    _, batch = send_one(acc)
    acc.on_answer(batch, ProduceAnswer(Errors.UNKNOWN_PRODUCER_ID, log_start_offset=-1), 1)
    assert not acc.sequencing.bump_required(TP)
    (again,) = send(acc, 2)
    assert header_of(again) == (9, 3, 0)


def test_unknown_producer_id_bumps_the_epoch() -> None:
    acc = make()
    _, batch = send_one(acc)
    acc.on_answer(batch, ProduceAnswer(Errors.UNKNOWN_PRODUCER_ID, log_start_offset=10), 1)
    (again,) = send(acc, 2)
    assert header_of(again) == (9, 4, 0)


def test_the_bump_waits_for_batches_awaiting_answers() -> None:
    acc = make()
    _, (first, second) = send_two(acc)
    acc.on_answer(first, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 1)
    # The second still awaits: no bump yet, and nothing is ready meanwhile.
    assert acc.ready(2, LEADERS).nodes == frozenset()
    assert send(acc, 2) == []
    assert acc.sequencing.producer.epoch == 3
    acc.on_answer(second, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 3)
    a, b = send_all(acc, 4)
    assert (header_of(a), header_of(b)) == ((9, 4, 0), (9, 4, 1))


def test_a_spent_epoch_needs_a_new_producer_id() -> None:
    acc = make()
    acc.sequencing.set_producer_id(9, 2**15 - 1)
    _, batch = send_one(acc)
    acc.on_answer(batch, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 1)
    assert send(acc, 2) == []
    assert acc.sequencing.needs_producer_id
    acc.sequencing.set_producer_id(10, 0)
    (again,) = send(acc, 3)
    assert header_of(again) == (10, 0, 0)


def test_no_batch_is_sent_before_a_producer_id() -> None:
    acc = RecordAccumulator(ProducerConfig(linger_ms=0), random.Random(0))
    put(acc, b"a")
    assert acc.sequencing.needs_producer_id
    assert acc.ready(0, LEADERS).nodes == frozenset()
    assert send(acc) == []
    acc.sequencing.set_producer_id(1, 0)
    assert len(send(acc)) == 1
    with pytest.raises(ValueError, match="invalid producer id"):
        acc.sequencing.set_producer_id(-1, 0)


def test_new_batches_wait_while_older_epoch_batches_are_in_flight() -> None:
    seq = Sequencing(idempotent=True)
    seq.set_producer_id(1, 0)
    old = ProducerBatch(TP, 0)
    seq.assign(old)
    seq.set_producer_id(1, 1)  # the epoch moved on (another partition's bump)
    fresh = ProducerBatch(TP, 0)
    assert not seq.may_drain(fresh)
    seq.completed(old, 0)
    assert seq.may_drain(fresh)
    seq.assign(fresh)
    assert (fresh.producer_epoch, fresh.base_sequence) == (1, 0)


def test_without_idempotence_nothing_is_sequenced() -> None:
    acc = make(idempotent=False, acks=1)
    future, batch = send_one(acc)
    assert header_of(batch) == (-1, -1, -1)
    assert acc.on_answer(batch, ProduceAnswer(Errors.NOT_LEADER_OR_FOLLOWER), 1).decision is (
        Decision.RETRY
    )
    (batch,) = send(acc, 2)
    acc.on_answer(batch, ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 3)
    assert future.outcome is Outcome.INFO  # the first attempt may have been written


def test_sequences_wrap_after_int32_max() -> None:
    # DefaultRecordBatch.incrementSequence: 0 follows 2^31-1.
    seq = Sequencing(idempotent=True)
    seq.set_producer_id(1, 0)
    first = ProducerBatch(TP, 0)
    first.records.extend([object(), object(), object()])  # type: ignore[list-item]
    seq._entry(TP).next_sequence = 2**31 - 2
    seq.assign(first)
    assert first.base_sequence == 2**31 - 2
    assert seq.next_sequence(TP) == 1
    assert first.last_sequence == 0
