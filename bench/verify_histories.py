"""Register histories of any size for the verification benchmarks, from a real
sequential execution.

``write_register_run`` simulates ``keys * per_key`` client processes, each
bound to one key and running one operation at a time (a read, a write of a
unique value, or a compare-and-set), with random durations.  Each operation
takes effect at a random instant inside its interval (its linearization
point): the generator applies it to the key's register at that instant, in
global time order, so the history it writes is linearizable by construction,
with real overlaps for the checker to search.  Some writes and cas time out
(``info``; half of them took effect, half never did) and retire their process
(Jepsen's renumbering, old + process count).  Versions are those of a single
replicated log: every write and successful cas gets the next offset (epoch 1),
reads carry the version of the write they read, and three nodes export the
same committed log.

Events are produced by a heap in time order and streamed to disk, so memory
stays bounded by the number of processes whatever the history's length.

    .venv/bin/python bench/verify_histories.py OUT_DIR --ops 1000000 --keys 10000
    .venv/bin/python bench/verify_histories.py OUT_DIR --ops 100000 --keys 10 --clients 50

With ``--clients N`` the history is a key-value one (model ``kv``): N client
processes, each picking a random key for every operation, so every key sees
up to N concurrent operations.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["Sizes", "write_register_run"]


@dataclass(frozen=True, slots=True)
class Sizes:
    ops: int = 100_000
    keys: int = 1_000
    per_key: int = 3
    seed: int = 1
    info_rate: float = 0.002
    nodes: int = 3
    clients: int = 0
    """With clients > 0: a key-value history, ``clients`` processes each
    picking a random key for every operation (``per_key`` unused), model kv."""


_INVOKE, _APPLY, _COMPLETE = 0, 1, 2
_FIELDS = ("time", "type", "process", "f", "key", "value", "error", "node", "offset", "epoch")


def _dump(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


class _Writer:
    def __init__(self, run: Path, nodes: int) -> None:
        self.history: IO[str] = (run / "history.jsonl").open("w")
        self.logs: list[IO[str]] = []
        for n in range(1, nodes + 1):
            d = run / "nodes" / str(n)
            d.mkdir(parents=True, exist_ok=True)
            self.logs.append((d / "log.jsonl").open("w"))
            (d / "changes.jsonl").write_text(
                _dump(
                    {
                        "node": n,
                        "time": 0,
                        "epoch": 1,
                        "leader": 1,
                        "role": "leader" if n == 1 else "follower",
                    }
                )
            )
        self.index = 0
        self.offset = 0

    def op(self, fields: dict[str, Any]) -> None:
        # The fields in the order of docs/history-format.md, as kq's writer
        # puts them (the loader's fast path takes such lines as they are).
        ordered = {"index": self.index}
        ordered.update((k, fields[k]) for k in _FIELDS if k in fields)
        self.history.write(_dump(ordered))
        self.index += 1

    def commit(self, record: str) -> int:
        """Append a data record to every node's log; returns its offset."""
        self.offset += 1
        digest = hashlib.sha256(record.encode()).hexdigest()
        for n, f in enumerate(self.logs, start=1):
            f.write(
                _dump(
                    {"node": n, "offset": self.offset, "epoch": 1, "kind": "data", "hash": digest}
                )
            )
        return self.offset

    def close(self) -> None:
        self.history.close()
        for f in self.logs:
            f.close()


