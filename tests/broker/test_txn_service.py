"""The transaction service (kq.txn.TransactionService) over three in-memory
brokers: malformed requests are refused naming the field and change
nothing; random requests are answered, never raised, and never leave a
transaction open past its timeout; the metadata image's ACLs are enforced
for the caller its certificate names (Write on the transactional id and on
each topic added, Read on the group, ClusterAction for the brokers' own
calls), and a refusal writes nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.errors import Errors
from broker.txn.types import TransactionState
from broker.txn_service import TransactionService
from kqproto import txn_pb2, txn_pb2_grpc
from metadata.acls import CLUSTER_NAME, AclOperation, AclResourceType
from metadata.authorizer import AuthorizerSettings
from quorum.driver.identity import Identity
from quorum.driver.identity import Role as IdentityRole
from quorum.driver.tls import TlsFiles, dial
from server.certs import issue
from tests.broker.images import topic
from tests.broker.test_service import CLUSTER, Certs, acl, certs  # noqa: F401 (fixture)
from tests.broker.test_service_fuzz import PlaintextContext
from tests.broker.txn_cluster import TXN_KEY, TxnBrokers, eventually

E = Errors
TXN_ID = AclResourceType.TRANSACTIONAL_ID
BROKER_2 = Identity.node(CLUSTER, IdentityRole.BROKER, 2)
CTX = PlaintextContext()
TxnTopic = txn_pb2.TxnTopic


def run(body: Callable[[TxnBrokers, TransactionService], Awaitable[None]]) -> None:
    async def main() -> None:
        brokers = TxnBrokers()
        brokers.start()
        try:
            await brokers.loaded(1, groups=True)
            service = TransactionService(brokers.txns[1], brokers.appenders[1])
            await asyncio.wait_for(body(brokers, service), 60)
        finally:
            await brokers.stop()

    asyncio.run(main())


def stored(brokers: TxnBrokers) -> tuple[int, list[Any]]:
    return (
        brokers.log(1, TXN_KEY).log_end_offset,
        [(t.transactional_id, t.state) for t in brokers.txns[1].list_transactions()],
    )


async def initialized(brokers: TxnBrokers, tid: str = "tx") -> tuple[int, int]:
    answer = await brokers.txns[1].init_producer_id(tid, 60_000)
    assert answer.error is E.NONE
    return answer.producer_id, answer.producer_epoch


def add(tid: str, pid: int, epoch: int, *topics: TxnTopic, verify: bool = False) -> Any:
    return txn_pb2.AddPartitionsToTxnRequest(
        transactional_id=tid,
        producer_id=pid,
        producer_epoch=epoch,
        topics=list(topics),
        verify_only=verify,
    )


def test_damaged_requests_are_refused_by_name_and_change_nothing() -> None:
    async def body(brokers: TxnBrokers, service: TransactionService) -> None:
        pid, epoch = await initialized(brokers)
        t0 = TxnTopic(name="t", partitions=[0])
        damaged: list[tuple[str, Callable[[], Awaitable[Any]], Errors, str]] = [
            ("empty id", lambda: service.AddPartitionsToTxn(add("", pid, epoch, t0), CTX),
             E.INVALID_REQUEST, "transactional_id"),
            ("long id", lambda: service.AddPartitionsToTxn(add("x" * 300, pid, epoch, t0), CTX),
             E.INVALID_REQUEST, "transactional_id"),
            ("negative pid", lambda: service.AddPartitionsToTxn(add("tx", -3, epoch, t0), CTX),
             E.INVALID_REQUEST, "producer_id"),
            ("epoch", lambda: service.AddPartitionsToTxn(add("tx", pid, 40000, t0), CTX),
             E.INVALID_REQUEST, "producer_epoch"),
            ("no topics", lambda: service.AddPartitionsToTxn(add("tx", pid, epoch), CTX),
             E.INVALID_REQUEST, "topics"),
            ("no name", lambda: service.AddPartitionsToTxn(
                add("tx", pid, epoch, TxnTopic(partitions=[0])), CTX),
             E.INVALID_REQUEST, "topics[0].name"),
            ("negative partition", lambda: service.AddPartitionsToTxn(
                add("tx", pid, epoch, TxnTopic(name="t", partitions=[-1])), CTX),
             E.INVALID_REQUEST, "partition -1"),
            ("twice", lambda: service.AddPartitionsToTxn(
                add("tx", pid, epoch, TxnTopic(name="t", partitions=[0, 0])), CTX),
             E.INVALID_REQUEST, "named twice"),
            ("no group", lambda: service.AddOffsetsToTxn(txn_pb2.AddOffsetsToTxnRequest(
                transactional_id="tx", producer_id=pid, producer_epoch=epoch), CTX),
             E.INVALID_REQUEST, "group_id"),
            ("end no id", lambda: service.EndTxn(txn_pb2.EndTxnRequest(
                producer_id=pid, producer_epoch=epoch), CTX),
             E.INVALID_REQUEST, "transactional_id"),
            ("marker epoch", lambda: service.WriteTxnMarkers(txn_pb2.WriteTxnMarkersRequest(
                markers=[txn_pb2.TxnMarker(producer_id=pid, producer_epoch=epoch, topics=[t0],
                                           coordinator_epoch=-1)]), CTX),
             E.INVALID_REQUEST, "coordinator_epoch"),
            ("marker version", lambda: service.WriteTxnMarkers(txn_pb2.WriteTxnMarkersRequest(
                markers=[txn_pb2.TxnMarker(producer_id=pid, producer_epoch=epoch, topics=[t0],
                                           transaction_version=3)]), CTX),
             E.INVALID_REQUEST, "markers[0].transaction_version 3 is not 0 to 2"),
            ("marker no topics", lambda: service.WriteTxnMarkers(txn_pb2.WriteTxnMarkersRequest(
                markers=[txn_pb2.TxnMarker(producer_id=pid, producer_epoch=epoch)]), CTX),
             E.INVALID_REQUEST, "markers[0].topics"),
        ]  # fmt: skip
        for name, call, code, field in damaged:
            before = stored(brokers)
            answer = await call()
            assert answer.error == code, (name, answer)
            assert field in answer.message, (name, answer.message)
            assert stored(brokers) == before, name

    run(body)


def test_add_partitions_refuses_unknown_and_internal_topics_as_a_whole() -> None:
    async def body(brokers: TxnBrokers, service: TransactionService) -> None:
        pid, epoch = await initialized(brokers)
        before = stored(brokers)
        answer = await service.AddPartitionsToTxn(
            add(
                "tx",
                pid,
                epoch,
                TxnTopic(name="t", partitions=[0]),
                TxnTopic(name="t", partitions=[9]),
                TxnTopic(name="__transaction_state", partitions=[0]),
            ),
            CTX,
        )
        codes = {(r.name, p.partition): p.error for r in answer.results for p in r.partitions}
        assert codes == {
            ("t", 0): E.OPERATION_NOT_ATTEMPTED,
            ("t", 9): E.UNKNOWN_TOPIC_OR_PARTITION,
            ("__transaction_state", 0): E.INVALID_TOPIC_EXCEPTION,
        }
        assert stored(brokers) == before

    run(body)


names = st.sampled_from(["tx", "tx", "", "other", "x" * 300, "\x00"])
epochs = st.integers(-(2**31), 2**31 - 1)
topics = st.lists(
    st.builds(
        TxnTopic,
        name=st.sampled_from(["t", "", "nope", "__consumer_offsets"]),
        partitions=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3),
    ),
    max_size=2,
)
requests = st.one_of(
    st.builds(
        txn_pb2.AddPartitionsToTxnRequest,
        transactional_id=names,
        producer_id=st.integers(-2, 1005),
        producer_epoch=epochs,
        topics=topics,
        verify_only=st.booleans(),
    ),
    st.builds(
        txn_pb2.AddOffsetsToTxnRequest,
        transactional_id=names,
        producer_id=st.integers(-2, 1005),
        producer_epoch=epochs,
        group_id=st.sampled_from(["g", "", "x" * 300]),
    ),
    st.builds(
        txn_pb2.EndTxnRequest,
        transactional_id=names,
        producer_id=st.integers(-2, 1005),
        producer_epoch=epochs,
        committed=st.booleans(),
    ),
    st.builds(txn_pb2.FindTxnCoordinatorRequest, transactional_ids=st.lists(names, max_size=3)),
    st.builds(txn_pb2.DescribeTransactionsRequest, transactional_ids=st.lists(names, max_size=3)),
    st.builds(
        txn_pb2.ListTransactionsRequest,
        state_filters=st.lists(st.sampled_from(["Ongoing", "Empty", "Bogus", ""]), max_size=2),
        producer_id_filters=st.lists(st.integers(-2, 1005), max_size=2),
        duration_filter_ms=st.integers(-5, 10_000),
    ),
)
_METHODS = {
    txn_pb2.AddPartitionsToTxnRequest: "AddPartitionsToTxn",
    txn_pb2.AddOffsetsToTxnRequest: "AddOffsetsToTxn",
    txn_pb2.EndTxnRequest: "EndTxn",
    txn_pb2.FindTxnCoordinatorRequest: "FindCoordinator",
    txn_pb2.DescribeTransactionsRequest: "DescribeTransactions",
    txn_pb2.ListTransactionsRequest: "ListTransactions",
}


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(requests, min_size=1, max_size=8))
def test_random_requests_are_answered_and_leave_no_transaction_open(batch: list[Any]) -> None:
    async def body(brokers: TxnBrokers, service: TransactionService) -> None:
        await initialized(brokers)
        for request in batch:
            answer = await getattr(service, _METHODS[type(request)])(request, CTX)
            assert answer is not None
        # Whatever the requests opened ends by its timeout (60 s here).
        brokers.now += 120_000
        await eventually(
            lambda: all(
                t.state is not TransactionState.ONGOING and not t.state.is_prepare
                for t in brokers.txns[1].list_transactions()
            )
        )

    run(body)


@contextlib.asynccontextmanager
async def serving(service: TransactionService, issued: Certs) -> AsyncIterator[str]:
    server = grpc.aio.server()
    txn_pb2_grpc.add_TransactionServiceServicer_to_server(service, server)
    paths = issue(
        issued.folder, Identity.node(CLUSTER, IdentityRole.BROKER, 1), hosts=("127.0.0.1",)
    )
    tls = TlsFiles(issued.folder / "ca.crt", paths.cert, paths.key)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def test_transaction_acls(certs: Certs) -> None:  # noqa: F811 (the fixture)
    async def body(brokers: TxnBrokers, _: TransactionService) -> None:
        brokers.step_and_publish(
            *topic("u", "id-u", (1, 2, 3)),
            acl("w", "User:alice", AclOperation.WRITE, "tx", resource=TXN_ID),
            acl("t", "User:alice", AclOperation.WRITE, "t"),
            acl("g", "User:alice", AclOperation.READ, "g", resource=AclResourceType.GROUP),
            acl("c", BROKER_2.principal, AclOperation.CLUSTER_ACTION, CLUSTER_NAME,
                resource=AclResourceType.CLUSTER),
        )  # fmt: skip
        service = TransactionService(
            brokers.txns[1],
            brokers.appenders[1],
            authorizer=AuthorizerSettings(super_users=frozenset()),
        )
        pid, epoch = await initialized(brokers)
        async with serving(service, certs) as address:
            stub = txn_pb2_grpc.TransactionServiceStub(dial(address, certs.user("alice")))
            # Describe is implied by Write: alice finds her id's coordinator.
            found = await stub.FindCoordinator(
                txn_pb2.FindTxnCoordinatorRequest(transactional_ids=["tx", "other"])
            )
            assert [c.error for c in found.coordinators] == [
                E.NONE,
                E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            ]
            assert found.coordinators[0].node_id == 1
            before = stored(brokers)
            # Another id: refused whole, nothing written.
            refused = await stub.AddPartitionsToTxn(
                add("other", pid, epoch, TxnTopic(name="t", partitions=[0]))
            )
            assert refused.error == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert "User:alice" in refused.message and "other" in refused.message
            # A topic she may not write: that one refused, the rest not tried.
            answer = await stub.AddPartitionsToTxn(
                add(
                    "tx",
                    pid,
                    epoch,
                    TxnTopic(name="t", partitions=[0]),
                    TxnTopic(name="u", partitions=[0]),
                )
            )
            codes = {r.name: r.partitions[0].error for r in answer.results}
            assert codes == {"t": E.OPERATION_NOT_ATTEMPTED, "u": E.TOPIC_AUTHORIZATION_FAILED}
            # The brokers' own calls need ClusterAction.
            verify = await stub.AddPartitionsToTxn(
                add("tx", pid, epoch, TxnTopic(name="t", partitions=[0]), verify=True)
            )
            assert verify.error == E.CLUSTER_AUTHORIZATION_FAILED
            markers = await stub.WriteTxnMarkers(
                txn_pb2.WriteTxnMarkersRequest(
                    markers=[
                        txn_pb2.TxnMarker(
                            producer_id=pid,
                            producer_epoch=epoch + 1,
                            topics=[TxnTopic(name="t", partitions=[0])],
                        )
                    ]
                )
            )
            assert markers.error == E.CLUSTER_AUTHORIZATION_FAILED
            assert brokers.data_log(2, 0).log_end_offset == 0
            offsets = await stub.AddOffsetsToTxn(
                txn_pb2.AddOffsetsToTxnRequest(
                    transactional_id="tx", producer_id=pid, producer_epoch=epoch, group_id="h"
                )
            )
            assert offsets.error == E.GROUP_AUTHORIZATION_FAILED
            assert stored(brokers) == before
            # What she may do goes through.
            added = await stub.AddPartitionsToTxn(
                add("tx", pid, epoch, TxnTopic(name="t", partitions=[0]))
            )
            assert added.error == E.NONE, added.message
            listed = await stub.ListTransactions(txn_pb2.ListTransactionsRequest())
            assert [(t.transactional_id, t.state) for t in listed.transactions] == [
                ("tx", "Ongoing")
            ]
            ended = await stub.EndTxn(
                txn_pb2.EndTxnRequest(
                    transactional_id="tx", producer_id=pid, producer_epoch=epoch, committed=False
                )
            )
            assert (ended.error, ended.producer_epoch) == (E.NONE, epoch + 1)
            # A broker allowed ClusterAction verifies: the ended transaction's
            # partition is in no ongoing transaction at the bumped epoch.
            broker_stub = txn_pb2_grpc.TransactionServiceStub(
                dial(address, certs.credentials(BROKER_2))
            )
            await eventually(
                lambda: (
                    [t.state for t in brokers.txns[1].list_transactions()]
                    == [TransactionState.COMPLETE_ABORT]
                )
            )
            verify = await broker_stub.AddPartitionsToTxn(
                add("tx", pid, epoch + 1, TxnTopic(name="t", partitions=[0]), verify=True)
            )
            assert verify.error == E.NONE, verify.message
            assert verify.results[0].partitions[0].error == E.INVALID_TXN_STATE

    run(body)
