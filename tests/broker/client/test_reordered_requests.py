"""Concurrent Produce requests over gRPC may reach the broker in another
order than they were sent (separate calls keep no order, where Kafka's
requests on one connection do). Two rules keep the log in order:

- until a batch of the epoch is acknowledged (the broker then holds the
  producer's state and refuses anything but the next sequence), a partition
  sends one batch at a time: a broker without the state takes any sequence;
- a batch refused OUT_OF_ORDER_SEQUENCE_NUMBER that was sent while an
  earlier one awaited its answer may have overtaken it: it is retried after
  it, not taken for a gap that needs a new epoch. A real gap still bumps.

Each rule is also broken on purpose to show what it prevents."""

from __future__ import annotations

import random

from broker.client.accumulator import ProduceAnswer, RecordAccumulator
from broker.client.errors import Outcome
from broker.client.producer_batch import ProducerBatch
from broker.client.sequencing import Decision, Sequencing
from broker.errors import Errors
from partition_log.batch import Compression
from tests.broker.client.fake_broker import FakePartition
from tests.broker.client.producer_state import TP, put, send
from tests.broker.client.producer_state import make as make_ordered

PAD = b"." * 25


def make() -> RecordAccumulator:
    """An idempotent producer over a transport that may reorder requests."""
    acc = make_ordered(max_in_flight_requests_per_connection=5)
    sequencing = Sequencing(True, unordered_requests=True)
    sequencing.set_producer_id(9, 3)
    return RecordAccumulator(acc.config, random.Random(0), sequencing)


def established() -> tuple[RecordAccumulator, FakePartition]:
    """A producer whose first batch the broker acknowledged."""
    acc = make()
    log = FakePartition()
    put(acc, b"0")
    (first,) = send(acc)
    answer = log.produce(first.payload(Compression.NONE))
    assert acc.on_answer(first, answer, 1).decision is Decision.COMPLETE
    return acc, log


def produce(log: FakePartition, batch: ProducerBatch) -> ProduceAnswer:
    return log.produce(batch.payload(Compression.NONE))


def test_over_an_ordered_transport_both_rules_are_off() -> None:
    """Kafka's client, whose requests on one connection keep their order."""
    acc = make_ordered()
    put(acc, b"a"), put(acc, b"b")
    (a,) = send(acc)
    (b,) = send(acc)
    assert not b.sent_behind


def test_the_first_batch_of_an_epoch_goes_alone() -> None:
    acc = make()
    put(acc, b"a"), put(acc, b"b")
    (a,) = send(acc)
    assert send(acc) == []  # b waits for a's answer
    acc.on_answer(a, ProduceAnswer(base_offset=0), 1)
    (b,) = send(acc)
    assert b.base_sequence == 1
    # Established: the next ones are pipelined.
    put(acc, b"c"), put(acc, b"d")
    assert len(send(acc)) == 1 and len(send(acc)) == 1


def test_without_it_a_later_batch_lands_first() -> None:
    """The rule broken on purpose: both sent at once, the broker takes the
    second first (it has no state for the producer) and the log is out of
    order."""
    acc = make()
    log = FakePartition()
    put(acc, b"a"), put(acc, b"b")
    (a,) = send(acc)
    acc.sequencing.unordered_requests = False  # the rule broken on purpose
    (b,) = send(acc)
    assert produce(log, b).error is Errors.NONE
    assert produce(log, a).error is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.values() == [b"b" + PAD]


def test_a_batch_that_overtook_an_earlier_one_is_retried_after_it() -> None:
    acc, log = established()
    first, second = put(acc, b"a"), put(acc, b"b")
    (a,) = send(acc)
    (b,) = send(acc)
    assert not a.sent_behind and b.sent_behind
    # The broker takes b first (refused: it expects a's sequence), then a.
    refused = produce(log, b)
    assert refused.error is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    accepted = produce(log, a)
    # The answers come back in the order sent.
    assert acc.on_answer(a, accepted, 2).decision is Decision.COMPLETE
    assert acc.on_answer(b, refused, 2).decision is Decision.RETRY
    assert not acc.sequencing.bump_required(TP)
    (retry,) = send(acc, 3)
    assert retry is b and not retry.sent_behind
    assert acc.on_answer(b, produce(log, b), 4).decision is Decision.COMPLETE
    assert (first.offset, second.offset) == (1, 2)
    assert first.outcome is second.outcome is Outcome.OK
    assert log.values() == [b"0" + PAD, b"a" + PAD, b"b" + PAD]
    assert acc.sequencing.bumps == 0


def test_without_it_the_overtaken_batch_is_taken_for_a_gap() -> None:
    """The rule broken on purpose: read as the next expected batch refused,
    it asks for a new epoch."""
    acc, log = established()
    put(acc, b"a"), put(acc, b"b")
    (a,) = send(acc)
    (b,) = send(acc)
    refused = produce(log, b)
    acc.on_answer(a, produce(log, a), 2)
    b.sent_behind = False
    acc.on_answer(b, refused, 2)
    assert acc.sequencing.bump_required(TP) or acc.sequencing.bumps == 1


def test_a_real_gap_still_bumps_once_the_batch_is_sent_first() -> None:
    acc, _ = established()
    put(acc, b"a"), put(acc, b"b")
    (a,) = send(acc)
    (b,) = send(acc)
    acc.on_answer(a, ProduceAnswer(base_offset=1), 2)
    out_of_order = ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, log_start_offset=0)
    assert acc.on_answer(b, out_of_order, 2).decision is Decision.RETRY
    (retry,) = send(acc, 3)
    assert retry is b and not retry.sent_behind
    acc.on_answer(b, out_of_order, 4)
    assert acc.sequencing.bump_required(TP) or acc.sequencing.bumps == 1
