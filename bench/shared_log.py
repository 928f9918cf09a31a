"""What sharing the log costs: a controller's commit path through
:class:`quorum.shared_log.SharedLog` against its state machines alone.

A controller's node applies every committed batch through a ``SharedLog``
of the metadata and key-value state machines (each record answered by its
owner, every part seeing every batch, one log digest).  The peer, in the
same run, is the state machine that owns the records, applied directly.
Two logs are measured: key-value puts (the chaos ``--store kv`` workload,
batches of ``--batch`` records) and metadata records (topic creations).

    .venv/bin/python bench/shared_log.py [--batches N] [--batch R] [--repeat K] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvstore.state_machine import KvStateMachine, encode_put
from metadata.controller import (
    Controller,
    ControllerOptions,
    HeartbeatRequest,
    NewTopic,
    RegisterRequest,
)
from metadata.records import Endpoint, FeatureRange, Record, encode_record
from metadata.state_machine import ControllerStateMachine
from quorum.listener import StateMachine
from quorum.shared_log import SharedLog
from quorum.types import Batch


def kv_log(batches: int, batch: int) -> list[Batch]:
    out, offset = [], 0
    for b in range(batches):
        records = tuple(
            encode_put(f"key-{(b * batch + i) % 1000}", b"v" * 64) for i in range(batch)
        )
        out.append(Batch(offset, 1, records))
        offset += len(records)
    return out


def metadata_log(topics: int) -> list[Batch]:
    """Topic creations of 10 partitions on 3 brokers, one decision a batch."""
    controller = Controller(ControllerOptions("bench"), random.Random(0))
    out: list[Batch] = []
    offset = 0

    def write(records: list[Record]) -> None:
        nonlocal offset
        encoded = tuple(encode_record(r) for r in records)
        controller.replay(records, offset, 1)
        out.append(Batch(offset, 1, encoded))
        offset += len(encoded)

    write(controller.activate(controller.image, 0))
    for broker in (1, 2, 3):
        controller.next_offset = offset
        req = RegisterRequest(
            broker,
            "bench",
            f"inc-{broker}",
            (Endpoint("PLAINTEXT", "h", 9092),),
            None,
            (FeatureRange("metadata.version", 1, 1),),
        )
        registered = controller.register_broker(req, 0)
        epoch = registered.response
        write(registered.records)
        controller.next_offset = offset
        write(controller.heartbeat(HeartbeatRequest(broker, epoch, offset), 0).records)
    for t in range(topics):
        controller.next_offset = offset
        write(controller.create_topics([NewTopic(f"t{t}", 10, 3)]).records)
    return out


def timed(make: Callable[[], StateMachine], log: list[Batch]) -> float:
    sm = make()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for batch in log:
            sm.handle_commit(batch)
        return time.perf_counter() - start
    finally:
        gc.enable()


def shared() -> SharedLog:
    return SharedLog([("metadata", ControllerStateMachine()), ("kv", KvStateMachine())])


def measure(
    name: str, log: list[Batch], peer: Callable[[], StateMachine], repeat: int
) -> dict[str, object]:
    records = sum(len(b.records) for b in log)
    rows = []
    for _ in range(repeat):
        own = timed(peer, log)
        through = timed(shared, log)
        rows.append((own, through))
    own_s = statistics.median(r[0] for r in rows)
    shared_s = statistics.median(r[1] for r in rows)
    # Each run's pair is measured back to back: the median of their ratios
    # is steadier than the ratio of the medians on a noisy machine.
    ratio = statistics.median(r[1] / r[0] for r in rows)
    return {
        "log": name,
        "batches": len(log),
        "records": records,
        "peer_seconds": round(own_s, 4),
        "shared_seconds": round(shared_s, 4),
        "records_per_s_shared": round(records / shared_s),
        "ratio": round(ratio, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--topics", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = [
        measure("key-value puts", kv_log(args.batches, args.batch), KvStateMachine, args.repeat),
        measure("topic creations", metadata_log(args.topics), ControllerStateMachine, args.repeat),
    ]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(
                f"{r['log']}: {r['batches']} batches, {r['records']} records: "
                f"shared log {r['shared_seconds']} s ({r['records_per_s_shared']:,} records/s), "
                f"the owner alone {r['peer_seconds']} s; ratio {r['ratio']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
