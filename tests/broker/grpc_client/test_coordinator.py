"""GroupCoordinatorClient against a fake GroupService: FindCoordinator is
asked once, a NOT_COORDINATOR hint is followed without a lookup, NOT_AVAILABLE,
LOAD_IN_PROGRESS and lost connections are retried, running out of time
returns the last answer, other refusals raise naming the group."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc
import pytest

from broker.errors import Errors
from broker.grpc_client.coordinator import CallTrace, GroupCoordinatorClient, GroupStub
from broker.grpc_client.errors import BrokerClientError
from broker.grpc_client.metadata_cache import MetadataCache
from kqproto import broker_pb2, groups_pb2


def pb(code: Errors) -> broker_pb2.BrokerError:
    return cast(broker_pb2.BrokerError, int(code))


class FakeCache:
    def __init__(self) -> None:
        self.brokers = {1: "b1:1", 2: "b2:2", 3: "b3:3"}
        self.bootstrap = ["boot:9"]
        self.retry_backoff_ms = 1


def coordinator(node: int, error: Errors = Errors.NONE) -> groups_pb2.Coordinator:
    return groups_pb2.Coordinator(
        group_id="g", error=pb(error), node_id=node, host=f"b{node}", port=node
    )


def lost() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone"
    )


class FakeStub:
    """One broker's GroupService: FindCoordinator answers from ``finds``,
    OffsetFetch from ``answers`` (each an answer or an exception)."""

    def __init__(self, world: World, address: str) -> None:
        self.world, self.address = world, address

    async def FindCoordinator(self, request: Any, timeout: float) -> Any:
        self.world.calls.append(("find", self.address))
        answer = self.world.finds.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def OffsetFetch(self, request: Any, timeout: float) -> Any:
        self.world.calls.append(("fetch", self.address))
        answer = self.world.answers.pop(0) if self.world.answers else self.world.forever
        if isinstance(answer, BaseException):
            raise answer
        return answer


class World:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.finds: list[groups_pb2.FindCoordinatorResponse | BaseException] = []
        self.answers: list[Any] = []
        self.forever: Any = None


def client(world: World) -> GroupCoordinatorClient:
    found = GroupCoordinatorClient(cast(MetadataCache, FakeCache()), "g")
    found.stub_at = lambda address: cast(GroupStub, FakeStub(world, address))  # type: ignore[method-assign]
    return found


def fetch_answer(error: Errors = Errors.NONE, hint: int | None = None) -> Any:
    answer = groups_pb2.OffsetFetchResponse(error=pb(error))
    if hint is not None:
        answer.coordinator.CopyFrom(coordinator(hint))
    return answer


async def fetch(c: GroupCoordinatorClient, timeout_ms: int = 5_000) -> Any:
    return await c.call(
        "OffsetFetch",
        lambda stub, t: stub.OffsetFetch(groups_pb2.OffsetFetchRequest(group_id="g"), timeout=t),
        timeout_ms,
    )


def found(node: int) -> groups_pb2.FindCoordinatorResponse:
    return groups_pb2.FindCoordinatorResponse(coordinators=[coordinator(node)])


def test_the_hint_of_not_coordinator_is_followed_without_a_lookup() -> None:
    world = World()
    world.finds = [found(2)]
    world.answers = [fetch_answer(Errors.NOT_COORDINATOR, hint=3), fetch_answer()]
    c = client(world)
    answer = asyncio.run(fetch(c))
    assert answer.error == Errors.NONE
    assert world.calls == [("find", "b1:1"), ("fetch", "b2:2"), ("fetch", "b3:3")]
    assert (c.address, c.node_id) == ("b3:3", 3)


@pytest.mark.parametrize(
    "first",
    [
        fetch_answer(Errors.COORDINATOR_NOT_AVAILABLE),
        fetch_answer(Errors.COORDINATOR_LOAD_IN_PROGRESS),
        fetch_answer(Errors.NOT_COORDINATOR),  # no hint: look again
        lost(),
    ],
    ids=["not-available", "load-in-progress", "not-coordinator-no-hint", "unavailable"],
)
def test_retriable_answers_and_lost_connections_are_retried(first: Any) -> None:
    world = World()
    world.finds = [found(2), found(3)]
    world.answers = [first, fetch_answer()]
    c = client(world)
    assert asyncio.run(fetch(c)).error == Errors.NONE
    fetches = [a for what, a in world.calls if what == "fetch"]
    assert len(fetches) == 2
    if isinstance(first, BaseException) or first.error != Errors.COORDINATOR_LOAD_IN_PROGRESS:
        # The coordinator may have moved: found again.
        assert world.calls.count(("find", "b1:1")) == 2 and fetches == ["b2:2", "b3:3"]
    else:
        # Still loading at the same broker: asked again there.
        assert world.calls.count(("find", "b1:1")) == 1 and fetches == ["b2:2", "b2:2"]


def test_running_out_of_time_returns_the_last_answer() -> None:
    world = World()
    world.finds = [found(2)]
    world.forever = fetch_answer(Errors.COORDINATOR_LOAD_IN_PROGRESS)
    answer = asyncio.run(fetch(client(world), timeout_ms=30))
    assert answer.error == Errors.COORDINATOR_LOAD_IN_PROGRESS
    assert len(world.calls) >= 2


def test_no_answer_within_the_timeout_raises() -> None:
    world = World()
    world.finds = [found(2)] * 1000
    world.forever = lost()
    with pytest.raises(BrokerClientError, match="no coordinator answered"):
        asyncio.run(fetch(client(world), timeout_ms=30))


def test_a_refused_lookup_raises_naming_the_group() -> None:
    world = World()
    world.finds = [
        groups_pb2.FindCoordinatorResponse(
            coordinators=[coordinator(-1, Errors.GROUP_AUTHORIZATION_FAILED)]
        )
    ]
    with pytest.raises(BrokerClientError, match="group g"):
        asyncio.run(fetch(client(world)))
    world.finds = [groups_pb2.FindCoordinatorResponse(error=pb(Errors.INVALID_REQUEST))]
    with pytest.raises(BrokerClientError, match="group g"):
        asyncio.run(fetch(client(world)))


@pytest.mark.parametrize(
    ("answers", "uncertain"),
    [
        ([fetch_answer(Errors.STALE_MEMBER_EPOCH)], False),
        ([fetch_answer(Errors.COORDINATOR_LOAD_IN_PROGRESS), fetch_answer()], False),
        ([fetch_answer(Errors.NOT_COORDINATOR), fetch_answer(Errors.STALE_MEMBER_EPOCH)], True),
        ([fetch_answer(Errors.COORDINATOR_NOT_AVAILABLE), fetch_answer()], True),
        ([lost(), fetch_answer(Errors.STALE_MEMBER_EPOCH)], True),
    ],
    ids=["refused", "loading-then-ok", "not-coordinator", "not-available", "lost"],
)
def test_the_trace_says_whether_an_attempt_may_have_written(
    answers: list[Any], uncertain: bool
) -> None:
    """A write answered NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE may have
    been appended before the coordinator lost its partition or waited out its
    ISR; a lost answer may follow a write: the call's outcome is uncertain
    whatever the last answer says. LOAD_IN_PROGRESS comes before any write."""
    world = World()
    world.finds = [found(2)] * 3
    world.answers = list(answers)
    trace = CallTrace()
    c = client(world)
    asyncio.run(
        c.call(
            "OffsetFetch",
            lambda stub, t: stub.OffsetFetch(
                groups_pb2.OffsetFetchRequest(group_id="g"), timeout=t
            ),
            5_000,
            trace,
        )
    )
    assert trace.uncertain is uncertain


def test_a_dead_broker_is_passed_over_for_the_next_to_find_the_coordinator() -> None:
    """The lowest broker id is dead (its metadata still names it): the
    lookup asks the next one in the same call, and later lookups start at
    the broker that answered."""
    world = World()
    world.finds = [lost(), found(3), found(3)]
    world.answers = [fetch_answer(), lost(), fetch_answer()]
    c = client(world)
    assert asyncio.run(fetch(c)).error == Errors.NONE
    assert world.calls == [("find", "b1:1"), ("find", "b2:2"), ("fetch", "b3:3")]
    world.calls.clear()
    assert asyncio.run(fetch(c)).error == Errors.NONE
    assert world.calls == [("fetch", "b3:3"), ("find", "b2:2"), ("fetch", "b3:3")]


def test_a_lookup_no_broker_answers_raises_the_last_loss() -> None:
    world = World()
    world.finds = [lost(), lost(), lost()]
    c = client(world)
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(c.find(5_000))
    assert world.calls == [("find", "b1:1"), ("find", "b2:2"), ("find", "b3:3")]


def test_a_lost_lookup_leaves_the_trace_certain() -> None:
    """FindCoordinator writes nothing: its lost answers, then a refusal of
    the call itself, make a definite outcome."""
    world = World()
    world.finds = [found(2)]
    world.answers = [fetch_answer(Errors.STALE_MEMBER_EPOCH)]
    c = client(world)
    lookups = 0
    real_find = c.find

    async def flaky_find(timeout_ms: int) -> str | None:
        nonlocal lookups
        lookups += 1
        if lookups < 3:
            raise lost()
        return await real_find(timeout_ms)

    c.find = flaky_find  # type: ignore[method-assign]
    trace = CallTrace()
    answer = asyncio.run(
        c.call(
            "OffsetFetch",
            lambda stub, t: stub.OffsetFetch(
                groups_pb2.OffsetFetchRequest(group_id="g"), timeout=t
            ),
            5_000,
            trace,
        )
    )
    assert answer.error == Errors.STALE_MEMBER_EPOCH and lookups == 3
    assert trace.uncertain is False
