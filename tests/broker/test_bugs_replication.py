"""The deliberate bugs of the brokers' replication (``bugs.Bug`` B1-B10, R2,
R9, R10), each at the line of the real code that keeps its rule: with the
bug on the rule is observably broken, with it off the same steps hold.
The simulator's scenarios (``test_sim_scenarios.py``) show the loss each
one causes; these tests show the broken decision itself, on the broker's
service and replicas."""

from __future__ import annotations

import bugs
from broker.errors import Errors
from bugs import Bug
from kqproto import broker_pb2_grpc
from quorum.driver.tls import dial
from tests.broker.images import topic
from tests.broker.test_service import (
    Brokers,
    Certs,
    batch,
    certs,
    fetch,
    part,
    produce,
    run,
    serving,
    values,
)

__all__ = ["certs"]

E = Errors


# -- B10: consumers read up to the LEO ----------------------------------------------------


def test_b10_a_consumer_fetch_reads_past_the_hw(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (1, 2)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            # acks=1: on the leader, not on the follower, so above the HW.
            one = await stub.Produce(produce("t", 0, batch(b"x", b"y"), acks=1))
            assert part(one).error == E.NONE
            answer = part(await stub.Fetch(fetch("t", 0, 0)))
            assert answer.high_watermark == 0 and answer.records == b""
            with bugs.injected(Bug.CONSUME_TO_LEO):
                broken = part(await stub.Fetch(fetch("t", 0, 0)))
            # Records no failover is bound to keep reach the consumer.
            assert broken.high_watermark == 0 and values(broken.records) == [0]
            again = part(await stub.Fetch(fetch("t", 0, 0)))
            assert again.records == b""

    run(body)
