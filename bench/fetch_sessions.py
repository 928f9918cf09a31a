"""What a replication round costs with many partitions, with and without
fetch sessions (``broker/fetch_session.py``), in the same run.

One process holds a leader (broker 1) and its follower (broker 2): two
``ReplicaManager`` over in-memory log directories fed one metadata image of
``N`` partitions of replication factor 2, the leader's ``BrokerService``
answering the follower on its ``ReplicaFetch`` handler, and the follower
stepping the answers as the broker process does (requests and answers are
serialized and parsed, as gRPC would, but no socket is used). Two ways of
fetching take turns:

* ``full``: every request lists every partition (as before sessions);
* ``session``: the stream's fetch session, as the broker process runs it.

For each, the CPU time of one round (leader and follower together): idle
(nothing written), and with one partition written before each round. The
peer of the sessions' figure is the full fetch's in the same run.

    .venv/bin/python bench/fetch_sessions.py [--partitions 1000,10000] [--rounds 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.codec import answers_in, replica_fetch_request
from broker.fetch_session import FollowerFetchSession
from broker.log_dirs import MemoryLogDirectory
from broker.log_manager import LogManager
from broker.replica import FetchRequest
from broker.replica_manager import ReplicaManager
from broker.service import BrokerService, ServiceSettings
from kqproto import broker_pb2
from metadata.delta import MetadataDelta
from metadata.image import EMPTY_IMAGE, MetadataImage, TopicIdPartition
from metadata.records import (
    Endpoint,
    PartitionRecord,
    Record,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from partition_log.batch import build_batch
from partition_log.records import Record as LogRecord

EPOCHS = {1: 100, 2: 200}
TOPIC_SIZE = 1_000


def image_of(partitions: int) -> MetadataImage:
    records: list[Record] = []
    for broker_id, epoch in EPOCHS.items():
        endpoint = Endpoint("BROKER", "127.0.0.1", 9000 + broker_id)
        records.append(
            RegisterBrokerRecord(broker_id, epoch, f"i-{broker_id}", (endpoint,), None, (), True)
        )
        records.append(UnfenceBrokerRecord(broker_id, epoch))
    for t in range((partitions + TOPIC_SIZE - 1) // TOPIC_SIZE):
        topic_id = f"bench-topic-{t:08d}"
        records.append(TopicRecord(f"t{t}", topic_id))
        for p in range(min(TOPIC_SIZE, partitions - t * TOPIC_SIZE)):
            records.append(PartitionRecord(topic_id, p, (1, 2), (1, 2), leader=1))
    delta = MetadataDelta(EMPTY_IMAGE)
    for offset, record in enumerate(records):
        delta.replay(record, offset, 1)
    return delta.apply()


class _Context:
    """A plaintext call's context, as the handler reads it."""

    def auth_context(self) -> dict[str, Any]:
        return {}

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


class Pair:
    """Broker 1 leading every partition, broker 2 following over a stream."""

    def __init__(self, partitions: int) -> None:
        self.image = image_of(partitions)
        self.now = 1_000_000
        self.managers = {
            b: ReplicaManager(b, LogManager([MemoryLogDirectory(f"broker-{b}")])) for b in EPOCHS
        }
        for manager in self.managers.values():
            manager.apply_delta(self.image, self.now)
        self.service = BrokerService(
            self.managers[1], ServiceSettings("bench"), now_ms=lambda: self.now
        )
        self.keys = sorted(self.managers[1].replicas)

    def states(
        self, keys: Iterable[TopicIdPartition] | None
    ) -> dict[TopicIdPartition, FetchRequest]:
        return self.managers[2].next_fetch_request(1, EPOCHS[2], keys)

    def write(self, key: TopicIdPartition) -> None:
        record = build_batch([LogRecord(0, self.now, b"k", b"v" * 100)])
        self.managers[1].append(key, record, 1, self.now)
        self.service.wake([key])


