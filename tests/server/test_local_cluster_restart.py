"""Brokers that restart keep their logs, as real processes: a broker killed
and started again loads the partition it holds (no stray, not fetched
again from the leader), and the whole cluster brought down and up again
keeps every record, with every broker registering at once (the new active
controller refuses no new incarnation) and none exiting."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.local_cluster import load_state
from tests.server.test_local_cluster_brokers import Up, brokers_by_id, cluster_up, kq, kq_json

pytestmark = pytest.mark.slow

TOPIC = "kept"
VALUES = ["r0", "r1", "r2"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    yield from cluster_up(tmp_path_factory, "restart")


def client(cluster: Up, *args: str, stdin: str = "", timeout: float = 60) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kq.cli", *args, "--cluster-dir", cluster.dir],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def broker_dir(cluster: Up, broker_id: int) -> Path:
    return Path(cluster.dir) / f"broker-{broker_id}"


def partition_dirs(cluster: Up, broker_id: int) -> list[str]:
    logs = broker_dir(cluster, broker_id) / "logs"
    return sorted(p.name for p in logs.iterdir() if p.is_dir())


def broker_log(cluster: Up, broker_id: int) -> str:
    return (broker_dir(cluster, broker_id) / "broker.log").read_text()


def consume(cluster: Up) -> list[str]:
    out = client(
        cluster,
        "consume", "--topic", TOPIC, "--from-beginning", "--max-messages", str(len(VALUES)),
        "--timeout-ms", "20000",
    )  # fmt: skip
    return out.splitlines()


def test_produce(cluster: Up) -> None:
    assert cluster.up.returncode == 0, cluster.up.stderr
    created = kq(
        "topics", "create", TOPIC, "--partitions", "1", "--replication-factor", "3",
        "--config", "min.insync.replicas=2", "--cluster-dir", cluster.dir,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    out = client(cluster, "produce", "--topic", TOPIC, stdin="".join(f"{v}\n" for v in VALUES))
    assert f"{len(VALUES)} record(s) acknowledged" in out
    assert consume(cluster) == VALUES
    for b in (4, 5, 6):
        assert partition_dirs(cluster, b) == [f"{TOPIC}-0"], b


def test_a_killed_broker_keeps_its_log(cluster: Up) -> None:
    partition = broker_dir(cluster, 4) / "logs" / f"{TOPIC}-0"
    inode = partition.stat().st_ino
    killed = kq("cluster", "kill", "4", "--cluster-dir", cluster.dir)
    assert killed.returncode == 0, killed.stderr
    started = kq("cluster", "start", "4", "--cluster-dir", cluster.dir)
    assert started.returncode == 0, started.stderr
    assert "registered and unfenced" in started.stdout
    cluster.record()
    # The same directory, loaded, not set aside and fetched again.
    assert partition_dirs(cluster, 4) == [f"{TOPIC}-0"]
    assert partition.stat().st_ino == inode
    restarted = broker_log(cluster, 4).split("kq cluster: starting broker 4")[-1]
    assert "loaded its logs at metadata offset" in restarted
    assert "strays=()" in restarted and "TopicIdPartition(" in restarted
    assert consume(cluster) == VALUES


def test_the_whole_cluster_down_and_up_keeps_every_record(cluster: Up) -> None:
    down = kq_json("cluster", "down", "--cluster-dir", cluster.dir)
    assert down["brokers"] == {"4": "stopped", "5": "stopped", "6": "stopped"}
    before = {b: len(broker_log(cluster, b)) for b in (4, 5, 6)}
    start = time.monotonic()
    up = kq("cluster", "up", "--cluster-dir", cluster.dir)
    took = time.monotonic() - start
    cluster.record()
    assert up.returncode == 0, up.stderr
    status = brokers_by_id(kq_json("cluster", "status", "--cluster-dir", cluster.dir))
    for b in (4, 5, 6):
        row = status[b]
        assert (row["alive"], row["state"]) == (True, "unfenced"), row
        assert partition_dirs(cluster, b) == [f"{TOPIC}-0"], b
        since = broker_log(cluster, b)[before[b] :]
        assert "strays=()" in since, since[-2000:]
        assert "cannot load its log directories" not in since, since[-2000:]
        # The new active controller has heard from no broker yet: each new
        # incarnation registers at once, never waiting out an old session.
        assert "DUPLICATE_BROKER_REGISTRATION" not in since, since[-2000:]
    assert consume(cluster) == VALUES
    state = load_state(cluster.dir)
    assert state is not None and all(b.pid is not None for b in state.brokers)
    # Bounded: no broker waited out a 9 s session (the first up of a
    # cluster, formatting included, takes about as long on this machine).
    assert took < 60, took
