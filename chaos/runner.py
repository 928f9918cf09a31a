"""One chaos run from start to finish: :func:`run_chaos`.

A run makes its run folder (:mod:`history.runs`), starts a cluster backend,
runs a workload against it while a nemesis carries out a fault schedule
(:func:`chaos.nemesis.schedule`), then heals everything, waits for the
cluster to recover, makes the workload's final reads (and its final check,
if it has one), collects what the nodes left and stops the cluster.  Every
operation goes to ``history.jsonl`` as it happens
(:class:`history.files.HistoryWriter`); ``config.json`` is written before the
cluster starts and ``summary.json`` last.  Whatever fails, the backend is
stopped and cleaned up and what was recorded stays.

Backends and workloads are registries (:data:`BACKENDS`, :data:`WORKLOADS`)
so that others can be added by name.

The cluster runs mutual TLS unless the config says ``tls=False``
(``--insecure``): the backend makes a CA and certificates in the run's
cluster folder, and the workload's clients and the harness's own calls
present the admin user's certificate.  ``config.json`` and
``summary.json`` record the ``security_protocol``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import grpc

import bugs
from broker.group.placement import OFFSETS_TOPIC, partition_for
from bugs import Bug
from chaos.backend import TOPOLOGIES, ClusterBackend, isolate
from chaos.leader_moves import ELECT, LeaderMoves, Move
from chaos.nemesis import (
    BROKER_KINDS,
    CATCH_UP_KIND,
    COORDINATOR_KIND,
    FAULT_KINDS,
    KILL_KINDS,
    LEADER_MOVE_KINDS,
    NETWORK_KINDS,
    PACKET_KIND,
    PARTITION_KINDS,
    POWER_LOSS_KIND,
    POWER_LOSS_KINDS,
    REASSIGN_KIND,
    ROTATE_KIND,
    SEVER_KIND,
    STRAND_ISOLATED_KIND,
    STRAND_KINDS,
    TORN_POWER_LOSS_KIND,
    TORN_POWER_LOSS_KINDS,
    Action,
    nemesis_op,
    resolve,
    schedule,
    sever_groups,
    strand_groups,
)
from chaos.workloads import Workload
from chaos.workloads.queue_setup import QueueOptions
from chaos.workloads.register import (
    CONFIG_REGISTER_KEYS,
    ConfigRegisterClient,
    KvRegisterClient,
    RegisterClient,
    RegisterWorkload,
    config_value,
    default_value,
    pinned_kv_clients,
)
from chaos.workloads.topics import TopicsWorkload
from history.files import NEMESIS, HistoryWriter, Op, Problem, check_well_formed, read_history
from history.runs import FORMAT_VERSION, RunDir, create_run_dir, summarize, write_json
from metadata.client import ConfigOp, ConfigResource, MetadataClient, error_code
from quorum.driver.client import describe
from server.storage_mode import LOSE_UNSYNCED_VARIABLE, TORN

__all__ = [
    "BACKENDS",
    "NEMESES",
    "WORKLOADS",
    "CLIENT_BUGS",
    "BackendSpec",
    "Progress",
    "RunConfig",
    "RunResult",
    "WorkloadSpec",
    "bug_environment",
    "coordinator_of",
    "current_leader",
    "expand_nemesis",
    "fault_topics",
    "run_chaos",
    "storage_environment",
    "summary_of",
    "wait_recovered",
]


# -- registries ----------------------------------------------------------------


class MakeBackend(Protocol):
    def __call__(
        self,
        nodes: int,
        workdir: Path,
        network_faults: bool,
        tls: bool,
        brokers: int = 0,
        broker_settings: Mapping[str, object] | None = None,
    ) -> ClusterBackend: ...


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """How to make a backend of one kind.

    ``make(nodes, workdir, network_faults, tls, brokers=0)`` returns an
    unstarted backend whose scratch data lives under ``workdir`` (removed
    after the run), able to partition the network if ``network_faults``, on
    mutual TLS if ``tls`` (else PLAINTEXT), running ``brokers`` brokers
    beside the controllers (``broker_settings`` in each broker's config),
    every controller and broker process with the environment variables of
    the keyword ``env`` (the bug switch, :func:`bug_environment`), which a
    run gives only when it sets them (so a factory without it still makes
    every run without bugs).  ``brokers``: whether the backend can run brokers.
    """

    make: MakeBackend
    description: str
    brokers: bool = False


def _make_local(
    nodes: int,
    workdir: Path,
    network_faults: bool,
    tls: bool,
    brokers: int = 0,
    broker_settings: Mapping[str, object] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> ClusterBackend:
    from chaos.local import LocalCluster

    return LocalCluster(
        workdir / "cluster",
        nodes,
        network_faults=network_faults,
        tls=tls,
        brokers=brokers,
        broker_settings=broker_settings,
        env=env,
    )


def _make_docker(
    nodes: int,
    workdir: Path,
    network_faults: bool,
    tls: bool,
    brokers: int = 0,
    broker_settings: Mapping[str, object] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> ClusterBackend:
    from chaos.docker import DockerCluster

    return DockerCluster(nodes, tls=tls, env=env, brokers=brokers, broker_settings=broker_settings)


CLIENT_BUGS: Final = frozenset({Bug.HARNESS_NOT_LEADER_AS_FAIL})
"""Bugs of the chaos client itself (the harness), not of the nodes: a run
with one of them turns it on in the runner's own process."""


def bug_environment(on: frozenset[Bug]) -> dict[str, str]:
    """The environment that turns exactly ``on`` on in a controller or
    broker process (:func:`bugs.from_environment`): the bugs' ids with the
    acknowledgement, or both variables empty, so that a run without bugs
    never inherits the switch from the runner's own environment."""
    if not on:
        return {bugs.BUGS_VARIABLE: "", bugs.ACK_VARIABLE: ""}
    return {
        bugs.BUGS_VARIABLE: ",".join(bug_ids(on)),
        bugs.ACK_VARIABLE: bugs.ACKNOWLEDGEMENT,
    }


def bug_ids(on: frozenset[Bug]) -> list[str]:
    """``on``'s ids in a stable order (B2 before B10)."""
    return [b.id for b in sorted(on, key=_bug_order)]


BACKENDS: Final[dict[str, BackendSpec]] = {
    "local": BackendSpec(
        _make_local,
        "one `kq controller start` process per node on 127.0.0.(10+i), and with brokers "
        "one `kq broker start` per broker on 127.0.1.(id), as `kq cluster up --brokers`; "
        "SIGKILL, SIGSTOP, iptables partitions, packet loss and NFQUEUE delay",
        brokers=True,
    ),
    "docker": BackendSpec(
        _make_docker,
        "one container per node on a Docker network of its own, and with brokers one "
        "`kq broker start` container per broker on it; "
        "docker kill, docker pause, iptables partitions in DOCKER-USER, "
        "packet loss and delay (netem, else NFQUEUE)",
        brokers=True,
    ),
}
"""Cluster backends by name (``--backend``)."""


Credentials = Callable[[int | None], grpc.ChannelCredentials | None]
"""A backend's :meth:`~chaos.backend.ClusterBackend.client_credentials`."""


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """How to make a workload of one kind.

    ``make(config, recorder, addresses, rng, credentials, brokers)`` returns
    the workload that records into ``recorder`` and talks to the nodes at
    ``addresses`` (node id to client address; the controllers), presenting
    ``credentials(None)`` (the admin user's certificate; None: plaintext),
    or ``credentials(id)`` for a test broker's own calls; ``brokers`` are
    the brokers' client addresses (empty unless ``needs_brokers``).
    """

    make: Callable[
        [
            RunConfig,
            HistoryWriter,
            Mapping[int, str],
            random.Random,
            Credentials,
            Mapping[int, str],
        ],
        Workload,
    ]
    description: str
    needs_brokers: bool = False


REGISTER_STORES: Final = {
    "configs": "the metadata controller's cluster configs, by conditional AlterConfigs "
    "(reads carry no version)",
    "kv": "the quorum's own key-value store (reads carry the version they read)",
}
"""Where the register workload's registers live (``--store``)."""


def register_keys(config: RunConfig) -> list[str]:
    """The register workload's keys: cluster config names, or ``k0``, ``k1``, ..."""
    if config.store == "configs":
        return list(CONFIG_REGISTER_KEYS[: config.keys])
    return [f"k{i}" for i in range(config.keys)]


def _make_register(
    config: RunConfig,
    writer: HistoryWriter,
    addresses: Mapping[int, str],
    rng: random.Random,
    credentials: Credentials,
    brokers: Mapping[int, str],
) -> Workload:
    timeout_s = config.client_timeout_s
    open_client: Callable[[], RegisterClient] | Callable[[int], RegisterClient]
    client = ConfigRegisterClient if config.store == "configs" else KvRegisterClient
    open_client = partial(client, addresses, timeout_s=timeout_s, credentials=credentials(None))
    if config.pin_clients:
        # Jepsen's binding: each process asks its own node only.
        open_client = pinned_kv_clients(addresses, timeout_s, credentials(None))
    return RegisterWorkload(
        writer,
        open_client,
        rng,
        per_process=config.pin_clients,
        concurrency=config.concurrency,
        keys=register_keys(config),
        rate=config.rate,
        op_timeout_s=config.op_timeout_s,
        make_value=config_value if config.store == "configs" else default_value,
    )


def _make_topics(
    config: RunConfig,
    writer: HistoryWriter,
    addresses: Mapping[int, str],
    rng: random.Random,
    credentials: Credentials,
    brokers: Mapping[int, str],
) -> Workload:
    def open_client(broker: int | None = None) -> MetadataClient:
        return MetadataClient(
            list(addresses.values()),
            timeout_s=config.client_timeout_s,
            credentials=credentials(broker),
        )

    return TopicsWorkload(
        writer,
        open_client,
        rng,
        open_broker_client=open_client,
        nodes=addresses,
        concurrency=config.concurrency,
        rate=config.rate,
        op_timeout_s=config.op_timeout_s,
        final_timeout_s=config.recovery_timeout_s,
    )


def _make_queue(
    config: RunConfig,
    writer: HistoryWriter,
    addresses: Mapping[int, str],
    rng: random.Random,
    credentials: Credentials,
    brokers: Mapping[int, str],
) -> Workload:
    from chaos.workloads.queue_setup import make_queue_workload

    return make_queue_workload(
        config.queue,
        writer,
        addresses,
        brokers,
        rng,
        credentials(None),
        concurrency=config.concurrency,
        rate=config.rate,
        op_timeout_s=config.op_timeout_s,
        client_timeout_s=config.client_timeout_s,
    )


WORKLOADS: Final[dict[str, WorkloadSpec]] = {
    "register": WorkloadSpec(
        _make_register, "a linearizable compare-and-set register per key (read, write, cas)"
    ),
    "topics": WorkloadSpec(
        _make_topics,
        "topics created and deleted while test brokers register, heartbeat and are fenced; "
        "the final topics and brokers checked against the history",
    ),
    "queue": WorkloadSpec(
        _make_queue,
        "Jepsen's Kafka queue workload on brokers: send (idempotent, pipelined producer), "
        "poll, assign, consumer crash; final polls of every partition from the beginning",
        needs_brokers=True,
    ),
}
"""Workloads by name (``--workload``)."""

NEMESES: Final = (
    *KILL_KINDS,
    POWER_LOSS_KIND,
    TORN_POWER_LOSS_KIND,
    "pause",
    "partition",
    *PARTITION_KINDS,
    PACKET_KIND,
    ROTATE_KIND,
    *BROKER_KINDS,
)
"""The ``--nemesis`` names: ``kill`` a random node, ``kill-leader`` the
leader, ``kill-majority`` a majority at once (only when named);
``partition`` is every partition kind the node count allows; the kinds can
also be named one by one; ``packet`` (slow, lossy links) and
``rotate-certs`` (every node's certificate and key re-issued while it runs;
TLS clusters only) only by name; ``power-loss`` a random node's power cut
and ``power-loss-partition-leader`` a queue partition leader's (every
process of the run then starts in the power-loss test mode:
:func:`storage_environment`), ``torn-power-loss`` and
``torn-power-loss-partition-leader`` the same with torn writes (a broker's
segment files keep a torn part of their unsynced tails); ``reassign`` and ``elect-leader`` move a
queue partition's leadership through the controllers
(:mod:`chaos.leader_moves`); ``sever-partition-leader`` cuts a queue
partition's leader off from the other brokers only (its controller session
kept: :func:`chaos.nemesis.sever_groups`); ``isolate-coordinator`` cuts
the group's coordinator off from every other node (queue runs with
``--group``)."""


def expand_nemesis(names: Sequence[str], nodes: int) -> list[str]:
    """The fault kinds (:data:`chaos.nemesis.FAULT_KINDS`) of the nemesis
    names ``names`` for a cluster of ``nodes`` nodes, in a fixed order;
    :class:`ValueError` for an unknown name or a kind the cluster is too
    small for."""
    kinds: list[str] = []
    for name in names:
        if name not in NEMESES:
            raise ValueError(f"unknown nemesis {name!r}; known: {', '.join(NEMESES)}, or none")
        if name == "partition":
            if nodes < 2:
                raise ValueError("partition needs at least 2 nodes")
            kinds += [k for k in PARTITION_KINDS if _kind_fits(k, nodes)]
        else:
            if not _kind_fits(name, nodes):
                raise ValueError(f"{name} needs at least {_MIN_NODES[name]} nodes, got {nodes}")
            kinds.append(name)
    return [k for k in FAULT_KINDS if k in kinds]


_MIN_NODES: Final = {
    "kill": 1,
    "kill-leader": 1,
    "kill-majority": 3,
    "pause": 1,
    "isolate-one": 2,
    "isolate-leader": 2,
    "halves": 2,
    "bridge": 3,
    "majorities-ring": 5,
    "packet": 2,
    ROTATE_KIND: 1,
    "kill-partition-leader": 1,
    "pause-partition-leader": 1,
    "power-loss-partition-leader": 1,
    "torn-power-loss-partition-leader": 1,
    POWER_LOSS_KIND: 1,
    TORN_POWER_LOSS_KIND: 1,
    "isolate-follower": 2,
    SEVER_KIND: 2,
    COORDINATOR_KIND: 2,
    CATCH_UP_KIND: 2,
    **dict.fromkeys(STRAND_KINDS, 2),
    **dict.fromkeys(LEADER_MOVE_KINDS, 1),
}
assert set(_MIN_NODES) == set(FAULT_KINDS) and set(TOPOLOGIES) <= set(_MIN_NODES)


CATCH_UP_WAIT_S: Final = 15.0
"""How long each step of an ``elect-catching-up-follower`` waits for the
controllers' metadata to show what the step before was for (the follower
out of the ISR, another leader, the follower back in the ISR)."""
CATCH_UP_FETCH_BYTES: Final = 1
"""The severed follower's own ``replica.fetch.max.bytes`` for its catch-up
(a broker config, over the cluster's): one batch a fetch (KIP-74), while
the other replicas fetch in bulk, so that the new leader's HW lags its
epoch start by its last bulk fetch and the follower, re-admitted at that
HW, needs several fetches to reach the epoch start."""
CATCH_UP_CHUNK_MIN_BYTES: Final = 64 * 1024
"""The ``replica.fetch.min.bytes`` of the partition's other followers (the
ones that may lead after the kill) from the sever to the election: far more
than a second of a chaos run's writes, so that the leader holds each of
their fetches for the whole ``replica.fetch.wait.max.ms``
(:data:`CATCH_UP_CHUNK_WAIT_MS`) and they fetch in chunks of about that
long's writes.  A follower learns the leader's HW one fetch late, so the
one elected after the kill holds a chunk of acknowledged records above its
own HW, which the controllers freeze there (its ISR below min ISR,
KAFKA-15583): the severed follower, re-admitted at that HW and fetching
one batch a fetch, needs tens of fetches to pass the epoch start, not one."""
CATCH_UP_CHUNK_WAIT_MS: Final = 1_000
"""Those followers' ``replica.fetch.wait.max.ms``: below the recipe's lag
time (1.5 s), which the controllers ask of a wait (KafkaConfig); a run with
a shorter lag time uses two thirds of it (:meth:`_Nemesis.chunk_wait_ms`)."""
CATCH_UP_PACE_MS: Final = 200
"""The severed follower's own ``replica.fetch.wait.max.ms`` (with
:data:`CATCH_UP_CHUNK_MIN_BYTES`, which one batch never reaches) from the
sever to the election: the leader holds each of its one-batch fetches that
long, so that it catches up one batch every 200 ms.  A chunk is a few
batches a partition, not a second of the target rate (each client's
acks=all send waits for the chunked HW, so a second's writes are about one
send per client), which a follower fetching back to back crosses in
milliseconds, while its re-admission, the runner's next look (every 50 ms)
and the election take a hundred or more: paced, it needs about half a
second or more for the chunk, and a few times that for what it missed
before the kill (about a chunk a second from its shrink to the kill), well
within the election's wait (:data:`CATCH_UP_WAIT_S`)."""
CHUNK_CONFIGS: Final = ("replica.fetch.min.bytes", "replica.fetch.wait.max.ms")
CATCH_UP_POLL_S: Final = 0.05
"""How often the wait for the follower back in the ISR asks the
controllers: the election must come before the follower has fetched up to
the leader's epoch start (one batch a fetch)."""

STRAND_WAIT_S: Final = 15.0
"""How long a strand's kill waits for the controllers to commit the ISR
shrunk to the leader alone (several of ``replica.lag.time.max.ms``, the
AlterPartition's retries included)."""


def _kind_fits(kind: str, nodes: int) -> bool:
    return nodes >= _MIN_NODES[kind]


def storage_environment(config: RunConfig, own: Mapping[str, str]) -> dict[str, str]:
    """The storage mode's variable for every controller and broker process
    of a run (:mod:`server.storage_mode`): on when the run's faults include
    a power loss, so that a kill drops what the processes did not sync
    (``torn`` with a torn power loss: a kill leaves torn segment tails); off
    if this process's environment ``own`` has it (the nodes would inherit
    it); else nothing."""
    if any(f in TORN_POWER_LOSS_KINDS for f in config.faults):
        return {LOSE_UNSYNCED_VARIABLE: TORN}
    if any(f in POWER_LOSS_KINDS for f in config.faults):
        return {LOSE_UNSYNCED_VARIABLE: "1"}
    if LOSE_UNSYNCED_VARIABLE in own:
        return {LOSE_UNSYNCED_VARIABLE: "0"}
    return {}


# -- configuration and results ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunConfig:
    """What to run.  ``faults`` are fault kinds (:func:`expand_nemesis`);
    empty: no nemesis.  ``rate`` is operations per second over all
    ``concurrency`` workers.  The nemesis acts every ``fault_interval_s`` on
    average within fault periods of ``fault_period_s`` separated by
    ``quiet_s`` with no fault (:func:`chaos.nemesis.schedule`)."""

    name: str = "register-local"
    backend: str = "local"
    workload: str = "register"
    faults: tuple[str, ...] = ()
    nodes: int = 3
    time_limit_s: float = 60.0
    rate: float = 200.0
    concurrency: int = 10
    keys: int = 5
    store: str = "configs"
    # register on the kv store: each process bound to one node, as Jepsen
    # binds its clients, instead of following the leader (--pin-clients).
    pin_clients: bool = False
    seed: int | None = None
    runs_dir: str = "runs"
    fault_interval_s: float = 2.0
    fault_period_s: float = 10.0
    quiet_s: float = 5.0
    op_timeout_s: float = 5.0
    client_timeout_s: float = 2.0
    recovery_timeout_s: float = 30.0
    # Mutual TLS (the default); False: PLAINTEXT (--insecure).
    tls: bool = True
    # The queue workload's options (brokers, topics, acks, ...).
    queue: QueueOptions = QueueOptions()
    # Deliberate bugs (the catalogue's, :mod:`bugs`): on in every controller
    # and broker process, and those of the chaos client (CLIENT_BUGS) in
    # this one for the run.  A history made with bugs is marked as such in
    # config.json, summary.json and the replay command.
    bugs: frozenset[Bug] = frozenset()

    @property
    def brokers(self) -> int:
        """The brokers the cluster runs: the queue workload's, else none."""
        return self.queue.brokers if WORKLOADS[self.workload].needs_brokers else 0

    @property
    def security_protocol(self) -> str:
        return "SSL" if self.tls else "PLAINTEXT"

    def check(self) -> None:
        """:class:`ValueError` naming the first bad field."""
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; known: {', '.join(WORKLOADS)}")
        odd = [b for b in self.bugs if not isinstance(b, Bug)]
        if odd:
            raise ValueError(f"bugs must be bugs.Bug members, got {odd!r}")
        if WORKLOADS[self.workload].needs_brokers:
            if not BACKENDS[self.backend].brokers:
                raise ValueError(f"the {self.backend} backend runs no brokers: use --backend local")
            self.queue.check()
        else:
            aimed = [f for f in self.faults if f in BROKER_KINDS]
            if aimed:
                raise ValueError(
                    f"{', '.join(aimed)} aim at a partition's replicas: they need brokers "
                    "(--workload queue)"
                )
        unknown = [f for f in self.faults if f not in FAULT_KINDS]
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
        for what in ("nodes", "concurrency", "keys"):
            if getattr(self, what) < 1:
                raise ValueError(f"{what} must be at least 1, got {getattr(self, what)}")
        if self.store not in REGISTER_STORES:
            raise ValueError(f"unknown store {self.store!r}; known: {', '.join(REGISTER_STORES)}")
        if self.pin_clients and (self.workload != "register" or self.store != "kv"):
            raise ValueError("pinned clients are the register workload's on --store kv")
        if self.store == "configs" and self.keys > len(CONFIG_REGISTER_KEYS):
            raise ValueError(
                f"the configs store has {len(CONFIG_REGISTER_KEYS)} registers; "
                f"{self.keys} keys asked (use --store kv for more)"
            )
        for what in (
            "time_limit_s",
            "rate",
            "fault_interval_s",
            "fault_period_s",
            "op_timeout_s",
            "client_timeout_s",
            "recovery_timeout_s",
        ):
            if not getattr(self, what) > 0:
                raise ValueError(f"{what} must be positive, got {getattr(self, what)}")
        if self.client_timeout_s > self.op_timeout_s:
            # A request that outlives the op's own wait never ends with the
            # client's verdict: the op times out first (the command names
            # the flags; this guards a configuration built in code).
            raise ValueError(
                f"client_timeout_s ({self.client_timeout_s:g} s) must not exceed "
                f"op_timeout_s ({self.op_timeout_s:g} s)"
            )
        if self.quiet_s < 0:
            raise ValueError(f"quiet_s must not be negative, got {self.quiet_s}")
        if COORDINATOR_KIND in self.faults and self.queue.group is None:
            raise ValueError(
                f"{COORDINATOR_KIND} cuts off a consumer group's coordinator: it needs --group"
            )
        if ROTATE_KIND in self.faults and not self.tls:
            raise ValueError(
                f"{ROTATE_KIND} needs TLS: a PLAINTEXT (insecure) run has no certificates"
            )
        if self.faults:
            # The schedule refuses kinds the cluster is too small for.
            everyone = list(range(1, self.nodes + self.brokers + 1))
            schedule(random.Random(0), everyone, self.faults, duration_s=1)


@dataclass(frozen=True, slots=True)
class Progress:
    """What a run is doing, for a display: ``event`` is set for a phase or a
    nemesis action (and ``None`` for the once-a-second tick)."""

    elapsed_s: float
    ok: int
    fail: int
    info: int
    faults: tuple[str, ...]
    event: str | None = None


@dataclass
class RunResult:
    """How a run ended.  ``completed``: it ran to the end without an error
    (``error`` says what went wrong otherwise); ``recovered``: after the
    final heal a leader was elected and every node answered; ``final_ok``:
    the workload's final check (``final_check``, if it has one) found no
    problem."""

    path: Path
    completed: bool = False
    recovered: bool = False
    error: str | None = None
    problems: list[Problem] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    final_ok: bool = True
    final_check: dict[str, Any] | None = None

    @property
    def well_formed(self) -> bool:
        return self.completed and not self.problems

    @property
    def ok(self) -> bool:
        """Completed, recovered, the history is well formed and the final
        check found no problem."""
        return self.completed and self.recovered and not self.problems and self.final_ok


ProgressFn = Callable[[Progress], None]


# -- the run -------------------------------------------------------------------------


ActionOutcome = Literal["ok", "fail", "info", "skipped"]
"""How a nemesis action went: as its history op completed, or skipped
(nothing to act on, nothing recorded)."""


class _Nemesis:
    """Carries out actions on the backend and records them; knows which
    faults are in force."""

    def __init__(
        self,
        backend: ClusterBackend,
        writer: HistoryWriter,
        log: Callable[[str], None],
    ) -> None:
        self.backend = backend
        self.writer = writer
        self.log = log
        self.down: dict[int, str] = {}  # node -> kill / pause
        self.partition: str | None = None  # network fault in force (a kind, or packet)
        self.killed_leader: int | None = None  # the node a kill-leader killed
        # The broker a kill- or pause-partition-leader hit.
        self.targeted: int | None = None
        # The partition and leader a strand cut off from its followers, and
        # what each strand saw before its kill (summary.json's strands).
        self.stranded: PartitionReplicas | None = None
        self.strands: list[dict[str, Any]] = []
        self.strand_wait_s = STRAND_WAIT_S
        # The partition whose leader a sever cut off from the other brokers,
        # when, and what each sever saw at its heal (summary.json's severs).
        self.severed: tuple[PartitionReplicas, float] | None = None
        self.severs: list[dict[str, Any]] = []
        # The partition and follower of an elect-catching-up-follower in
        # force, and what each saw (summary.json's catch_ups).
        self.catching: tuple[PartitionReplicas, int, dict[str, Any]] | None = None
        self.catch_ups: list[dict[str, Any]] = []
        self.catch_up_wait_s = CATCH_UP_WAIT_S
        # Sets (a value) or removes (None) broker configs of a broker's own,
        # in one request; the refusal's error, None if done.
        self.broker_configs: (
            Callable[[int, Mapping[str, str | None]], Awaitable[str | None]] | None
        ) = None
        # The cluster's replica.lag.time.max.ms (queue runs), which bounds
        # the chunked fetches' wait.
        self.replica_lag_ms: int | None = None
        # Finds partitions' leaders and followers (queue runs).
        self.replicas: Callable[[], Awaitable[list[PartitionReplicas]]] | None = None
        # The consumer group whose coordinator isolate-coordinator cuts off.
        self.group: str | None = None
        # Moves partitions' leadership through the controllers (queue runs).
        self.moves: LeaderMoves | None = None
        self.rng = random.Random(0)
        self.injected: Counter[str] = Counter()
        self.rotations = 0  # rotate-certs actions done (ok)

    def faults(self) -> tuple[str, ...]:
        out = [f"{how} {node}" for node, how in sorted(self.down.items())]
        if self.partition == PACKET_KIND:
            out.append(PACKET_KIND)
        elif self.partition is not None:
            out.append(f"partition {self.partition}")
        return tuple(out)

    async def act(self, action: Action) -> tuple[ActionOutcome, Action]:
        """Carry ``action`` out and record it; returns how it went and the
        action as done (a leader intent resolved)."""
        if action.target == "partition":
            return await self._move_leadership(action)
        if action.target in ("partition-leader", "follower"):
            return await self._act_on_partition(action)
        if action.target == "coordinator":
            return await self._isolate_coordinator(action)
        if action.target in ("strand", "stranded"):
            return await self._strand(action)
        if action.target == "catch-up":
            return await self._catch_up(action)
        if action.target == "catch-up-end":
            if self.catching is not None:
                _, follower, note = self.catching
                self.catching = None
                self.catch_ups.append(note)
                await self._undo_catch_up_configs(follower, note)
            return "skipped", action
        if action.target == "leader" and action.f == "start":
            # The end of a kill-leader: restart the node it killed.
            if self.killed_leader is None:
                self.log(f"skipped {action.kind} start: no leader was killed")
                return "skipped", action
            action = resolve(action, self.killed_leader, self.backend.nodes)
        elif action.target == "leader":
            leader = await current_leader(self.backend, timeout_s=5.0)
            if leader is None or (action.f == "kill" and leader in self.down):
                what = "kill" if action.f == "kill" else "isolate"
                self.log(f"skipped {action.kind}: no leader to {what}")
                return "skipped", action
            action = resolve(action, leader, self.backend.nodes)
        if action.f == "heal" and self.severed is not None:
            await self._note_sever_end()
        f, value = nemesis_op(action)
        self.writer.invoke(NEMESIS, f, value=value)
        try:
            await self._apply(action)
        except Exception as exc:  # recorded; the run goes on
            self.writer.info(NEMESIS, "indeterminate")
            self.log(f"{f} {value}: {type(exc).__name__}: {exc}")
            self._track(action, ok=False)
            return "info", action
        self.writer.ok(NEMESIS)
        self._track(action, ok=True)
        return "ok", action

    async def _move_leadership(self, action: Action) -> tuple[ActionOutcome, Action]:
        """A ``reassign`` (or its revert) or an ``elect-leader``: its
        partition drawn from the controllers' metadata now, the move made
        through their admin RPCs (:mod:`chaos.leader_moves`)."""
        kind = action.kind or action.f
        move = await self.moves.plan(kind, self.down) if self.moves is not None else None
        if move is None:
            self.log(f"skipped {kind}: no partition to move")
            return "skipped", action
        return await self._move(kind, action, move)

    async def _move(self, kind: str, action: Action, move: Move) -> tuple[ActionOutcome, Action]:
        """Carry ``move`` out through the controllers and record it."""
        done = replace(action, nodes=move.replicas, target=None)
        self.writer.invoke(NEMESIS, move.f, value=move.value())
        assert self.moves is not None
        try:
            error, now = await self.moves.apply(move)
        except Exception as exc:  # recorded; the run goes on
            self.writer.info(NEMESIS, "indeterminate")
            self.log(f"{kind} {move.value()}: {type(exc).__name__}: {exc}")
            self.injected[kind] += 1
            return "info", done
        if error is not None:
            self.writer.fail(NEMESIS, error)
            self.log(f"{kind} of {move.name} refused: {error}")
            return "fail", done
        value = {**move.value(), "now": now.to_json() if now is not None else None}
        self.writer.ok(NEMESIS, value=value)
        self.injected[kind] += 1
        self.log(
            f"{kind} {move.name}: {list(move.previous)} -> {list(move.replicas)}, "
            f"now {value['now']}"
        )
        return "ok", done

    async def _act_on_partition(self, action: Action) -> tuple[ActionOutcome, Action]:
        """A fault aimed at a partition's leader or follower: its node drawn
        from the controllers' metadata now (the end of a leader's fault: the
        node it hit)."""
        if action.f in ("start", "resume"):
            if self.targeted is None:
                self.log(f"skipped {action.kind} {action.f}: no partition leader was hit")
                return "skipped", action
            node, self.targeted = self.targeted, None
            return await self.act(replace(action, nodes=(node,), target=None))
        found = await self.replicas() if self.replicas is not None else []
        if action.target == "partition-leader":
            options = [
                (p.name, p.leader) for p in found if p.leader >= 0 and p.leader not in self.down
            ]
        else:
            options = [
                (p.name, f)
                for p in found
                for f in p.replicas
                if f != p.leader and f not in self.down
            ]
        if not options:
            self.log(f"skipped {action.kind}: no partition {action.target} found")
            return "skipped", action
        name, node = self.rng.choice(sorted(options))
        self.log(f"{action.kind}: {action.target} {node} of {name}")
        if action.target == "follower":
            done = replace(action, groups=isolate(self.backend.nodes, node), target=None)
        elif action.f == "partition":
            # A sever: cut off from the other brokers, not the controllers.
            groups = sever_groups(self.backend.nodes, list(self.backend.addresses()), node)
            done = replace(action, groups=groups, target=None)
            outcome, done = await self.act(done)
            if outcome != "skipped":
                chosen = next(p for p in found if p.name == name)
                self.severed = (chosen, time.monotonic())
            return outcome, done
        else:
            self.targeted = node
            done = replace(action, nodes=(node,), target=None)
        return await self.act(done)

    async def _isolate_coordinator(self, action: Action) -> tuple[ActionOutcome, Action]:
        """An ``isolate-coordinator``: the leader of the group's partition
        of the offsets topic (:func:`coordinator_of`), found in the
        controllers' metadata now, cut off from every other node."""
        found = await self.replicas() if self.replicas is not None else []
        at = coordinator_of(self.group, found) if self.group is not None else None
        if at is None or at.leader < 0 or at.leader in self.down:
            self.log(f"skipped {action.kind}: no coordinator of group {self.group} found up")
            return "skipped", action
        self.log(f"{action.kind}: coordinator {at.leader} of {self.group} ({at.name})")
        done = replace(action, groups=isolate(self.backend.nodes, at.leader), target=None)
        return await self.act(done)

    async def _catch_up_wait(
        self, name: str, ready: Callable[[PartitionReplicas], bool], every_s: float = 0.2
    ) -> tuple[PartitionReplicas | None, bool, float]:
        """Poll the controllers' metadata until partition ``name`` is
        ``ready``, at most ``catch_up_wait_s``: the partition last seen,
        whether it was ready, and the seconds waited."""
        started = time.monotonic()
        seen: PartitionReplicas | None = None
        while True:
            now = await self.replicas() if self.replicas is not None else []
            seen = next((p for p in now if p.name == name), seen)
            waited = time.monotonic() - started
            if seen is not None and ready(seen):
                return seen, True, waited
            if waited >= self.catch_up_wait_s:
                return seen, False, waited
            await asyncio.sleep(every_s)

    async def _catch_up(self, action: Action) -> tuple[ActionOutcome, Action]:
        """A step of an ``elect-catching-up-follower``
        (:data:`chaos.nemesis.CATCH_UP_KIND`).  The ``partition``: a queue
        partition whose leader is up with two up followers in its ISR,
        drawn from the controllers' metadata now, and one of them severed
        (:func:`chaos.nemesis.sever_groups`).  The ``kill``: of the
        partition's leader, once the follower is out of the ISR.  The
        ``heal``: once another broker leads.  The ``elect-leader``: of the
        follower, as soon as it is back in the ISR.  Each waits at most
        ``catch_up_wait_s`` and goes ahead (the election is skipped if the
        follower never came back); ``summary.json``'s ``catch_ups`` says
        what each saw."""
        if action.f == "partition":
            found = await self.replicas() if self.replicas is not None else []
            options = [
                (p, f)
                for p in sorted(found, key=lambda p: p.name)
                if p.leader >= 0
                and p.leader not in self.down
                and sum(1 for r in p.isr if r != p.leader and r not in self.down) >= 2
                for f in p.isr
                if f != p.leader and f not in self.down
            ]
            if not options:
                self.log(f"skipped {action.kind}: no partition with two followers in its ISR")
                return "skipped", action
            chosen, follower = self.rng.choice(options)
            groups = sever_groups(self.backend.nodes, list(self.backend.addresses()), follower)
            self.log(
                f"{action.kind}: follower {follower} of {chosen.name} (leader {chosen.leader}, "
                f"isr {list(chosen.isr)}) severed from the other brokers"
            )
            outcome, done = await self.act(replace(action, groups=groups, target=None))
            if outcome != "skipped":
                others = [r for r in chosen.isr if r not in (chosen.leader, follower, *self.down)]
                note: dict[str, Any] = {
                    "partition": chosen.name,
                    "leader": chosen.leader,
                    "follower": follower,
                    "isr_before": list(chosen.isr),
                    "follower_fetch_bytes": await self._set_fetch_bytes(
                        follower, CATCH_UP_FETCH_BYTES
                    ),
                    # Its one-batch fetches paced: the configs set, or the
                    # refusal.
                    "follower_paced": await self._set_chunked_fetches(
                        follower, True, CATCH_UP_PACE_MS
                    ),
                    # The others fetch in chunks until the election: by
                    # broker, the configs set or the refusal.
                    "chunked_fetches": {
                        str(other): await self._set_chunked_fetches(other, True) for other in others
                    },
                }
                self.catching = (chosen, follower, note)
            return outcome, done
        if self.catching is None:
            self.log(f"skipped {action.kind} {action.f}: no follower was severed")
            return "skipped", action
        chosen, follower, note = self.catching
        if action.f == "kill":
            seen, out, waited = await self._catch_up_wait(
                chosen.name, lambda p: follower not in p.isr
            )
            # The partition's leader now (an election may have moved it).
            leader = seen.leader if seen is not None and seen.leader >= 0 else chosen.leader
            note.update(
                {
                    "isr_at_kill": None if seen is None else list(seen.isr),
                    "follower_out": out,
                    "killed": leader,
                    "waited_kill_s": round(waited, 3),
                }
            )
            if leader == follower or leader in self.down:
                self.log(f"skipped {action.kind} kill: {chosen.name}'s leader is {leader}")
                note["killed"] = None  # the heal then waits for any leader
                return "skipped", action
            self.log(
                f"{action.kind}: {follower} "
                + ("out of" if out else "still in")
                + f" the isr of {chosen.name} after {waited:.1f} s; killing its leader {leader}"
            )
            self.targeted = leader
            return await self.act(replace(action, nodes=(leader,), target=None))
        if action.f == "heal":
            killed = note.get("killed")
            seen, moved, waited = await self._catch_up_wait(
                chosen.name, lambda p: p.leader >= 0 and p.leader != killed
            )
            note.update(
                {
                    "leader_at_heal": None if seen is None else seen.leader,
                    "isr_at_heal": None if seen is None else list(seen.isr),
                    "waited_heal_s": round(waited, 3),
                }
            )
            self.log(
                f"{action.kind}: {chosen.name} led by "
                f"{None if seen is None else seen.leader} after {waited:.1f} s; healing"
            )
            return await self.act(replace(action, kind=None, target=None))
        # The election: at once when the follower is back in the ISR; then
        # the follower fetches as the cluster says again.
        self.catching = None
        self.catch_ups.append(note)
        seen, back, waited = await self._catch_up_wait(
            chosen.name, lambda p: follower in p.isr, every_s=CATCH_UP_POLL_S
        )
        note.update(
            {
                "follower_back": back,
                "isr_at_election": None if seen is None else list(seen.isr),
                "waited_election_s": round(waited, 3),
            }
        )
        try:
            return await self._elect_caught_up(action, seen, back, chosen, follower, note)
        finally:
            await self._undo_catch_up_configs(follower, note)

    async def _undo_catch_up_configs(self, follower: int, note: dict[str, Any]) -> None:
        """Remove what the catch-up's sever set (and only what was set):
        the follower's own fetch size and pace, the others' chunked fetches;
        ``note`` says whether each removal was done."""
        if note["follower_fetch_bytes"] == CATCH_UP_FETCH_BYTES:
            undone = await self._set_fetch_bytes(follower, None)
            note["follower_fetch_bytes_removed"] = undone is None
        if isinstance(note.get("follower_paced"), dict):
            paced = await self._set_chunked_fetches(follower, False)
            note["follower_paced_removed"] = paced is None
        removed: dict[str, bool] = {}
        for other, done in note.get("chunked_fetches", {}).items():
            if isinstance(done, dict):
                removed[other] = await self._set_chunked_fetches(int(other), False) is None
        if removed:
            note["chunked_fetches_removed"] = removed

    def chunk_wait_ms(self) -> int:
        """The chunked fetches' ``replica.fetch.wait.max.ms``:
        :data:`CATCH_UP_CHUNK_WAIT_MS`, or two thirds of a shorter lag time
        (the controllers refuse a wait above it)."""
        if self.replica_lag_ms is None:
            return CATCH_UP_CHUNK_WAIT_MS
        return max(1, min(CATCH_UP_CHUNK_WAIT_MS, self.replica_lag_ms * 2 // 3))

    async def _set_chunked_fetches(
        self, broker: int, on: bool, wait_ms: int | None = None
    ) -> dict[str, int] | str | None:
        """Set (``on``) or remove ``broker``'s own ``replica.fetch.min.bytes``
        and ``replica.fetch.wait.max.ms`` (:data:`CATCH_UP_CHUNK_MIN_BYTES`,
        and ``wait_ms``, by default :meth:`chunk_wait_ms`): the values set,
        None when removed, or the refusal."""
        wait = self.chunk_wait_ms() if wait_ms is None else min(wait_ms, self.chunk_wait_ms())
        values = dict(zip(CHUNK_CONFIGS, (CATCH_UP_CHUNK_MIN_BYTES, wait), strict=True))
        error = await self._set_broker_configs(
            broker, {name: str(value) if on else None for name, value in values.items()}
        )
        if error is not None:
            return error
        return values if on else None

    async def _set_broker_configs(
        self, broker: int, values: Mapping[str, str | None]
    ) -> str | None:
        """Set (or, where None, remove) configs of ``broker``'s own in one
        request; the refusal, logged, or None (also with no way to set
        them: the fault goes on without)."""
        if self.broker_configs is None:
            return None
        try:
            error = await self.broker_configs(broker, values)
        except Exception as exc:  # the fault goes on without it
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            shown = ", ".join(f"{k}={v}" for k, v in values.items())
            self.log(f"configs of broker {broker} not set ({shown}): {error}")
        return error

    async def _set_fetch_bytes(self, broker: int, value: int | None) -> int | str | None:
        """Set (or, with None, remove) ``broker``'s own
        ``replica.fetch.max.bytes``: the value set, or the refusal."""
        if self.broker_configs is None:
            return None
        error = await self._set_broker_configs(
            broker, {"replica.fetch.max.bytes": None if value is None else str(value)}
        )
        return value if error is None else error

    async def _elect_caught_up(
        self,
        action: Action,
        seen: PartitionReplicas | None,
        back: bool,
        chosen: PartitionReplicas,
        follower: int,
        note: dict[str, Any],
    ) -> tuple[ActionOutcome, Action]:
        """The election of ``follower`` (put first, then a preferred
        election), if the controllers had it back in the ISR (``seen``)."""
        if seen is None or not back or seen.leader == follower:
            self.log(f"skipped {action.kind} election: {follower} not back in {chosen.name}'s isr")
            return "skipped", action
        topic, _, partition = seen.name.rpartition("-")
        move = Move(
            ELECT,
            action.kind or ELECT,
            topic,
            int(partition),
            (follower, *(r for r in seen.replicas if r != follower)),
            seen.replicas,
            seen.leader,
        )
        if self.moves is None:
            self.log(f"skipped {action.kind} election: no leadership moves in this run")
            return "skipped", action
        outcome, done = await self._move(ELECT, action, move)
        note["elected"] = outcome == "ok"
        return outcome, done

    async def _note_sever_end(self) -> None:
        """What the controllers' metadata shows of the severed partition at
        the heal that ends its sever (``summary.json``'s ``severs``): its
        leader then (the severed one, unless an election moved it), its ISR
        (shrunk to the leader if it led throughout: no follower could
        fetch), and how long the sever lasted."""
        assert self.severed is not None
        (chosen, since), self.severed = self.severed, None
        now = await self.replicas() if self.replicas is not None else []
        at_heal = next((p for p in now if p.name == chosen.name), None)
        self.severs.append(
            {
                "partition": chosen.name,
                "severed": chosen.leader,
                "isr_before": list(chosen.isr),
                "leader_at_heal": None if at_heal is None else at_heal.leader,
                "isr_at_heal": None if at_heal is None else list(at_heal.isr),
                "severed_s": round(time.monotonic() - since, 3),
            }
        )

    async def _strand(self, action: Action) -> tuple[ActionOutcome, Action]:
        """A strand's partition or kill (:data:`chaos.nemesis.STRAND_KINDS`).
        The partition: a queue partition whose leader is up and whose ISR
        holds a follower, drawn from the controllers' metadata now, its
        followers cut off (:func:`chaos.nemesis.strand_groups`).  The kill:
        of that leader, once the controllers' metadata shows the ISR shrunk
        to it alone, or after ``strand_wait_s`` (the kill goes ahead,
        and ``summary.json``'s ``strands`` says the ISR had not shrunk)."""
        if action.f == "partition":
            found = await self.replicas() if self.replicas is not None else []
            options = [
                p
                for p in found
                if p.leader >= 0
                and p.leader not in self.down
                and any(r != p.leader for r in p.isr)
                and not any(r in self.down for r in p.replicas)
            ]
            if not options:
                self.log(f"skipped {action.kind}: no partition with a follower in its ISR")
                return "skipped", action
            chosen = self.rng.choice(sorted(options, key=lambda p: p.name))
            followers = [r for r in chosen.replicas if r != chosen.leader]
            if action.kind == STRAND_ISOLATED_KIND:
                # Cut off from the controllers too: its shrink stays pending.
                groups = isolate(self.backend.nodes, chosen.leader)
            else:
                groups = strand_groups(
                    self.backend.nodes, list(self.backend.addresses()), chosen.leader, followers
                )
            self.log(
                f"{action.kind}: leader {chosen.leader} of {chosen.name} (isr "
                f"{list(chosen.isr)}) cut off from its followers {followers}"
                + (" and the controllers" if action.kind == STRAND_ISOLATED_KIND else "")
            )
            outcome, done = await self.act(replace(action, groups=groups, target=None))
            if outcome != "skipped":
                self.stranded = chosen
            return outcome, done
        if self.stranded is None:
            self.log(f"skipped {action.kind} kill: no partition leader was stranded")
            return "skipped", action
        chosen, self.stranded = self.stranded, None
        started = time.monotonic()
        isr: tuple[int, ...] | None = None
        leader = chosen.leader
        # An isolated leader's shrink never commits: its kill waits instead
        # for the controllers to have fenced it and elected another leader.
        isolated = action.kind == STRAND_ISOLATED_KIND
        while True:
            now = await self.replicas() if self.replicas is not None else []
            isr = next((p.isr for p in now if p.name == chosen.name), isr)
            leader = next((p.leader for p in now if p.name == chosen.name), leader)
            waited = time.monotonic() - started
            ready = leader != chosen.leader if isolated else isr == (chosen.leader,)
            if ready or waited >= self.strand_wait_s:
                break
            await asyncio.sleep(0.2)
        shrunk = isr == (chosen.leader,)
        self.strands.append(
            {
                "partition": chosen.name,
                "leader": chosen.leader,
                "isr_before": list(chosen.isr),
                "isr_at_kill": None if isr is None else list(isr),
                "shrunk": shrunk,
                "leader_at_kill": leader,
                "waited_s": round(waited, 3),
            }
        )
        self.log(
            f"{action.kind}: isr of {chosen.name} "
            + (f"shrunk to {list(isr or ())}" if shrunk else f"still {list(isr or ())}")
            + f", leader {leader}, after {waited:.1f} s; killing {chosen.leader}"
        )
        self.targeted = chosen.leader
        return await self.act(replace(action, nodes=(chosen.leader,), target=None))

    async def _apply(self, action: Action) -> None:
        b = self.backend
        if action.f == "kill":
            for n in action.nodes:
                await b.kill(n)
        elif action.f == "start":
            # Together: a majority restarted one by one would wait for each.
            outcomes = await asyncio.gather(
                *(b.restart(n) for n in action.nodes), return_exceptions=True
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
        elif action.f == "pause":
            for n in action.nodes:
                await b.pause(n)
        elif action.f == "resume":
            for n in action.nodes:
                await b.resume(n)
        elif action.f == "partition":
            await b.partition(action.groups)
        elif action.f == "packet":
            await b.packet(action.drop, action.delay_ms, action.jitter_ms)
        elif action.f == "heal":
            await b.heal()
        elif action.f == ROTATE_KIND:
            await b.rotate_certs(action.nodes)
        else:
            raise ValueError(f"unknown nemesis action {action.f!r}")

    def _track(self, action: Action, *, ok: bool) -> None:
        """A fault started ``ok`` or ``info`` may be in force; only an ``ok``
        end ends it."""
        if action.f in ("kill", "pause"):
            self.injected[action.kind or action.f] += 1
            for n in action.nodes:
                self.down[n] = action.f
            if action.kind == "kill-leader":
                self.killed_leader = action.nodes[0]
        elif action.f == "partition":
            self.injected[f"partition {action.kind}" if action.kind else "partition"] += 1
            self.partition = action.kind or "partition"
        elif action.f == "packet":
            self.injected[PACKET_KIND] += 1
            self.partition = PACKET_KIND
        elif action.f == ROTATE_KIND:
            # Instant: nothing stays in force.
            self.injected[ROTATE_KIND] += 1
        elif ok and action.f in ("start", "resume"):
            for n in action.nodes:
                self.down.pop(n, None)
            if action.kind == "kill-leader" or self.killed_leader in action.nodes:
                self.killed_leader = None
        elif ok and action.f == "heal":
            self.partition = None

    def ends(self) -> list[Action]:
        """The actions that end every fault in force, then a heal-all."""
        out = [
            Action(0.0, "start" if how == "kill" else "resume", nodes=(node,))
            for node, how in sorted(self.down.items())
        ]
        # A reassignment in force goes back once every node is up again.
        revert = (
            [Action(0.0, REASSIGN_KIND, kind="revert", target="partition")]
            if self.moves is not None and self.moves.in_force is not None
            else []
        )
        # A catch-up cut short by the run's end: the follower's own fetch
        # size goes (nothing of it is in the history).
        catch_up = (
            [Action(0.0, "heal", kind=CATCH_UP_KIND, target="catch-up-end")]
            if self.catching is not None
            else []
        )
        return [*out, Action(0.0, "heal"), *catch_up, *revert]


@dataclass(frozen=True, slots=True)
class PartitionReplicas:
    """A partition as the controllers have it: ``name`` topic-partition."""

    name: str
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def fault_topics(queue: QueueOptions) -> list[str]:
    """The topics whose partitions the faults aimed at partitions draw from
    (a partition's leader or follower, strands, severs, leadership moves):
    the queue's, and in a run whose consumers share a group the offsets
    topic's too, so that they move the group's coordinator (a lost or
    rolled-back commit needs its leadership to move: KAFKA-20634, Redpanda
    CORE-16998, brokers.md §4)."""
    topics = [name for name, _ in queue.keymap.topics]
    if queue.group is not None:
        topics.append(OFFSETS_TOPIC)
    return topics


def coordinator_of(group: str, found: Sequence[PartitionReplicas]) -> PartitionReplicas | None:
    """The offsets topic's partition that holds ``group`` among ``found``
    (:func:`broker.group.placement.partition_for` over the partitions of
    the topic found), ``None`` if the topic is not among them (not made
    yet: the first FindCoordinator makes it)."""
    prefix = f"{OFFSETS_TOPIC}-"
    offsets = {p.name: p for p in found if p.name.startswith(prefix)}
    if not offsets:
        return None
    return offsets.get(f"{prefix}{partition_for(group, len(offsets))}")


async def partition_replicas(
    backend: ClusterBackend, topics: Sequence[str], timeout_s: float = 5.0
) -> list[PartitionReplicas]:
    """The leader, replicas and ISR of every partition of ``topics``, from
    the active controller's metadata (empty if none answered)."""
    client = MetadataClient(
        list(backend.addresses().values()),
        timeout_s=timeout_s,
        credentials=backend.client_credentials(),
    )
    try:
        answer = await client.describe_topics(list(topics))
    except Exception:
        return []
    finally:
        await client.close()
    return [
        PartitionReplicas(f"{t.name}-{p.partition}", p.leader, tuple(p.replicas), tuple(p.isr))
        for t in answer.topics
        for p in t.partitions
    ]


async def broker_configs(
    backend: ClusterBackend,
    broker: int,
    values: Mapping[str, str | None],
    timeout_s: float = 5.0,
) -> str | None:
    """Set configs of ``broker``'s own (``replica.fetch.max.bytes``...) to
    ``values``, one request, all or nothing (None: remove it, so that the
    cluster's applies again) through the active controller; the refusal's
    error, None if done."""
    client = MetadataClient(
        list(backend.addresses().values()),
        timeout_s=timeout_s,
        credentials=backend.client_credentials(),
    )
    try:
        ops = [ConfigOp(name, value) for name, value in values.items()]
        answer = await client.alter_configs({ConfigResource.broker(broker): ops})
    finally:
        await client.close()
    bad = [r for r in answer.results if r.error != 0]
    if not bad:
        return None
    # The message says which config was refused and why (a wait above the
    # lag time...).
    name = error_code(bad[0].error).name
    return f"{name}: {bad[0].message}" if bad[0].message else name


async def current_leader(backend: ClusterBackend, timeout_s: float = 5.0) -> int | None:
    """The node that says it leads in the highest epoch, asking every node
    until one does or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    addresses = backend.addresses()
    credentials = backend.client_credentials()
    while True:
        answers = await asyncio.gather(*(describe(a, 0.5, credentials) for a in addresses.values()))
        leaders = [
            (r.epoch, n)
            for n, r in zip(addresses, answers, strict=True)
            if r is not None and r.role == "leader"
        ]
        if leaders:
            return max(leaders)[1]
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(0.2)


async def wait_recovered(backend: ClusterBackend, timeout_s: float) -> bool:
    """Whether, within ``timeout_s``, every node answers and one leads."""
    deadline = time.monotonic() + timeout_s
    addresses = backend.addresses()
    credentials = backend.client_credentials()
    while True:
        answers = await asyncio.gather(*(describe(a, 0.5, credentials) for a in addresses.values()))
        if all(r is not None for r in answers) and any(
            r is not None and r.role == "leader" for r in answers
        ):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.2)


def _counts(ops: Sequence[Op]) -> dict[str, dict[str, int]]:
    """Client completions (and invokes) by ``f`` and type."""
    out: dict[str, Counter[str]] = {}
    for op in ops:
        if op.process != NEMESIS:
            out.setdefault(op.f, Counter())[op.type] += 1
    return {f: dict(sorted(c.items())) for f, c in sorted(out.items())}


def _nemesis_counts(ops: Sequence[Op]) -> dict[str, dict[str, int]]:
    out: dict[str, Counter[str]] = {}
    for op in ops:
        if op.process == NEMESIS and op.type != "invoke":
            out.setdefault(op.f, Counter())[op.type] += 1
    return {f: dict(sorted(c.items())) for f, c in sorted(out.items())}


async def run_chaos(config: RunConfig, progress: ProgressFn | None = None) -> RunResult:
    """Run ``config`` and return how it went (it raises only for a bad
    config or a run folder it cannot make; every later failure is in the
    result and the run folder)."""
    config.check()
    # The chaos client's own bugs are on in this process for the run only.
    with bugs.injected(*(config.bugs & CLIENT_BUGS)):
        return await _run_chaos(config, progress)


async def _run_chaos(config: RunConfig, progress: ProgressFn | None) -> RunResult:
    seed = config.seed if config.seed is not None else random.randrange(2**32)
    spec = BACKENDS[config.backend]
    nodes = list(range(1, config.nodes + 1))
    run = create_run_dir(config.runs_dir, config.name)
    result = RunResult(run.path)
    harness: list[str] = []
    t0 = time.monotonic()
    nemesis: _Nemesis | None = None
    workload: Workload | None = None

    def stats() -> tuple[int, int, int]:
        if workload is None:
            return 0, 0, 0
        c = workload.stats.completions
        return c["ok"], c["fail"], c["info"]

    def emit(event: str | None) -> None:
        elapsed = time.monotonic() - t0
        if event is not None:
            harness.append(f"{elapsed:8.3f} {event}")
        if progress is not None:
            ok, fail, info = stats()
            faults = nemesis.faults() if nemesis is not None else ()
            progress(Progress(elapsed, ok, fail, info, faults, event))

    start_unix_ns = time.time_ns()
    writer = HistoryWriter(run.history)
    config_json: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "name": config.name,
        "backend": config.backend,
        "model": config.workload,
        "workload": config.workload,
        "nodes": nodes,
        "faults": list(config.faults),
        "start_unix_ns": start_unix_ns,
        "seed": seed,
        **{
            k: v
            for k, v in asdict(config).items()
            if k not in ("name", "faults", "nodes", "runs_dir", "queue", "bugs")
        },
        "bugs": bug_ids(config.bugs),
        "node_count": config.nodes,
        "keys": register_keys(config) if config.workload == "register" else [],
        "store": config.store if config.workload == "register" else None,
        "brokers": list(range(config.nodes + 1, config.nodes + config.brokers + 1)),
        "security_protocol": config.security_protocol,
    }
    if config.brokers:
        config_json["queue"] = config.queue.to_json()
    config_json["replay"] = _replay(config, seed)
    write_json(run.config, config_json)

    rng = random.Random(seed)
    nemesis_rng = random.Random(rng.randrange(2**63))
    workload_rng = random.Random(rng.randrange(2**63))
    workdir = Path(tempfile.mkdtemp(prefix="kq-chaos-"))
    backend: ClusterBackend | None = None
    started = False
    try:
        if config.bugs:
            emit(
                "WARNING: deliberate bugs on, this history is not a real run's: "
                + ", ".join(f"{b.id} {b.title}" for b in sorted(config.bugs, key=_bug_order))
            )
        brokers = f" and {config.brokers} brokers" if config.brokers else ""
        emit(f"starting {config.nodes} {config.backend} nodes{brokers}")
        network = any(f in NETWORK_KINDS for f in config.faults)
        # The switch is set explicitly whenever bugs are on or this process
        # has it in its environment (which the nodes would inherit).
        process_env = {
            **(
                bug_environment(config.bugs)
                if config.bugs or bugs.BUGS_VARIABLE in os.environ
                else {}
            ),
            **storage_environment(config, os.environ),
        }
        if process_env.get(LOSE_UNSYNCED_VARIABLE) == "1":
            emit("the nodes run in the power-loss test mode: a kill drops their unsynced writes")
        elif process_env.get(LOSE_UNSYNCED_VARIABLE) == TORN:
            emit(
                "the nodes run in the power-loss test mode with torn writes: a kill drops their "
                "unsynced writes, and a broker keeps a torn part of its segment tails"
            )
        env: dict[str, Any] = {"env": process_env} if process_env else {}
        backend = (
            spec.make(config.nodes, workdir, network, config.tls, brokers=config.brokers, **env)
            if config.brokers
            else spec.make(config.nodes, workdir, network, config.tls, **env)
        )
        await backend.start()
        started = True
        leader = await current_leader(backend, 1.0)
        emit(
            f"cluster up at {', '.join(backend.addresses().values())} (leader {leader}, "
            f"{backend.security_protocol})"
        )
        if not config.tls:
            emit("WARNING: insecure run: the nodes listen PLAINTEXT, without authentication")
        nemesis = _Nemesis(backend, writer, lambda line: emit(line))
        # Its own stream: the schedule of a seed stays what it was.
        nemesis.rng = random.Random(seed ^ 0x5EED)
        if config.brokers:
            topics = fault_topics(config.queue)
            live = backend
            nemesis.replicas = lambda: partition_replicas(live, topics)
            nemesis.group = config.queue.group
            nemesis.moves = LeaderMoves(
                lambda: list(live.addresses().values()),
                live.client_credentials(),
                topics,
                sorted(set(live.nodes) - set(live.addresses())),
                random.Random(seed ^ 0x30FE),
            )
            nemesis.broker_configs = partial(broker_configs, live)
            nemesis.replica_lag_ms = config.queue.replica_lag_ms
        addresses = dict(backend.addresses())
        broker_addresses = getattr(backend, "broker_addresses", None)
        workload = WORKLOADS[config.workload].make(
            config,
            writer,
            addresses,
            workload_rng,
            backend.client_credentials,
            dict(broker_addresses()) if config.brokers and broker_addresses else {},
        )
        prepare = getattr(workload, "prepare", None)
        if prepare is not None:
            emit("preparing the workload")
            await prepare()
        actions = (
            schedule(
                nemesis_rng,
                # Brokers are nodes a fault may pick too.
                list(backend.nodes),
                config.faults,
                duration_s=config.time_limit_s,
                interval_s=config.fault_interval_s,
                fault_period_s=config.fault_period_s,
                quiet_s=config.quiet_s,
            )
            if config.faults
            else []
        )
        stop = asyncio.Event()
        main_start = time.monotonic()

        async def drive() -> None:
            assert nemesis is not None
            for action in actions:
                wait = main_start + action.time_s - time.monotonic()
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
                if stop.is_set():
                    return
                outcome, done = await nemesis.act(action)
                emit(f"nemesis {_describe_action(done)}: {outcome}")

        async def tick() -> None:
            while True:
                await asyncio.sleep(1.0)
                emit(None)

        emit(
            f"running {config.workload} for {config.time_limit_s:g} s, "
            f"faults: {', '.join(config.faults) or 'none'}"
        )
        ticker = asyncio.create_task(tick())
        driver = asyncio.create_task(drive())
        try:
            await workload.run(config.time_limit_s)
        finally:
            stop.set()
            try:
                await driver
            finally:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)

        emit("healing every fault")
        for action in nemesis.ends() if config.faults else []:
            outcome, done = await nemesis.act(action)
            emit(f"nemesis {_describe_action(done)}: {outcome}")
        result.recovered = await wait_recovered(backend, config.recovery_timeout_s)
        wait_brokers = getattr(backend, "wait_brokers", None)
        if config.brokers and wait_brokers is not None:
            brokers_up = await wait_brokers(config.recovery_timeout_s)
            emit("every broker unfenced" if brokers_up else "some broker is not unfenced")
            result.recovered = result.recovered and brokers_up
        emit("recovered" if result.recovered else "did not recover")
        emit("final reads")
        verdict = await workload.final()
        result.final_ok, result.final_check = verdict.ok, verdict.check
        emit(verdict.event)
        result.completed = True
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            result.error = "interrupted (the run was cancelled, e.g. by Ctrl-C)"
        else:
            result.error = f"{type(exc).__name__}: {exc}"
        harness.append(traceback.format_exc())
        if not isinstance(exc, Exception):
            raise
    finally:
        with contextlib.suppress(Exception):
            if workload is not None:
                await workload.close()
        writer.close()
        if backend is not None:
            try:
                if started:
                    emit("collecting node logs and exports")
                    await backend.collect(run.path, start_unix_ns)
            except Exception as exc:  # the run folder says so
                result.completed = False
                result.error = result.error or f"collect: {type(exc).__name__}: {exc}"
                harness.append(traceback.format_exc())
            finally:
                await backend.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        emit("stopped")
        _finish(run, config, result, nemesis, harness, t0)
    return result


def _finish(
    run: RunDir,
    config: RunConfig,
    result: RunResult,
    nemesis: _Nemesis | None,
    harness: list[str],
    t0: float,
) -> None:
    """Write the harness log and summary.json; fill in the result."""
    run.logs.mkdir(exist_ok=True)
    (run.logs / "harness.log").write_text("".join(line + "\n" for line in harness))
    try:
        ops = read_history(run.history)
        problems = check_well_formed(
            ops, model=config.workload, require_nemesis=bool(config.faults)
        )
    except (OSError, ValueError) as exc:
        ops = []
        problems = [Problem("run-history", str(exc))]
    result.problems = problems
    summary = summarize(ops, problems)
    summary.update(
        {
            "backend": config.backend,
            "workload": config.workload,
            "security_protocol": config.security_protocol,
            "bugs": bug_ids(config.bugs),
            "completed": result.completed,
            "recovered": result.recovered,
            "error": result.error,
            "duration_s": round(time.monotonic() - t0, 3),
            "counts": _counts(ops),
            "faults_injected": dict(sorted(nemesis.injected.items())) if nemesis else {},
            "strands": nemesis.strands if nemesis else [],
            "severs": nemesis.severs if nemesis else [],
            "catch_ups": nemesis.catch_ups if nemesis else [],
            "nemesis_ops": _nemesis_counts(ops),
            "final_check": result.final_check,
        }
    )
    if result.final_check is not None and "final_polls" in result.final_check:
        summary["final_polls"] = result.final_check["final_polls"]
    result.summary = summary
    write_json(run.summary, summary)


def _describe_action(action: Action) -> str:
    if action.f == "partition":
        groups = " | ".join(",".join(map(str, g)) for g in action.groups)
        return f"partition {action.kind or ''} [{groups}]".replace("  ", " ")
    if action.f == "packet":
        return f"packet drop {action.drop:g}, delay {action.delay_ms:g}±{action.jitter_ms:g} ms"
    if action.nodes:
        kind = f" ({action.kind})" if action.kind else ""
        return f"{action.f} {','.join(map(str, action.nodes))}{kind}"
    return action.f


def _replay(config: RunConfig, seed: int) -> str:
    """The command that runs the same configuration and schedule again
    (with its bugs, the switch's variables before it)."""
    switch = bug_environment(config.bugs)
    prefix = " ".join(f"{k}={v}" for k, v in switch.items()) + " " if config.bugs else ""
    return prefix + (
        f"kq chaos run --backend {config.backend} --workload {config.workload} "
        f"--nemesis {','.join(config.faults) or 'none'} --nodes {config.nodes} "
        f"--time-limit {config.time_limit_s:g} --rate {config.rate:g} "
        f"--concurrency {config.concurrency} --keys {config.keys} --store {config.store} "
        f"--seed {seed}"
        + (" --pin-clients" if config.pin_clients else "")
        + ("" if config.tls else " --insecure")
        + _timing_flags(config)
        + _queue_flags(config)
    )


def _timing_flags(config: RunConfig) -> str:
    """The fault schedule's and the clients' times where they differ from
    the defaults (every catalogue recipe sets its schedule, and some, such
    as B18's and Q4's, shorten the timeouts)."""
    default = RunConfig()
    out = ""
    for flag, value, usual in (
        ("--fault-interval", config.fault_interval_s, default.fault_interval_s),
        ("--fault-period", config.fault_period_s, default.fault_period_s),
        ("--quiet-period", config.quiet_s, default.quiet_s),
        ("--op-timeout", config.op_timeout_s, default.op_timeout_s),
        ("--client-timeout", config.client_timeout_s, default.client_timeout_s),
    ):
        if value != usual:
            # %g unless it would round the value: the replay must give it back.
            text = f"{value:g}" if float(f"{value:g}") == value else repr(value)
            out += f" {flag} {text}"
    return out


def _queue_flags(config: RunConfig) -> str:
    if not config.brokers:
        return ""
    q = config.queue
    return (
        f" --brokers {q.brokers} --topics {q.topics} --partitions {q.partitions} "
        f"--replication-factor {q.replication_factor} --min-isr {q.min_isr} --acks {q.acks} "
        f"--max-send {q.max_send} --final-time {q.final_time_s:g} "
        f"--replica-lag-ms {q.replica_lag_ms}" + q.topic_flags()
    )


def _bug_order(bug: Bug) -> tuple[str, int]:
    return bug.id[0], int(bug.id[1:])


def summary_of(path: Path) -> Mapping[str, Any] | None:
    """A run folder's summary.json, if it has a readable one."""
    try:
        data = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
