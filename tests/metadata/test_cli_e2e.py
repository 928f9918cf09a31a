"""The admin commands against a real controller quorum, as a user runs them.

Three controllers and three test brokers (registered and heartbeating over
gRPC) run in a background thread; every ``kq`` command runs in a child
process, as from a shell, with ``--bootstrap`` naming all controllers (it
finds the active one).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server.local_cluster import run_kq
from tests.metadata.metadata_cluster import MetadataCluster, TestBroker, running_metadata


class Background:
    """The cluster and brokers on their own event loop in a thread."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ready = threading.Event()
        self.failed: BaseException | None = None
        self.bootstrap = ""
        self.cluster: MetadataCluster | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self.ready.wait(60):
            raise AssertionError("the cluster did not start in 60 s")
        if self.failed is not None:
            raise AssertionError(f"the cluster failed to start: {self.failed!r}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the test thread
            self.failed = exc
            self.ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with running_metadata(self.root) as cluster:
            self.cluster = cluster
            await cluster.wait_active()
            brokers = [TestBroker(cluster, b, rack=f"r{b % 2}") for b in (1, 2, 3)]
            for broker in brokers:
                await broker.start()
            self.bootstrap = ",".join(cluster.voters.values())
            self.ready.set()
            await self._stop.wait()
            for broker in brokers:
                await broker.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Background]:
    background = Background(tmp_path)
    try:
        background.start()
        yield background
    finally:
        background.stop()


def kq(bg: Background, *args: str) -> tuple[int, str, str]:
    done = run_kq(*args, "--bootstrap", bg.bootstrap, timeout_s=60)
    return done.returncode, done.stdout, done.stderr


def kq_json(bg: Background, *args: str) -> Any:
    code, out, err = kq(bg, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_admin_commands_end_to_end(cluster: Background, tmp_path: Path) -> None:
    bg = cluster
    brokers = kq_json(bg, "brokers", "list")
    assert {b["id"] for b in brokers["brokers"]} == {1, 2, 3}

    code, out, err = kq(
        bg, "topics", "create", "orders", "--partitions", "6", "--replication-factor", "3",
        "--config", "retention.ms=3600000",
    )  # fmt: skip
    assert code == 0, err
    # The replication factor above the live brokers names both numbers.
    code, out, err = kq(
        bg, "topics", "create", "big", "--partitions", "1", "--replication-factor", "4"
    )
    assert code == 1
    assert "INVALID_REPLICATION_FACTOR" in err and "4" in err and "3" in err
    code, out, err = kq(bg, "topics", "create", "orders", "--partitions", "1")
    assert code == 1 and "TOPIC_ALREADY_EXISTS" in err

    listed = kq_json(bg, "topics", "list")
    assert [t["name"] for t in listed] == ["orders"]

    code, out, err = kq(bg, "topics", "describe", "orders")
    assert code == 0, err
    assert "Topic: orders" in out and "PartitionCount: 6" in out and "ReplicationFactor: 3" in out
    assert out.count("Leader:") == 6
    described = kq_json(bg, "topics", "describe", "orders")
    (topic,) = described["topics"]
    leaders = [p["leader"] for p in topic["partitions"]]
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]  # leaders spread over the brokers
    for p in topic["partitions"]:
        assert sorted(p["isr"]) == [1, 2, 3]

    code, out, err = kq(bg, "topics", "add-partitions", "orders", "--partitions", "8")
    assert code == 0, err
    described = kq_json(bg, "topics", "describe", "orders")
    assert len(described["topics"][0]["partitions"]) == 8

    # Configs, and the conditional update.
    code, out, err = kq(
        bg, "configs", "alter", "--entity-type", "topics", "--entity-name", "orders",
        "--add-config", "retention.ms=7200000", "--if-value", "retention.ms=3600000",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = kq(
        bg, "configs", "alter", "--entity-type", "topics", "--entity-name", "orders",
        "--add-config", "retention.ms=1", "--if-value", "retention.ms=3600000",
    )  # fmt: skip
    assert code == 1 and "CONFIG_PRECONDITION_FAILED" in err
    configs = kq_json(
        bg, "configs", "describe", "--entity-type", "topics", "--entity-name", "orders"
    )
    (resource,) = configs["resources"]
    assert {c["name"]: c["value"] for c in resource["configs"]}["retention.ms"] == "7200000"
    code, out, err = kq(
        bg, "configs", "alter", "--entity-type", "topics", "--entity-name", "orders",
        "--add-config", "retension.ms=1",
    )  # fmt: skip
    assert code == 1 and "INVALID_CONFIG" in err and "retention.ms" in err

    # Leader elections: everyone leads its preferred partitions already.
    code, out, err = kq(bg, "leader-election", "--type", "preferred", "--all-topic-partitions")
    assert code == 0, err

    # A reassignment: partition 0 moves to a new replica set.
    plan = tmp_path / "move.json"
    first = described["topics"][0]["partitions"][0]
    target = [r for r in (3, 2, 1) if r != first["replicas"][0]][:2]
    plan.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": "orders", "partition": 0, "replicas": target}]}
        )
    )
    code, out, err = kq(bg, "reassign", "start", "--reassignment-json-file", str(plan))
    assert code == 0, err
    assert "rollback" in out.lower()
    # Shrinking to replicas already in the ISR completes at once.
    described = kq_json(bg, "topics", "describe", "orders")
    assert described["topics"][0]["partitions"][0]["replicas"] == target
    listed = kq_json(bg, "reassign", "list")
    assert listed["reassignments"] == []

    code, out, err = kq(bg, "features", "describe")
    assert code == 0 and "metadata.version" in out

    code, out, err = kq(bg, "topics", "delete", "orders")
    assert code == 0, err
    assert kq_json(bg, "topics", "list") == []
    code, out, err = kq(bg, "topics", "delete", "orders")
    assert code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err
    code, out, err = kq(bg, "topics", "delete", "orders", "--if-exists")
    assert code == 0, err
