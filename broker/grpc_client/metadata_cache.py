"""The clients' view of the cluster (Kafka's ``Metadata`` and
``MetadataCache`` on the client side): the brokers and their addresses, and
per partition its leader and leader epoch, from the brokers' ``Metadata``
RPC (brokers.md §6.4).

- Bootstrap from any broker addresses: the first that answers gives the
  brokers; later refreshes ask the known brokers first, the bootstrap
  addresses after them, each refresh starting one address further on (Kafka's
  ``leastLoadedNode`` starts at a random node): a broker cut off from the
  controllers still answers, from metadata that no longer changes, and a
  client that always asked it first would never learn the leaders elected
  without it.
- Refreshed on demand (:meth:`request_refresh`, after a leadership error or
  a lost answer), when a topic is first used, and every
  ``metadata.max.age.ms``; concurrent refreshes are one RPC.
- KIP-320: a partition's leader epoch never goes backwards, so a stale
  broker cannot send the client back to an old leader.
- KIP-951: a leadership error names the current leader, its epoch and its
  endpoint; :meth:`apply_leader_hint` takes them without a round trip.
- One gRPC channel per broker address (``quorum.driver.client.ChannelPool``),
  over mutual TLS when credentials are given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.grpc_client.errors import BrokerClientError, NoBrokerError, UnknownTopicError
from kqproto import broker_pb2, broker_pb2_grpc
from quorum.driver.client import ChannelPool
from quorum.driver.tls import TlsFiles

__all__ = [
    "PERMANENT_REFUSALS",
    "MetadataCache",
    "PartitionInfo",
    "channel_credentials",
    "now_ms",
]

# gRPC statuses that refuse the caller or the request itself: retrying
# another broker cannot help (quorum.driver.client's refusals).
PERMANENT_REFUSALS = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)


# The longest one broker is given to answer a Metadata request.
METADATA_TIMEOUT_MS = 3_000


def channel_credentials(
    tls: TlsFiles | None, credentials: grpc.ChannelCredentials | None
) -> grpc.ChannelCredentials | None:
    """Mutual TLS from ``tls`` (a certificate folder's files) or ready
    ``credentials``; neither: plaintext."""
    if tls is not None and credentials is not None:
        raise ValueError("give tls or credentials, not both")
    return tls.channel_credentials() if tls is not None else credentials


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """A partition as the brokers' metadata describes it."""

    topic: str
    partition: int
    leader: int  # -1: none
    leader_epoch: int
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    offline_replicas: tuple[int, ...] = ()


def now_ms() -> int:
    """The clients' clock: monotonic milliseconds."""
    return int(time.monotonic() * 1000)


class MetadataCache:
    """The brokers and partition leaders one client knows (module docstring)."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        tls: TlsFiles | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        request_timeout_ms: int = 30_000,
        metadata_max_age_ms: int = 300_000,
        retry_backoff_ms: int = 100,
    ) -> None:
        if not bootstrap:
            raise ValueError("a client needs at least one bootstrap broker address")
        if request_timeout_ms < 1:
            raise ValueError(f"request_timeout_ms must be >= 1, not {request_timeout_ms}")
        self.bootstrap = list(dict.fromkeys(bootstrap))
        self.request_timeout_ms = request_timeout_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.retry_backoff_ms = retry_backoff_ms
        self._channels = ChannelPool(channel_credentials(tls, credentials))
        self.brokers: dict[int, str] = {}
        self.partitions: dict[TopicPartition, PartitionInfo] = {}
        # Topic -> partition count, for the topics the brokers described.
        self.topics: dict[str, int] = {}
        # Topic -> its partitions with a leader, computed once per change of
        # the metadata (Kafka's Cluster.availablePartitionsForTopic), not on
        # every record the sticky partitioner places.
        self._available: dict[str, list[int]] = {}
        # Each partition's leader, likewise computed once per change: the
        # sender reads it on every pass (Kafka's Cluster is immutable and
        # replaced on each update).
        self._leaders: dict[TopicPartition, int | None] | None = None
        # Topics the client uses: refreshed together.
        self._wanted: set[str] = set()
        # Why the last refresh did not describe a topic: (code, message).
        self._missing: dict[str, tuple[int, str]] = {}
        self._refresh: asyncio.Task[None] | None = None
        self._refresh_due = True
        self._last_refresh_ms = -1
        self.cluster_id = ""
        self.metadata_offset = -1
        self.refreshes = 0
        # Where the next refresh starts in its list of addresses.
        self._first_asked = 0

    # -- channels ---------------------------------------------------------------

    def stub(self, node: int) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        address = self.brokers.get(node)
        if address is None:
            raise NoBrokerError(f"broker {node} has no known address")
        return self.stub_at(address)

    def stub_at(self, address: str) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        stub: broker_pb2_grpc.BrokerServiceAsyncStub = broker_pb2_grpc.BrokerServiceStub(
            self._channels.get(address)
        )
        return stub

    def channel(self, address: str) -> grpc.aio.Channel:
        """The pooled channel to ``address`` (for the brokers' other services)."""
        return self._channels.get(address)

    def any_stub(self) -> broker_pb2_grpc.BrokerServiceAsyncStub:
        """A broker for a request any broker answers (InitProducerId)."""
        if self.brokers:
            return self.stub(min(self.brokers))
        return self.stub_at(self.bootstrap[0])

    async def close(self) -> None:
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
        await self._channels.close()

    # -- what is known ----------------------------------------------------------

    def leader(self, tp: TopicPartition) -> PartitionInfo | None:
        """The partition's metadata if it has a leader with a known address."""
        info = self.partitions.get(tp)
        if info is None or info.leader < 0 or info.leader not in self.brokers:
            return None
        return info

    def leaders(self) -> Mapping[TopicPartition, int | None]:
        """Each known partition's leader (None: no leader, or no address);
        the same mapping until the metadata changes: read it, do not change it."""
        if self._leaders is None:
            self._leaders = {
                tp: (info.leader if self.leader(tp) is not None else None)
                for tp, info in self.partitions.items()
            }
        return self._leaders

    def _changed(self) -> None:
        """The brokers or partitions changed: what is derived from them goes."""
        self._available.clear()
        self._leaders = None

    def available(self, topic: str) -> list[int]:
        """The topic's partitions with a leader (for the sticky partitioner)."""
        found = self._available.get(topic)
        if found is None:
            count = self.topics.get(topic, 0)
            found = [p for p in range(count) if self.leader(TopicPartition(topic, p)) is not None]
            self._available[topic] = found
        return found

    # -- refreshing -------------------------------------------------------------

    def request_refresh(self) -> None:
        """Refresh at the next chance (a leadership error, a lost answer)."""
        self._refresh_due = True

    def refresh_due(self) -> bool:
        return self._refresh_due or (
            self._last_refresh_ms >= 0
            and now_ms() - self._last_refresh_ms >= self.metadata_max_age_ms
        )

    def apply_leader_hint(
        self,
        tp: TopicPartition,
        leader: int,
        leader_epoch: int,
        endpoints: Iterable[broker_pb2.NodeEndpoint] = (),
    ) -> bool:
        """KIP-951: an answer named the partition's current leader and epoch
        (and the leaders' endpoints). Taken if the epoch is not older than
        the known one (KIP-320); True if the client can go there now, else
        a refresh is requested."""
        self._changed()
        for endpoint in endpoints:
            self.brokers[endpoint.node_id] = f"{endpoint.host}:{endpoint.port}"
        known = self.partitions.get(tp)
        if leader < 0 or leader_epoch < 0 or leader not in self.brokers:
            self.request_refresh()
            return False
        if known is not None and leader_epoch < known.leader_epoch:
            return known.leader >= 0
        if known is not None and leader_epoch == known.leader_epoch and known.leader == leader:
            # The hint says what the client already believed: its leader
            # refused anyway, so the metadata must be out of date elsewhere.
            self.request_refresh()
            return False
        base = known or PartitionInfo(tp.topic, tp.partition, leader, leader_epoch)
        self.partitions[tp] = PartitionInfo(
            tp.topic,
            tp.partition,
            leader,
            leader_epoch,
            base.replicas,
            base.isr,
            base.offline_replicas,
        )
        return True

    def follow(
        self,
        tp: TopicPartition,
        hint: broker_pb2.CurrentLeader | None,
        endpoints: Iterable[broker_pb2.NodeEndpoint] = (),
    ) -> None:
        """After a leadership error: the answer's current leader if it names
        one (:meth:`apply_leader_hint`), else a refresh at the next chance."""
        if hint is not None and hint.leader_id >= 0:
            self.apply_leader_hint(tp, hint.leader_id, hint.leader_epoch, endpoints)
        else:
            self.request_refresh()

    async def maybe_refresh(self, topics: Iterable[str] = ()) -> bool:
        """Refresh if one is due or a topic is new; True if it refreshed."""
        new = set(topics) - self._wanted
        if not new and not self.refresh_due():
            return False
        await self.refresh(new)
        return True

    async def refresh(self, topics: Iterable[str] = ()) -> None:
        """One Metadata RPC for every topic in use (and ``topics``);
        concurrent callers share it. Raises :class:`NoBrokerError` if no
        broker answers, :class:`BrokerClientError` on a refusal."""
        self._wanted.update(topics)
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._do_refresh())
        await asyncio.shield(self._refresh)

    async def _do_refresh(self) -> None:
        self._refresh_due = False
        request = broker_pb2.MetadataRequest(topics=sorted(self._wanted))
        addresses = list(dict.fromkeys([*self.brokers.values(), *self.bootstrap]))
        start = self._first_asked % len(addresses)
        self._first_asked = start + 1
        addresses = addresses[start:] + addresses[:start]
        failures = []
        for address in addresses:
            try:
                # A paused broker must not hold the refresh for a whole
                # request timeout: the next address is tried after a few
                # seconds (Kafka picks its least loaded node instead).
                response = await self.stub_at(address).Metadata(
                    request, timeout=min(self.request_timeout_ms, METADATA_TIMEOUT_MS) / 1000
                )
            except grpc.aio.AioRpcError as error:
                if error.code() in PERMANENT_REFUSALS:
                    self._refresh_due = True
                    raise BrokerClientError(
                        int(Errors.TOPIC_AUTHORIZATION_FAILED),
                        f"{address} refused Metadata: {error.details()}",
                    ) from None
                failures.append(f"{address}: {error.code().name}")
                continue
            if response.error != Errors.NONE:
                failures.append(f"{address}: {Errors(response.error).name} {response.message}")
                continue
            self._take(response)
            return
        self._refresh_due = True
        raise NoBrokerError(
            "no broker answered Metadata (" + "; ".join(failures or ["no address"]) + ")"
        )

    def _take(self, response: broker_pb2.MetadataResponse) -> None:
        self._changed()
        self.refreshes += 1
        self._last_refresh_ms = now_ms()
        self.cluster_id = response.cluster_id
        self.metadata_offset = response.metadata_offset
        self.brokers = {b.node_id: f"{b.host}:{b.port}" for b in response.brokers}
        for topic in response.topics:
            if topic.error != Errors.NONE:
                self._missing[topic.name] = (topic.error, topic.message or Errors(topic.error).name)
                if topic.error == Errors.UNKNOWN_TOPIC_OR_PARTITION:
                    # Deleted (or never there): forget its partitions.
                    self.topics.pop(topic.name, None)
                    for tp in [tp for tp in self.partitions if tp.topic == topic.name]:
                        del self.partitions[tp]
                continue
            self._missing.pop(topic.name, None)
            if self.topics.get(topic.name, len(topic.partitions)) > len(topic.partitions):
                # Fewer partitions than known: the topic was recreated.
                for tp in [tp for tp in self.partitions if tp.topic == topic.name]:
                    del self.partitions[tp]
            self.topics[topic.name] = len(topic.partitions)
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition)
                known = self.partitions.get(tp)
                if known is not None and part.leader_epoch < known.leader_epoch:
                    # KIP-320: older than what this client has seen.
                    continue
                self.partitions[tp] = PartitionInfo(
                    topic.name,
                    part.partition,
                    part.leader_id,
                    part.leader_epoch,
                    tuple(part.replicas),
                    tuple(part.isr),
                    tuple(part.offline_replicas),
                )
        if any(info.leader < 0 for info in self.partitions.values()):
            # An election is in progress somewhere: look again soon.
            self._refresh_due = True

    def topic_error(self, topic: str) -> BrokerClientError:
        """Why the metadata has no ``topic``: :class:`UnknownTopicError`, or
        the brokers' refusal (``TOPIC_AUTHORIZATION_FAILED``, ...)."""
        code, message = self._missing.get(
            topic,
            (int(Errors.UNKNOWN_TOPIC_OR_PARTITION), f"topic {topic!r} is not in the metadata"),
        )
        if code == Errors.UNKNOWN_TOPIC_OR_PARTITION:
            return UnknownTopicError(topic, message)
        return BrokerClientError(code, message)

    async def partition_count(self, topic: str, max_wait_ms: int) -> int:
        """The topic's partition count, waiting up to ``max_wait_ms`` for it
        to appear in the metadata (Kafka's ``waitOnMetadata`` and
        ``max.block.ms``); :class:`UnknownTopicError` after that. A refresh
        that no broker answered is tried again until then too (Kafka's
        ``waitOnMetadata`` waits out unreachable brokers the same way);
        after that its :class:`NoBrokerError` is raised."""
        deadline = now_ms() + max_wait_ms

        async def pause() -> None:
            await asyncio.sleep(min(self.retry_backoff_ms, max(0, deadline - now_ms())) / 1000)

        async def refresh() -> None:
            while True:
                try:
                    await self.refresh([topic])
                    return
                except NoBrokerError:
                    if now_ms() >= deadline:
                        raise
                await pause()

        if topic not in self._wanted:
            await refresh()
        while True:
            count = self.topics.get(topic)
            if count is not None:
                return count
            refusal = self.topic_error(topic)
            if not isinstance(refusal, UnknownTopicError):
                # Refused, not missing: waiting does not help (Kafka raises
                # TopicAuthorizationException at once).
                raise refusal
            if now_ms() >= deadline:
                raise UnknownTopicError(
                    topic, f"{refusal.message} (after waiting {max_wait_ms} ms)"
                )
            await pause()
            await refresh()
