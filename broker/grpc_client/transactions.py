"""A transactional id's coordinator, found and called (Kafka's
``FindCoordinator`` with key type TRANSACTION and the retries of the
``TransactionManager``'s handlers), for :class:`~broker.grpc_client.producer.Producer`.

The coordinator is the leader of the id's partition of
``__transaction_state``; any broker says which (``kq.txn.TransactionService``
FindCoordinator). :meth:`TxnCoordinatorClient.call` sends a request there
and hands the answer to the pure :class:`~broker.client.transactions.TransactionManager`,
which says whether it is done, retried (after finding the coordinator again
or not, with a back-off growing from the one it gives) or failed (it
raises). A lost answer (the coordinator died, the deadline passed) is sent
again, after finding the coordinator again: the same request, so an EndTxn
goes again at the same epoch and the coordinator answers its retry with the
transaction's outcome (KIP-890 part 2).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import grpc

from broker.client.errors import BrokerClientError, TransactionFatalError
from broker.client.transactions import Retry, TransactionManager, backoff_ms
from broker.errors import Errors
from broker.grpc_client.errors import NoBrokerError
from broker.grpc_client.metadata_cache import (
    METADATA_TIMEOUT_MS,
    PERMANENT_REFUSALS,
    MetadataCache,
    now_ms,
)
from kqproto import broker_pb2_grpc, txn_pb2, txn_pb2_grpc

__all__ = ["TxnCoordinatorClient", "TxnStub"]

if TYPE_CHECKING:
    TxnStub: TypeAlias = txn_pb2_grpc.TransactionServiceAsyncStub
else:
    TxnStub = txn_pb2_grpc.TransactionServiceStub

A = TypeVar("A")

# Lost answers: the coordinator may have moved or died; asked again.
_LOST = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


def timed_out(what: str, transactional_id: str, timeout_ms: int) -> BrokerClientError:
    """Kafka's ``TimeoutException`` for a transactional call: nothing is
    decided; the same call made again goes on where this one stopped."""
    return BrokerClientError(
        -1,
        f"{what} of transactional id {transactional_id} did not complete within "
        f"{timeout_ms} ms; call it again to go on",
        "TimeoutException",
    )


class TxnCoordinatorClient:
    """One transactional id's coordinator, as last found."""

    def __init__(
        self, cache: MetadataCache, manager: TransactionManager, retry_backoff_max_ms: int
    ) -> None:
        self.cache = cache
        self.manager = manager
        self.transactional_id = manager.transactional_id
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.address: str | None = None
        self.node_id = -1
        self._answered: str | None = None
        # How many requests were sent (for tests).
        self.requests = 0

    def txn_stub(self, address: str) -> TxnStub:
        stub: TxnStub = txn_pb2_grpc.TransactionServiceStub(self.cache.channel(address))
        return stub

    def broker_stub(self, address: str) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        return self.cache.stub_at(address)

    def forget(self) -> None:
        self.address, self.node_id = None, -1

    def _brokers_to_ask(self) -> list[str]:
        known = [self.cache.brokers[n] for n in sorted(self.cache.brokers)]
        if not known:
            return list(self.cache.bootstrap)
        if self._answered in known:
            known.remove(self._answered)
            known.insert(0, self._answered)
        return known

    async def find(self, timeout_ms: int) -> Retry | None:
        """FindCoordinator at the brokers, one after another while their
        answers are lost; None once found, a :class:`Retry` while there is
        none yet; raises what the manager makes of a refusal."""
        request = txn_pb2.FindTxnCoordinatorRequest(transactional_ids=[self.transactional_id])
        deadline = now_ms() + timeout_ms
        for address in self._brokers_to_ask():
            left = deadline - now_ms()
            if left <= 0:
                break
            try:
                answer = await self.txn_stub(address).FindCoordinator(
                    request, timeout=min(left, METADATA_TIMEOUT_MS) / 1000
                )
            except grpc.aio.AioRpcError as error:
                if error.code() in PERMANENT_REFUSALS:
                    raise self.manager.fail(
                        TransactionFatalError(
                            int(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                            f"FindCoordinator for transactional id {self.transactional_id} "
                            f"refused: {error.code().name} {error.details()}",
                        )
                    ) from None
                continue
            self._answered = address
            if answer.error != Errors.NONE or not answer.coordinators:
                return self.manager.on_find_coordinator(
                    answer.error or Errors.UNKNOWN_SERVER_ERROR,
                    answer.message or "no coordinator in the answer",
                )
            found = answer.coordinators[0]
            retry = self.manager.on_find_coordinator(found.error, found.message)
            if retry is not None:
                return retry
            self.address, self.node_id = f"{found.host}:{found.port}", found.node_id
            return None
        return Retry(False, self.manager.retry_backoff_ms)

    async def call(
        self,
        what: str,
        send: Callable[[str, float], Awaitable[A]],
        read: Callable[[A], Retry | None],
        deadline_ms: int,
        request_timeout_ms: int,
        *,
        keep_going: Callable[[], bool] | None = None,
    ) -> bool:
        """``send(address, timeout_s)`` at the coordinator and ``read`` its
        answer (the manager's reading), again after each retriable answer
        or lost answer, until ``deadline_ms`` (then :func:`timed_out` is
        raised). True once ``read`` is done; False if ``keep_going`` said to
        stop (the transaction can only abort: a queued request is not
        sent)."""
        attempt = 0
        total_ms = max(0, deadline_ms - now_ms())
        while True:
            if keep_going is not None and not keep_going():
                return False
            left = deadline_ms - now_ms()
            if left <= 0:
                raise timed_out(what, self.transactional_id, total_ms)
            retry: Retry | None
            if self.address is None:
                retry = await self.find(left)
            else:
                retry = None
            if retry is None and self.address is not None:
                address = self.address
                left = max(1, deadline_ms - now_ms())
                try:
                    self.requests += 1
                    answer = await send(address, min(left, request_timeout_ms) / 1000)
                except grpc.aio.AioRpcError as error:
                    if error.code() in PERMANENT_REFUSALS:
                        raise self.manager.fail(
                            TransactionFatalError(
                                int(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                                f"{what} of transactional id {self.transactional_id} refused: "
                                f"{error.code().name} {error.details()}",
                            )
                        ) from None
                    if error.code() not in _LOST:
                        raise BrokerClientError(
                            int(Errors.UNKNOWN_SERVER_ERROR),
                            f"{what} of transactional id {self.transactional_id}: "
                            f"{error.code().name} {error.details()}",
                        ) from error
                    retry = Retry(True, self.manager.retry_backoff_ms)
                except NoBrokerError:
                    retry = Retry(True, self.manager.retry_backoff_ms)
                else:
                    retry = read(answer)
                    if retry is None:
                        return True
            if retry is None:
                retry = Retry(False, self.manager.retry_backoff_ms)
            if retry.find_coordinator:
                self.forget()
            wait = backoff_ms(retry.backoff_ms, attempt, self.retry_backoff_max_ms)
            attempt += 1
            await asyncio.sleep(min(wait, max(0, deadline_ms - now_ms())) / 1000)
