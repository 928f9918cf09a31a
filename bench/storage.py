"""Synced persists per second of RocksStorage, against a bare fsync'd file.

Two workloads, each a stream of ``persist(Ready(entries=..., must_sync=True))``
calls continuing one log: Readies of one 1-record batch, and Readies of one
100-record batch (records of ``--record-bytes`` bytes).  The same-run peer
writes the same encoded batch bytes with ``os.write`` to an append-only file
followed by ``os.fsync``, once per Ready: the floor cost of making those bytes
durable on this disk.  ratio = ours / peer (1.0 would be as fast as a bare
fsync'd append).  Median of ``--repeat`` runs, each peer run right after ours.

    .venv/bin/python bench/storage.py [--dir DIR] [--repeat R] [--json]

``--dir`` picks the file system measured (default: the current directory; a
tmpfs would make every fsync free).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quorum.driver.codec import encode_batch
from quorum.driver.rocks import RocksStorage
from quorum.ready import Ready
from quorum.types import Batch

WORKLOADS = [("1-record Readies", 1, 2000), ("100-record batches", 100, 500)]


def make_readies(records_per_batch: int, count: int, record_bytes: int) -> list[Ready]:
    readies = []
    base = 0
    payload = b"x" * record_bytes
    for _ in range(count):
        batch = Batch(base, 1, (payload,) * records_per_batch)
        readies.append(Ready(entries=(batch,), must_sync=True))
        base = batch.end_offset
    return readies


def ours(directory: Path, readies: list[Ready]) -> float:
    """Persists per second of a fresh RocksStorage."""
    path = Path(tempfile.mkdtemp(prefix="kq-bench-rocks-", dir=directory))
    try:
        with RocksStorage(path) as storage:
            start = time.perf_counter()
            for ready in readies:
                storage.persist(ready)
            return len(readies) / (time.perf_counter() - start)
    finally:
        shutil.rmtree(path)


def peer(directory: Path, readies: list[Ready]) -> float:
    """Writes per second of the same bytes, os.write + os.fsync each."""
    payloads = [b"".join(encode_batch(b) for b in r.entries) for r in readies]
    fd, name = tempfile.mkstemp(prefix="kq-bench-peer-", dir=directory)
    try:
        start = time.perf_counter()
        for data in payloads:
            os.write(fd, data)
            os.fsync(fd)
        return len(payloads) / (time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("."))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for name, per_batch, count in WORKLOADS:
        readies = make_readies(per_batch, count, args.record_bytes)
        rates, peers, ratios = [], [], []
        for _ in range(args.repeat):
            rate = ours(args.dir, readies)
            floor = peer(args.dir, readies)
            rates.append(rate)
            peers.append(floor)
            ratios.append(rate / floor)
        rows.append(
            {
                "workload": name,
                "records_per_ready": per_batch,
                "readies": count,
                "persists_per_second": round(statistics.median(rates)),
                "records_per_second": round(statistics.median(rates) * per_batch),
                "peer_fsyncs_per_second": round(statistics.median(peers)),
                "ratio_to_peer": round(statistics.median(ratios), 3),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(
            "| workload | Readies | persists/s | records/s | peer write+fsync/s | ratio to peer |"
        )
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['workload']} | {r['readies']:,} | {r['persists_per_second']:,} | "
                f"{r['records_per_second']:,} | {r['peer_fsyncs_per_second']:,} | "
                f"{r['ratio_to_peer']:.3f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