def write_register_run(out: Path, sizes: Sizes, name: str = "synthetic") -> Path:
    """Write a run folder ``out/<name>`` with a linearizable register history."""
    rng = random.Random(sizes.seed)
    run = out / name
    run.mkdir(parents=True, exist_ok=True)
    w = _Writer(run, sizes.nodes)
    processes = sizes.clients or sizes.keys * sizes.per_key
    # Per key: the value, its version (offset) or None.
    state: list[tuple[str | None, int | None]] = [(None, None)] * sizes.keys
    counters: dict[int, int] = {}
    # Per live process: (key, the op in flight).
    flight: dict[int, dict[str, Any]] = {}
    heap: list[tuple[int, int, int, int]] = []  # (time, kind, seq, process)
    seq = 0
    mean_ns = 2_000_000
    for p in range(processes):
        heapq.heappush(heap, (rng.randrange(mean_ns), _INVOKE, seq, p))
        seq += 1
    invoked = 0
    while heap:
        t, kind, _, p = heapq.heappop(heap)
        if kind == _INVOKE:
            if invoked >= sizes.ops:
                continue
            bound = (p % processes) // sizes.per_key
            key_i = rng.randrange(sizes.keys) if sizes.clients else bound
            key = f"k{key_i}"
            invoked += 1
            counters[p] = counters.get(p, 0) + 1
            r = rng.random()
            value: Any
            if r < 0.5:
                f, value = "read", None
            elif r < 0.75:
                f, value = "write", f"v{p}-{counters[p]}"
            else:
                current = state[key_i][0] if rng.random() < 0.7 else f"v-stale-{p}"
                f, value = "cas", [current, f"v{p}-{counters[p]}"]
            duration = int(rng.expovariate(1 / mean_ns)) + 1000
            info = f != "read" and rng.random() < sizes.info_rate
            takes_effect = not info or rng.random() < 0.5
            op = {"f": f, "value": value, "call": t, "ret": t + duration, "info": info}
            op["key"] = key_i
            flight[p] = op
            w.op({"time": t, "type": "invoke", "process": p, "f": f, "key": key, "value": value})
            if takes_effect:
                heapq.heappush(heap, (t + rng.randrange(1, duration), _APPLY, seq, p))
                seq += 1
            heapq.heappush(heap, (t + duration, _COMPLETE, seq, p))
            seq += 1
        elif kind == _APPLY:
            op = flight[p]
            key_i = op["key"]
            key = f"k{key_i}"
            current_value, version = state[key_i]
            if op["f"] == "read":
                op["result"], op["version"] = current_value, version
            elif op["f"] == "write":
                off = w.commit(f"{key}={op['value']}")
                state[key_i] = (op["value"], off)
                op["version"] = off
            else:
                expected, new = op["value"]
                if current_value == expected:
                    off = w.commit(f"{key}={new}")
                    state[key_i] = (new, off)
                    op["version"], op["ok"] = off, True
                else:
                    op["ok"] = False
        else:
            op = flight.pop(p)
            key_i = op["key"]
            key = f"k{key_i}"
            fields: dict[str, Any] = {"time": t, "process": p, "f": op["f"], "key": key}
            if op["info"]:
                fields.update(type="info", value=op["value"], error="timeout")
                nxt = p + processes  # retired: the worker goes on as a new process
            elif op["f"] == "read":
                fields.update(type="ok", value=op["result"], node=1)
                if op["version"] is not None:
                    fields.update(offset=op["version"], epoch=1)
                nxt = p
            elif op["f"] == "cas" and not op["ok"]:
                fields.update(type="fail", value=op["value"], error="precondition", node=1)
                nxt = p
            else:
                fields.update(type="ok", value=op["value"], node=1, offset=op["version"], epoch=1)
                nxt = p
            w.op(fields)
            heapq.heappush(heap, (t + rng.randrange(100_000), _INVOKE, seq, nxt))
            seq += 1
    w.close()
    config = {
        "format": 1,
        "name": name,
        "backend": "synthetic",
        "model": "kv" if sizes.clients else "register",
        "nodes": list(range(1, sizes.nodes + 1)),
        "faults": [],
        "start_unix_ns": None,
        "ops": sizes.ops,
        "keys": sizes.keys,
        "per_key": sizes.per_key,
        "clients": sizes.clients,
        "seed": sizes.seed,
    }
    (run / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return run


def main(argv: list[str] | None = None) -> int:
    d = Sizes()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ops", type=int, default=d.ops)
    parser.add_argument("--keys", type=int, default=d.keys)
    parser.add_argument("--per-key", type=int, default=d.per_key)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--info-rate", type=float, default=d.info_rate)
    parser.add_argument("--nodes", type=int, default=d.nodes)
    parser.add_argument(
        "--clients", type=int, default=0, help="a kv history: this many clients over all keys"
    )
    parser.add_argument("--name", default="synthetic")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    run = write_register_run(
        args.out,
        Sizes(
            args.ops,
            args.keys,
            args.per_key,
            args.seed,
            info_rate=args.info_rate,
            nodes=args.nodes,
            clients=args.clients,
        ),
        name=args.name,
    )
    print(f"{run}: {args.ops:,} ops in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
