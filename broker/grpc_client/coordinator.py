"""Finding and calling a group's coordinator (Kafka's
``CoordinatorRequestManager`` and the admin client's coordinator lookup).

A group's coordinator is the leader of its partition of the offsets topic.
:class:`GroupCoordinatorClient` asks any broker with FindCoordinator, keeps
the answer, and calls the coordinator; an answer ``NOT_COORDINATOR`` names
the coordinator the answering broker knows (so no FindCoordinator round
trip is needed), ``COORDINATOR_NOT_AVAILABLE`` (the offsets topic is being
created, or its partition has no leader) and
``COORDINATOR_LOAD_IN_PROGRESS`` (a new coordinator rebuilding its groups)
are waited out with a back-off, and so is a lost connection, until the
call's timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

import grpc

from broker.errors import Errors
from broker.grpc_client.errors import BrokerClientError
from broker.grpc_client.metadata_cache import METADATA_TIMEOUT_MS, MetadataCache, now_ms
from kqproto import groups_pb2, groups_pb2_grpc

__all__ = [
    "CallTrace",
    "GroupCoordinatorClient",
    "GroupStub",
    "MAY_HAVE_WRITTEN",
    "RETRIED",
]

if TYPE_CHECKING:
    GroupStub: TypeAlias = groups_pb2_grpc.GroupServiceAsyncStub
else:
    GroupStub = groups_pb2_grpc.GroupServiceStub


class _Answer(Protocol):
    @property
    def error(self) -> int: ...

    @property
    def message(self) -> str: ...

    @property
    def coordinator(self) -> groups_pb2.Coordinator: ...

    def HasField(self, name: str) -> bool: ...


R = TypeVar("R", bound=_Answer)

# Answers after which the call is made again (at the coordinator the answer
# names, or after a new FindCoordinator).
RETRIED = frozenset(
    {
        Errors.NOT_COORDINATOR,
        Errors.COORDINATOR_NOT_AVAILABLE,
        Errors.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
# Lost answers: the coordinator may have moved or died.
_LOST = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# Answers a coordinator may give a write after appending its records
# (broker.group_coordinator: leadership lost, or the ISR too slow, before the
# high watermark passed them): the write may yet be committed.
MAY_HAVE_WRITTEN = frozenset(
    {
        Errors.NOT_COORDINATOR,
        Errors.COORDINATOR_NOT_AVAILABLE,
        Errors.REQUEST_TIMED_OUT,
        Errors.UNKNOWN_SERVER_ERROR,
    }
)


@dataclass(slots=True)
class CallTrace:
    """What the attempts of one :meth:`GroupCoordinatorClient.call` may have
    done: ``uncertain`` once an attempt's answer was lost after sending, or
    was one of :data:`MAY_HAVE_WRITTEN` (a commit is then stored or not; the
    client cannot tell, as a producer's ``info``)."""

    uncertain: bool = False


class GroupCoordinatorClient:
    """One group's coordinator, as last found."""

    def __init__(self, cache: MetadataCache, group_id: str) -> None:
        self.cache = cache
        self.group_id = group_id
        # host:port and node id of the coordinator, once found.
        self.address: str | None = None
        self.node_id = -1
        # The broker that last answered a FindCoordinator: asked first.
        self._answered: str | None = None

    def stub_at(self, address: str) -> GroupStub:
        stub: GroupStub = groups_pb2_grpc.GroupServiceStub(self.cache.channel(address))
        return stub

    async def txn_offset_commit(
        self, request: groups_pb2.TxnOffsetCommitRequest, timeout_s: float
    ) -> groups_pb2.OffsetCommitResponse:
        """One TxnOffsetCommit at the coordinator found last (for
        :meth:`call`'s ``method``, which runs once it is found)."""
        if self.address is None:
            raise BrokerClientError(
                Errors.COORDINATOR_NOT_AVAILABLE, f"group {self.group_id}: no coordinator known"
            )
        answer: groups_pb2.OffsetCommitResponse = await self.stub_at(self.address).TxnOffsetCommit(
            request, timeout=timeout_s
        )
        return answer

    def forget(self) -> None:
        """The coordinator is unknown until the next lookup."""
        self.address, self.node_id = None, -1

    def take_hint(self, answer: Any) -> None:
        """A ``NOT_COORDINATOR`` answer names where the coordinator is."""
        hint = answer.coordinator if answer.HasField("coordinator") else None
        if hint is not None and hint.error == Errors.NONE and hint.node_id >= 0 and hint.host:
            self.address, self.node_id = f"{hint.host}:{hint.port}", hint.node_id
        else:
            self.forget()

    async def find(self, timeout_ms: int) -> str | None:
        """Ask a broker where the coordinator is (FindCoordinator); None if
        none is known yet (the offsets topic is being created, its partition
        has no leader). The broker that answered last is asked first, else
        the lowest id known; one whose answer is lost (dead, or paused past
        ``METADATA_TIMEOUT_MS``) is passed over for the next, as Kafka's
        ``leastLoadedNode`` skips a disconnected node: asking only the
        lowest id, a client whose metadata still named a killed broker asked
        it again and again and found no coordinator until its metadata aged
        out (5 minutes)."""
        request = groups_pb2.FindCoordinatorRequest(group_ids=[self.group_id])
        deadline = now_ms() + timeout_ms
        candidates = self._brokers_to_ask()
        for i, address in enumerate(candidates):
            left = max(0, deadline - now_ms())
            last = i == len(candidates) - 1
            try:
                answer = await self.stub_at(address).FindCoordinator(
                    request, timeout=(left if last else min(left, METADATA_TIMEOUT_MS)) / 1000
                )
            except grpc.aio.AioRpcError as error:
                if last or error.code() not in _LOST or deadline <= now_ms():
                    raise
                continue
            self._answered = address
            break
        if answer.error in RETRIED:
            return None
        if answer.error != Errors.NONE or not answer.coordinators:
            # A refusal of the whole request has no coordinator to read.
            raise BrokerClientError(
                Errors(answer.error or Errors.UNKNOWN_SERVER_ERROR),
                f"FindCoordinator for group {self.group_id}: "
                f"{answer.message or 'no coordinator in the answer'}",
            )
        found = answer.coordinators[0]
        if found.error == Errors.NONE:
            self.address, self.node_id = f"{found.host}:{found.port}", found.node_id
            return self.address
        if found.error in RETRIED:
            return None
        raise BrokerClientError(
            Errors(found.error), f"FindCoordinator for group {self.group_id}: {found.message}"
        )

    def _brokers_to_ask(self) -> list[str]:
        known = [self.cache.brokers[n] for n in sorted(self.cache.brokers)]
        if not known:
            return [self.cache.bootstrap[0]]
        if self._answered in known:
            known.remove(self._answered)
            known.insert(0, self._answered)
        return known

    async def call(
        self,
        what: str,
        method: Callable[[GroupStub, float], Awaitable[R]],
        timeout_ms: int,
        trace: CallTrace | None = None,
    ) -> R:
        """``method(stub, timeout_s)`` at the coordinator, again after each
        retriable answer or lost connection, until ``timeout_ms``; the last
        retriable answer is returned when time runs out (its error says
        why), a lost connection raises :class:`BrokerClientError`.
        ``trace`` learns whether an attempt may have written."""
        deadline = now_ms() + timeout_ms
        backoff_ms = self.cache.retry_backoff_ms
        last: R | None = None
        while True:
            left = deadline - now_ms()
            if left <= 0:
                if last is not None:
                    return last
                raise BrokerClientError(
                    Errors.REQUEST_TIMED_OUT,
                    f"{what} for group {self.group_id}: no coordinator answered within "
                    f"{timeout_ms} ms",
                )
            sent = False
            try:
                address = self.address or await self.find(left)
                if address is not None:
                    sent = True
                    answer = await method(self.stub_at(address), left / 1000)
                    if trace is not None and answer.error in MAY_HAVE_WRITTEN:
                        trace.uncertain = True
                    if Errors(answer.error) not in RETRIED:
                        return answer
                    last = answer
                    if answer.error == Errors.NOT_COORDINATOR:
                        self.take_hint(answer)
                        if self.address is not None and self.address != address:
                            continue  # straight to the one it names
                        # No hint, or the broker just asked names itself (its
                        # image is behind): look again after the back-off.
                        self.forget()
                    if answer.error == Errors.COORDINATOR_NOT_AVAILABLE:
                        self.forget()
            except grpc.aio.AioRpcError as error:
                if trace is not None and sent:
                    # Sent, perhaps handled: the answer is what was lost (a
                    # lost FindCoordinator wrote nothing).
                    trace.uncertain = True
                if error.code() not in _LOST:
                    raise BrokerClientError(
                        Errors.UNKNOWN_SERVER_ERROR,
                        f"{what} for group {self.group_id}: {error.code().name} {error.details()}",
                    ) from error
                self.forget()
            await asyncio.sleep(min(backoff_ms, max(0, deadline - now_ms())) / 1000)
            backoff_ms = min(backoff_ms * 2, 1_000)
