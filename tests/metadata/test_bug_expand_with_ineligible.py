"""B8 of the catalogue (KIP-841, KIP-903): the controller takes a fenced,
shutting-down, unregistered or stale-epoch replica into the ISR. With the
bug off it answers INELIGIBLE_REPLICA and the ISR stays as it was; with it
on the ISR holds a broker that may not be there, and a restarted replica
the leader proposed under its old broker epoch (its new incarnation may
have lost its unsynced tail) becomes a clean candidate and is elected."""

from __future__ import annotations

import pytest

import bugs
from bugs import Bug
from metadata.errors import Errors
from tests.metadata.controller_model import Harness, image_violations

MIN_ISR = "min.insync.replicas"


def _setup() -> Harness:
    """t-0 on (1, 2, 3, 4, 5) led by 1 with ISR (1,); 2 fenced, 3 shutting
    down, 4 unregistered, 5 active."""
    h = Harness()
    h.add_brokers(1, 2, 3, 4, 5)
    h.create_topic("t", assignments={0: (1, 2, 3, 4, 5)}, configs={MIN_ISR: "1"})
    h.alter_partition("t", 0, [1])
    h.fence(2)
    h.heartbeat(3, want_shutdown=True)
    h.run(lambda c: c.unregister_broker(4))
    return h


@pytest.mark.parametrize(
    ("broker", "why"), [(2, "is fenced"), (3, "is shutting down"), (4, "is not registered")]
)
def test_an_ineligible_replica_may_not_join_the_isr(broker: int, why: str) -> None:
    h = _setup()
    result = h.alter_partition("t", 0, [1, broker])
    assert result.error is Errors.INELIGIBLE_REPLICA, result
    assert f"broker {broker} {why}: it may not join the ISR" in result.message
    assert h.partition("t").isr == (1,)
    assert not image_violations(h.image), image_violations(h.image)


@pytest.mark.parametrize("broker", [2, 3, 4])
def test_b8_an_ineligible_replica_joins_the_isr(broker: int) -> None:
    h = _setup()
    with bugs.injected(Bug.EXPAND_WITH_INELIGIBLE):
        result = h.alter_partition("t", 0, [1, broker])
    assert result.error is Errors.NONE, result
    assert h.partition("t").isr == (1, broker)
    if broker != 3:
        # A fenced or unregistered ISR member: the image's invariant fires.
        assert any(
            f"ISR member {broker} is not a registered unfenced broker" in v
            for v in image_violations(h.image)
        ), image_violations(h.image)


def _stale_proposal(bug: bool) -> tuple[Errors, Harness]:
    """2 leaves the ISR, restarts uncleanly (a new broker epoch) and is back;
    the leader proposes it with the epoch of its old incarnation."""
    h = Harness()
    h.add_brokers(1, 2, 3)
    h.create_topic("t", assignments={0: (1, 2, 3)}, configs={MIN_ISR: "2"})
    h.alter_partition("t", 0, [1, 3])
    old_epoch = h.image.brokers[2].epoch
    h.register(2)
    h.heartbeat(2)
    assert h.image.brokers[2].epoch != old_epoch
    if bug:
        with bugs.injected(Bug.EXPAND_WITH_INELIGIBLE):
            result = h.alter_partition("t", 0, [1, 3, 2], broker_epochs={2: old_epoch})
    else:
        result = h.alter_partition("t", 0, [1, 3, 2], broker_epochs={2: old_epoch})
    return result.error, h


def test_a_stale_broker_epoch_keeps_the_replica_out_and_from_leading() -> None:
    error, h = _stale_proposal(bug=False)
    assert error is Errors.INELIGIBLE_REPLICA
    assert h.partition("t").isr == (1, 3)
    h.fence(1)
    # 3 held every committed record: it leads, not 2.
    assert h.partition("t").leader == 3


def test_b8_a_stale_broker_epoch_is_taken_into_the_isr_and_elected() -> None:
    error, h = _stale_proposal(bug=True)
    assert error is Errors.NONE
    assert h.partition("t").isr == (1, 3, 2)
    h.fence(1)
    # The first ISR member in replica order leads: the restarted 2, which
    # never caught up in its new incarnation.
    p = h.partition("t")
    assert (p.leader, p.isr) == (2, (3, 2))
    assert not image_violations(h.image), image_violations(h.image)
