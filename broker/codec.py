"""The replica state machine's fetch messages (:mod:`broker.replica.types`)
to and from ``kq.broker``'s protobuf messages: what a follower sends on its
ReplicaFetch stream and what it makes of the answers, and how the leader's
service answers one partition."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

from broker.errors import Errors
from broker.replica import DivergingEpoch, FetchAnswer, FetchRequest
from broker.replica.types import NO_EPOCH
from kqproto import broker_pb2
from metadata.image import MetadataImage, TopicIdPartition

__all__ = [
    "answer_to_proto",
    "answers_in",
    "error_to_proto",
    "fetch_answers",
    "replica_fetch_request",
]


def error_to_proto(code: Errors) -> broker_pb2.BrokerError:
    """The proto enum's value of a code (the two mirror each other)."""
    return cast(broker_pb2.BrokerError, int(code))


def replica_fetch_request(
    replica_id: int,
    broker_epoch: int,
    requests: Mapping[TopicIdPartition, FetchRequest],
    image: MetadataImage,
    *,
    max_wait_ms: int = 500,
    min_bytes: int = 1,
    max_bytes: int = 10 * 1024 * 1024,
    incremental: bool = False,
    forgotten: Iterable[TopicIdPartition] = (),
) -> broker_pb2.FetchRequest:
    """One follower fetch for every partition it fetches from one leader
    (``ReplicaFetcherThread.buildFetch``; ``replica.fetch.wait.max.ms`` 500,
    ``replica.fetch.min.bytes`` 1, ``replica.fetch.response.max.bytes``
    10 MiB), or with ``incremental`` for the partitions listed since the
    stream's last request and those ``forgotten``
    (:mod:`broker.fetch_session`). A partition whose topic the image no
    longer has is left out."""
    topics: dict[str, broker_pb2.FetchTopic] = {}
    for key, request in sorted(requests.items()):
        found = image.topics.get(key.topic_id)
        if found is None:
            continue
        topic = topics.get(key.topic_id)
        if topic is None:
            topic = topics[key.topic_id] = broker_pb2.FetchTopic(
                topic=found.name, topic_id=key.topic_id
            )
        topic.partitions.append(
            broker_pb2.FetchPartition(
                partition=key.partition,
                current_leader_epoch=NO_EPOCH
                if request.current_leader_epoch is None
                else request.current_leader_epoch,
                fetch_offset=request.fetch_offset,
                last_fetched_epoch=request.last_fetched_epoch,
                log_start_offset=request.log_start_offset,
                partition_max_bytes=request.max_bytes,
            )
        )
    dropped: dict[str, list[int]] = {}
    for key in sorted(forgotten):
        dropped.setdefault(key.topic_id, []).append(key.partition)
    return broker_pb2.FetchRequest(
        replica_state=broker_pb2.ReplicaState(replica_id=replica_id, replica_epoch=broker_epoch),
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        topics=list(topics.values()),
        incremental=incremental,
        forgotten=[
            broker_pb2.FetchForgottenTopic(topic_id=topic_id, partitions=partitions)
            for topic_id, partitions in dropped.items()
        ],
    )


def _error(code: int) -> Errors:
    try:
        return Errors(code)
    except ValueError:
        return Errors.UNKNOWN_SERVER_ERROR


def fetch_answers(
    response: broker_pb2.FetchResponse, requested: Iterable[TopicIdPartition]
) -> dict[TopicIdPartition, FetchAnswer]:
    """The answer for each partition ``requested`` (a follower names every
    topic by id): a top-level error answers each with it, and a partition
    the response left out is ``UNKNOWN_SERVER_ERROR`` (the follower backs
    off and asks again)."""
    wanted = list(requested)
    if response.error != 0:
        error = _error(response.error)
        return {key: FetchAnswer(error, message=response.message) for key in wanted}
    found = answers_in(response)
    return {
        key: found.get(
            key,
            FetchAnswer(Errors.UNKNOWN_SERVER_ERROR, message="the leader's answer left it out"),
        )
        for key in wanted
    }


def answers_in(response: broker_pb2.FetchResponse) -> dict[TopicIdPartition, FetchAnswer]:
    """The answer of each partition a response names (an incremental
    fetch's answer names only those with news)."""
    found: dict[TopicIdPartition, FetchAnswer] = {}
    for topic in response.topics:
        for part in topic.partitions:
            diverging = (
                DivergingEpoch(part.diverging_epoch.epoch, part.diverging_epoch.end_offset)
                if part.HasField("diverging_epoch")
                else None
            )
            leader = part.current_leader if part.HasField("current_leader") else None
            found[TopicIdPartition(topic.topic_id, part.partition)] = FetchAnswer(
                _error(part.error),
                high_watermark=part.high_watermark,
                log_start_offset=part.log_start_offset,
                log_end_offset=part.log_end_offset,
                diverging_epoch=diverging,
                records=part.records,
                current_leader=-1 if leader is None else leader.leader_id,
                current_leader_epoch=NO_EPOCH if leader is None else leader.leader_epoch,
                message=part.message,
            )
    return found


def answer_to_proto(partition: int, answer: FetchAnswer) -> broker_pb2.FetchPartitionResponse:
    """The leader's answer for one partition; the last stable offset is
    the high watermark unless a read_committed read gave its own."""
    out = broker_pb2.FetchPartitionResponse(
        partition=partition,
        error=cast(broker_pb2.BrokerError, int(answer.error)),
        message=answer.message,
        high_watermark=answer.high_watermark,
        last_stable_offset=answer.last_stable_offset
        if answer.last_stable_offset >= 0
        else answer.high_watermark,
        log_start_offset=answer.log_start_offset,
        log_end_offset=answer.log_end_offset,
        records=answer.records,
    )
    for producer_id, first_offset in answer.aborted_transactions:
        out.aborted_transactions.add(producer_id=producer_id, first_offset=first_offset)
    if answer.diverging_epoch is not None:
        out.diverging_epoch.CopyFrom(
            broker_pb2.EpochEndOffset(
                epoch=answer.diverging_epoch.epoch, end_offset=answer.diverging_epoch.end_offset
            )
        )
    if answer.error is not Errors.NONE or answer.current_leader != -1:
        out.current_leader.CopyFrom(
            broker_pb2.CurrentLeader(
                leader_id=answer.current_leader, leader_epoch=answer.current_leader_epoch
            )
        )
    return out
