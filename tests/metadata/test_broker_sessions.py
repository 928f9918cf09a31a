"""Broker sessions across a controller failover: a session the new active
controller granted when it took over keeps the broker from being fenced,
but only a session it heard the broker on refuses another incarnation's
registration (metadata/heartbeats.py, metadata/cluster_control.py; Kafka's
``BrokerHeartbeatManager`` and ``ClusterControlManager.registerBroker``)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import pytest

from metadata.controller import Controller, ControllerOptions
from metadata.errors import ApiError, Errors
from tests.metadata.controller_model import CLUSTER_ID, Harness, register_request

SESSION_MS = 9_000


@contextlib.contextmanager
def refused(code: Errors, *fragments: str) -> Iterator[None]:
    with pytest.raises(ApiError) as info:
        yield
    assert info.value.code is code, info.value
    missing = [f for f in fragments if f not in info.value.message]
    assert not missing, f"{missing} not in {info.value.message!r}"


def failover(h: Harness) -> None:
    """A new active controller takes over from the committed image (the
    harness commits everything it writes); its sessions are its own."""
    committed = h.image
    h.epoch += 1
    h.controller = Controller(
        ControllerOptions(CLUSTER_ID, session_timeout_ms=SESSION_MS), random.Random(h.epoch)
    )
    h.controller.next_offset = h.offset
    h.write(h.controller.activate(committed, h.now_ms))


def restarted_cluster() -> Harness:
    """Three unfenced brokers, then a failover a moment later (a whole
    cluster restarted: the new controller has heard from no broker)."""
    h = Harness(session_timeout_ms=SESSION_MS)
    h.add_brokers(1, 2, 3)
    h.advance(1_000)
    failover(h)
    h.advance(100)
    return h


def test_a_new_incarnation_registers_at_once_after_a_failover() -> None:
    h = restarted_cluster()
    old = h.image.brokers[1]
    epoch = h.register(1, incarnation="after-restart", previous_broker_epoch=old.epoch)
    b = h.image.brokers[1]
    assert (b.incarnation_id, b.epoch, b.fenced) == ("after-restart", epoch, True)
    assert epoch > old.epoch
    # So do the others, one after the other, well within a session.
    for broker_id in (2, 3):
        h.register(broker_id, incarnation=f"after-restart-{broker_id}")
        assert h.image.brokers[broker_id].incarnation_id == f"after-restart-{broker_id}"
    # And each is unfenced by its first caught-up heartbeat.
    assert not h.heartbeat(1).is_fenced


def test_a_fenced_broker_registers_at_once_after_a_failover() -> None:
    """The brokers of a cluster stopped under control are fenced in the
    image the new controller takes over."""
    h = Harness(session_timeout_ms=SESSION_MS)
    h.add_brokers(1, 2, 3)
    h.fence(2)
    assert h.image.brokers[2].fenced
    failover(h)
    h.register(2, incarnation="back")
    assert h.image.brokers[2].incarnation_id == "back"


def test_the_granted_session_still_keeps_brokers_from_being_fenced() -> None:
    """KAFKA-18138: the session a new controller grants on taking over is
    what keeps a live broker that has not yet found it from being fenced."""
    h = restarted_cluster()
    h.advance(SESSION_MS - 200)
    assert h.decide(lambda c: c.fence_expired(h.now_ms, limit=3)).records == []
    h.advance(200)
    assert h.decide(lambda c: c.fence_expired(h.now_ms, limit=3)).response == [1, 2, 3]


def test_a_session_heard_by_the_new_controller_refuses_another_incarnation() -> None:
    h = restarted_cluster()
    # The old incarnation finds the new controller: its session is alive here.
    assert not h.heartbeat(1).is_fenced
    h.advance(SESSION_MS - 1)
    with refused(Errors.DUPLICATE_BROKER_REGISTRATION, "broker 1", "incarnation-1"):
        h.decide(lambda c: c.register_broker(register_request(1, incarnation="x"), h.now_ms))
    # The same incarnation may register again (a retry).
    h.register(1)
    assert h.image.brokers[1].incarnation_id == "incarnation-1"
    # Once that heard session has passed, another incarnation may register.
    h.advance(SESSION_MS)
    h.register(1, incarnation="x")
    assert h.image.brokers[1].incarnation_id == "x"


def test_a_registration_heard_by_the_new_controller_refuses_another_incarnation() -> None:
    """Two processes started with one broker id after a failover: the first
    registers, the second is refused while the first's session lives."""
    h = restarted_cluster()
    h.register(1, incarnation="first")
    with refused(Errors.DUPLICATE_BROKER_REGISTRATION, "first"):
        h.decide(lambda c: c.register_broker(register_request(1, incarnation="second"), h.now_ms))
    # Refused, it wrote nothing: the first incarnation stays registered.
    assert h.image.brokers[1].incarnation_id == "first"
    assert h.state_machine().image.brokers[1].incarnation_id == "first"
