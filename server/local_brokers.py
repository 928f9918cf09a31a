"""The brokers of a local cluster (:mod:`server.local_cluster`): starting
them, waiting until the controller has them registered and unfenced,
their status, and stopping a cluster's processes in order.

What ``kq cluster`` does with a cluster's brokers, for the chaos harness
and the benchmarks to do alike.  A broker is unfenced once it has
registered and caught up with the metadata log (Kafka's
``BrokerHeartbeatManager``): only then may it lead or be in an ISR, so
that is what starting waits for.  The controller is asked with
DescribeCluster (as ``kq brokers list``), by the admin user on a TLS
cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kqproto import metadata_pb2
from metadata.client import IndeterminateError, MetadataClient, MetadataClientError
from server.errors import UserError
from server.local_cluster import (
    BrokerState,
    ClusterState,
    NodeState,
    check_none_exited,
    log_tail,
    node_alive,
    process_paused,
    spawn_node,
    wait_gone,
)

__all__ = [
    "broker_epochs",
    "broker_registrations",
    "broker_state",
    "broker_status_rows",
    "start_brokers",
    "stop_members",
    "wait_for_brokers",
]


async def broker_registrations(
    state: ClusterState, timeout_s: float = 2.0
) -> dict[int, metadata_pb2.BrokerDescription] | None:
    """Every broker the active controller has registered, by id; None if no
    controller answered within ``timeout_s``."""
    if not state.nodes:
        return None
    client = MetadataClient(
        [n.address for n in state.nodes],
        timeout_s=timeout_s,
        credentials=state.client_credentials(),
    )
    try:
        answer = await client.describe_cluster(linearizable=True)
    except (MetadataClientError, IndeterminateError):
        return None
    finally:
        await client.close()
    return {b.broker_id: b for b in answer.brokers}


def broker_state(registration: metadata_pb2.BrokerDescription | None) -> str:
    """As ``kq brokers list`` names it, or ``unregistered``."""
    if registration is None:
        return "unregistered"
    if registration.in_controlled_shutdown:
        return "controlled-shutdown"
    return "fenced" if registration.fenced else "unfenced"


async def broker_epochs(state: ClusterState, timeout_s: float = 2.0) -> dict[int, int]:
    """The broker epoch of each registered broker of ``state`` now (-1 for
    none, or if no controller answers): a broker started after this is up
    once registered at a larger epoch (each registration gets a new one)."""
    found = await broker_registrations(state, timeout_s) or {}
    return {
        b.node_id: found[b.node_id].broker_epoch if b.node_id in found else -1
        for b in state.brokers
    }


async def wait_for_brokers(
    state: ClusterState,
    procs: Mapping[int, subprocess.Popen[bytes]],
    timeout_s: float,
    since: Mapping[int, int] | None = None,
) -> dict[int, int]:
    """Wait until every broker in ``procs`` is registered at an epoch above
    ``since`` (its epoch before it was started; -1: any) and unfenced; the
    epochs.  UserError with the end of its log if one exits, or naming
    those not up (and their state) at the timeout."""
    deadline = time.monotonic() + timeout_s
    since = since or {}
    seen: dict[int, metadata_pb2.BrokerDescription] | None = None
    while True:
        check_none_exited(state, procs, state.broker, "broker")
        seen = await broker_registrations(state, min(2.0, max(0.5, deadline - time.monotonic())))
        late = [b for b in procs if not _up(seen, b, since.get(b, -1))]
        if not late:
            assert seen is not None
            return {b: seen[b].broker_epoch for b in procs}
        if time.monotonic() >= deadline:
            if seen is None:
                why = "no controller answered"
            else:
                why = ", ".join(
                    f"broker {b}: {_late_state(seen.get(b), since.get(b, -1))}" for b in late
                )
            first = state.broker(late[0])
            raise UserError(
                f"broker(s) {','.join(map(str, late))} not registered and unfenced within "
                f"{timeout_s:g} s ({why}); they are still running: see `kq cluster status "
                f"--cluster-dir {state.dir}`; the end of {state.path(first.log_file)}:\n"
                f"{log_tail(state, first)}"
            )
        await asyncio.sleep(0.2)


def _up(
    seen: Mapping[int, metadata_pb2.BrokerDescription] | None, broker_id: int, since: int
) -> bool:
    found = None if seen is None else seen.get(broker_id)
    return (
        found is not None
        and found.broker_epoch > since
        and not found.fenced
        and not found.in_controlled_shutdown
    )


def _late_state(found: metadata_pb2.BrokerDescription | None, since: int) -> str:
    if found is not None and found.broker_epoch <= since:
        return "not registered again yet"
    return broker_state(found)


async def start_brokers(
    state: ClusterState, brokers: Sequence[BrokerState], timeout_s: float
) -> dict[int, subprocess.Popen[bytes]]:
    """Start ``brokers`` (each ``kq broker start`` in its own session) and
    wait until each is registered anew and unfenced; their processes."""
    since = await broker_epochs(state)
    procs = {b.node_id: spawn_node(state, b) for b in brokers}
    await wait_for_brokers(state, procs, timeout_s, since)
    return procs


async def broker_status_rows(state: ClusterState, timeout_s: float = 1.0) -> list[dict[str, Any]]:
    """Per broker: its address, pid and whether it runs, and how the active
    controller has it (``registered``, ``fenced``, ``state``, ``epoch``; all
    None when no controller answered)."""
    alive = [node_alive(state, b) for b in state.brokers]
    seen = await broker_registrations(state, timeout_s) if state.brokers else {}
    rows = []
    for b, up in zip(state.brokers, alive, strict=True):
        found = None if seen is None else seen.get(b.node_id)
        rows.append(
            {
                "broker_id": b.node_id,
                "address": b.address,
                "metrics_address": b.metrics_address or None,
                "pid": b.pid if up else None,
                "alive": up,
                "paused": up and b.pid is not None and process_paused(b.pid),
                "registered": None if seen is None else found is not None,
                "fenced": None if found is None else found.fenced,
                "state": "unknown" if seen is None else broker_state(found),
                "epoch": None if found is None else found.broker_epoch,
                "security_protocol": state.security_protocol.value,
                "data_dir": b.data_dir,
                "log_dirs": list(b.log_dirs),
                "log_file": b.log_file,
            }
        )
    return rows


def stop_members(
    state: ClusterState, members: Sequence[NodeState], timeout_s: float
) -> dict[int, str]:
    """Stop the running ``members``: brokers first (SIGTERM: a controlled
    shutdown, which needs the controllers), then the controllers (SIGTERM:
    a leader resigns); SIGKILL for those still running after ``timeout_s``
    (per group).  A paused process is resumed so that it sees the SIGTERM.
    What became of each, by id; pids cleared in the saved state."""
    outcome: dict[int, str] = {}
    brokers = [m for m in members if isinstance(m, BrokerState)]
    controllers = [m for m in members if not isinstance(m, BrokerState)]
    for group in (brokers, controllers):
        running = [m for m in group if node_alive(state, m)]
        for m in group:
            outcome[m.node_id] = "not running"
        for m in running:
            assert m.pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(m.pid, signal.SIGTERM)
                os.kill(m.pid, signal.SIGCONT)
            outcome[m.node_id] = "stopped"
        if not wait_gone(state, running, timeout_s):
            for m in running:
                if node_alive(state, m):
                    assert m.pid is not None
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(m.pid, signal.SIGKILL)
                    outcome[m.node_id] = f"killed (still running after {timeout_s:g} s)"
            wait_gone(state, running, 5.0)
        for m in running:
            if node_alive(state, m):
                outcome[m.node_id] = f"still running (pid {m.pid})"
            else:
                m.pid = None
    for m in members:
        if not outcome[m.node_id].startswith("still running"):
            m.pid = None
    state.save()
    return outcome