class Stream:
    """One ReplicaFetch stream on the leader's handler."""

    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.requests: asyncio.Queue[bytes] = asyncio.Queue()
        self.answers: Any = pair.service.ReplicaFetch(self._requests(), _Context())

    async def _requests(self) -> AsyncIterator[broker_pb2.FetchRequest]:
        while True:
            data = await self.requests.get()
            yield broker_pb2.FetchRequest.FromString(data)

    async def ask(self, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
        await self.requests.put(request.SerializeToString())
        answer = await self.answers.__anext__()
        return broker_pb2.FetchResponse.FromString(answer.SerializeToString())

    async def close(self) -> None:
        await self.answers.aclose()


async def full_round(pair: Pair, stream: Stream) -> int:
    requests = pair.states(None)
    response = await stream.ask(
        replica_fetch_request(2, EPOCHS[2], requests, pair.image, max_wait_ms=0)
    )
    answers = answers_in(response)
    for key, answer in answers.items():
        pair.managers[2].step_fetch_answer(key, requests[key], answer, pair.now)
    return len(answers)


async def session_round(pair: Pair, stream: Stream, session: FollowerFetchSession) -> int:
    fetch = session.next_fetch(pair.states)
    assert fetch is not None
    response = await stream.ask(
        replica_fetch_request(
            2,
            EPOCHS[2],
            fetch.listed,
            pair.image,
            max_wait_ms=0,
            incremental=fetch.incremental,
            forgotten=fetch.forgotten,
        )
    )
    answered = session.answered(answers_in(response))
    for key, (request, answer) in answered.items():
        pair.managers[2].step_fetch_answer(key, request, answer, pair.now)
    return len(answered)


async def measure(partitions: int, rounds: int, keep: bool = False) -> Any:
    """The figures of ``rounds`` rounds each way over ``partitions``, each
    way on its own pair of brokers (the same image, the same writes); with
    ``keep``, (figures, the pairs) so that a test can look at the logs."""
    pairs = {"full": Pair(partitions), "session": Pair(partitions)}
    streams = {way: Stream(pair) for way, pair in pairs.items()}
    session = FollowerFetchSession()

    async def one_round(way: str) -> int:
        if way == "full":
            return await full_round(pairs[way], streams[way])
        return await session_round(pairs[way], streams[way], session)

    # Both caught up first (the session's first request is its full one).
    for _ in range(3):
        for way in pairs:
            await one_round(way)
    figures: dict[str, Any] = {"partitions": partitions, "rounds": rounds}
    keys = pairs["full"].keys
    for load in ("idle", "one_written"):
        spent = {"full": 0.0, "session": 0.0}
        answered = {"full": 0, "session": 0}
        for i in range(rounds):
            for way in ("full", "session") if i % 2 == 0 else ("session", "full"):
                pair = pairs[way]
                pair.now += 100
                if load == "one_written":
                    pair.write(keys[(i * 7919) % len(keys)])
                started = time.process_time()
                answered[way] += await one_round(way)
                spent[way] += time.process_time() - started
        figures[load] = {
            "full_ms": 1000 * spent["full"] / rounds,
            "session_ms": 1000 * spent["session"] / rounds,
            "ratio": spent["session"] / spent["full"] if spent["full"] else None,
            "answered_per_round": {w: answered[w] / rounds for w in answered},
        }
    for stream in streams.values():
        await stream.close()
    return (figures, pairs) if keep else figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="1000,10000")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = [asyncio.run(measure(int(n), args.rounds)) for n in args.partitions.split(",") if n]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print("| partitions | round | full fetch, ms | session, ms | ratio |")
    print("|---|---|---|---|---|")
    for r in results:
        for load in ("idle", "one_written"):
            f = r[load]
            print(
                f"| {r['partitions']:,} | {load.replace('_', ' ')} | {f['full_ms']:.2f} | "
                f"{f['session_ms']:.2f} | {f['ratio']:.4f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
