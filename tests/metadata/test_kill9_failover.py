"""The active controller killed with SIGKILL: a standby takes over with every
topic, broker and config, and brokers keep their registrations.

Three ``kq controller start`` processes (``kq cluster up``); brokers register
and heartbeat over gRPC from this test; the admin commands run as a user
runs them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from kqproto import metadata_pb2
from metadata.client import Endpoint, MetadataClient, SupportedFeature
from server.local_cluster import ClusterState, broker_tls, free_base_port, load_state, run_kq


def kq(*args: str) -> tuple[int, str, str]:
    done = run_kq(*args, timeout_s=60)
    return done.returncode, done.stdout, done.stderr


def kq_json(*args: str) -> Any:
    code, out, err = kq(*args, "--json")
    assert code == 0, err
    return json.loads(out)


async def register_brokers(bootstrap: list[str], state: ClusterState) -> dict[int, int]:
    """Brokers 1-3 register and heartbeat once they are caught up, each with
    its own certificate (a broker's lifecycle calls must come from it); the
    admin reads the cluster's metadata offset."""
    epochs: dict[int, int] = {}
    admin = MetadataClient(bootstrap, timeout_s=10, credentials=state.client_credentials())
    brokers = {
        b: MetadataClient(
            bootstrap, timeout_s=10, credentials=broker_tls(state, b).channel_credentials()
        )
        for b in (1, 2, 3)
    }
    try:
        for b, client in brokers.items():
            registered = await client.register_broker(
                b,
                cluster_id=state.cluster_id,
                incarnation_id=_uuid(),
                endpoints=[Endpoint("PLAINTEXT", "127.0.0.1", 19_000 + b)],
                features=[SupportedFeature("metadata.version", 1, 1)],
            )
            assert registered.error == metadata_pb2.NONE, registered
            epochs[b] = registered.broker_epoch
        for b, epoch in epochs.items():
            for _ in range(50):
                cluster = await admin.describe_cluster(linearizable=True)
                beat = await brokers[b].broker_heartbeat(b, epoch, cluster.metadata_offset)
                assert beat.error == metadata_pb2.NONE, beat
                if not beat.is_fenced:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"broker {b} was not unfenced")
    finally:
        for client in (admin, *brokers.values()):
            await client.close()
    return epochs


def _uuid() -> str:
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


@pytest.mark.slow
def test_sigkill_of_the_active_controller_loses_no_metadata(tmp_path: Path) -> None:
    d = str(tmp_path / "cluster")
    base = free_base_port(3)
    # A TLS cluster (the default): named by address, it wants the admin's certificate.
    certs = ("--certs-dir", f"{d}/certs")
    try:
        up = kq(
            "cluster", "up", "--dir", d, "--base-port", str(base), "--brokers", "0",
            # Brokers here heartbeat only while registering; keep them alive.
            "--set", "controller.broker_session_timeout_ms=600000",
        )  # fmt: skip
        assert up[0] == 0, up[2]
        status = kq_json("cluster", "status", "--dir", d)
        addresses = [n["address"] for n in status["nodes"]]
        bootstrap = ",".join(addresses)
        described = kq_json(
            "quorum", "describe", "--status", "--bootstrap-server", bootstrap, *certs
        )
        state = load_state(d)
        assert state is not None and state.tls
        assert described["cluster_id"] == state.cluster_id
        epochs = asyncio.run(register_brokers(addresses, state))

        code, _, err = kq(
            "topics", "create", "events", "--partitions", "6", "--replication-factor", "3",
            "--bootstrap", bootstrap, *certs,
        )  # fmt: skip
        assert code == 0, err
        code, _, err = kq(
            "configs", "alter", "--entity-type", "topics", "--entity-name", "events",
            "--add-config", "retention.ms=60000", "--bootstrap", bootstrap, *certs,
        )  # fmt: skip
        assert code == 0, err
        before = kq_json("topics", "describe", "events", "--bootstrap", bootstrap, *certs)

        leader = next(n["node_id"] for n in status["nodes"] if n["role"] == "leader")
        code, _, err = kq("cluster", "kill", str(leader), "--dir", d)
        assert code == 0, err

        # A standby becomes active; the admin commands find it and see
        # everything that was committed.
        after = kq_json("topics", "describe", "events", "--bootstrap", bootstrap, *certs)
        assert after["topics"][0]["topic_id"] == before["topics"][0]["topic_id"]
        assert [p["replicas"] for p in after["topics"][0]["partitions"]] == [
            p["replicas"] for p in before["topics"][0]["partitions"]
        ]
        brokers = kq_json("brokers", "list", "--bootstrap", bootstrap, *certs)
        assert {b["id"]: b["epoch"] for b in brokers["brokers"]} == epochs
        # Fresh sessions on the new controller: nobody was fenced.
        assert not any(b["fenced"] for b in brokers["brokers"])
        assert brokers["controller_id"] != leader
        configs = kq_json(
            "configs", "describe", "--entity-type", "topics", "--entity-name", "events",
            "--bootstrap", bootstrap, *certs,
        )  # fmt: skip
        values = {c["name"]: c["value"] for c in configs["resources"][0]["configs"]}
        assert values["retention.ms"] == "60000"
        # And it takes writes.
        code, _, err = kq(
            "topics", "create", "more", "--partitions", "1", "--replication-factor", "3",
            "--bootstrap", bootstrap, *certs,
        )  # fmt: skip
        assert code == 0, err

        # The killed controller comes back and catches up from the others.
        code, _, err = kq("cluster", "start", str(leader), "--dir", d)
        assert code == 0, err
        listed = kq_json(
            "topics",
            "list",
            "--stale",
            "--bootstrap",
            status["nodes"][leader - 1]["address"],
            *certs,
        )
        for _ in range(100):
            if {t["name"] for t in listed} == {"events", "more"}:
                break
            listed = kq_json(
                "topics",
                "list",
                "--stale",
                "--bootstrap",
                status["nodes"][leader - 1]["address"],
                *certs,
            )
        assert {t["name"] for t in listed} == {"events", "more"}
    finally:
        kq("cluster", "down", "--dir", d)
