"""The random histories of test_producer_properties with the core in its
``unordered_requests`` mode (the gRPC driver's): the broker takes the
batches in flight in any order. Safety is the same (each partition's log
exactly once and in append order, outcomes that say what is in the log);
and with reordering the only fault, every record is acknowledged: an
overtaking batch is retried behind the earlier one, never failed."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.client.accumulator import RecordAccumulator
from broker.client.errors import Outcome
from broker.client.producer_batch import ProducerConfig, TopicPartition
from broker.client.sequencing import Sequencing
from tests.broker.client.test_producer_properties import PARTITIONS, History, run, step

CONFIG = ProducerConfig(
    batch_size=80,
    linger_ms=0,
    request_timeout_ms=100,
    delivery_timeout_ms=10**9,
    retry_backoff_ms=10,
    retry_backoff_max_ms=40,
)


class UnorderedHistory(History):
    def __init__(self, config: ProducerConfig, seed: int, unordered: bool = True) -> None:
        super().__init__(config, seed)
        sequencing = Sequencing(True, unordered_requests=unordered)
        sequencing.set_producer_id(1000, 0)
        self.acc = RecordAccumulator(config, random.Random(seed), sequencing)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(step, max_size=80),
    seed=st.integers(0, 2**16),
    short_timeout=st.booleans(),
)
def test_random_answers_in_any_order_keep_the_log_exactly_once_and_in_order(
    steps: list[tuple[str, int, object]], seed: int, short_timeout: bool
) -> None:
    config = dataclasses.replace(CONFIG, delivery_timeout_ms=600 if short_timeout else 10**9)
    run(UnorderedHistory(config, seed), steps)


reordered = st.one_of(
    st.tuples(st.just("append"), st.integers(0, PARTITIONS - 1), st.integers(1, 6)),
    st.tuples(st.just("send"), st.just(0), st.just(0)),
    st.tuples(st.just("answer"), st.integers(0, 20), st.just("ok")),
    st.tuples(st.just("tick"), st.integers(0, 100), st.just(0)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(reordered, max_size=80), seed=st.integers(0, 2**16))
def test_reordering_alone_fails_no_record(steps: list[tuple[str, int, object]], seed: int) -> None:
    history = UnorderedHistory(CONFIG, seed)
    run(history, steps)
    for records in history.appended.values():
        assert all(f.outcome is Outcome.OK for _, f in records)


def test_with_the_ordered_rules_reordering_fails_records() -> None:
    """What the mode prevents: with Kafka's rules the second batch goes out
    beside the first, reaches the broker first and is taken (no state for
    the producer yet: any sequence), and the first fails, refused."""
    steps: list[tuple[str, int, object]] = [
        ("append", 0, 6),
        ("send", 0, 0),
        ("send", 0, 0),
        ("answer", 1, "ok"),  # the second batch reaches the broker first
        ("answer", 0, "ok"),
    ]
    tp = TopicPartition("t", 0)
    ordered = UnorderedHistory(CONFIG, 1, unordered=False)
    run(ordered, steps)
    assert any(f.outcome is Outcome.FAIL for _, f in ordered.appended[tp])
    unordered = UnorderedHistory(CONFIG, 1)
    run(unordered, steps)
    assert all(f.outcome is Outcome.OK for _, f in unordered.appended[tp])
