"""Fault schedules of the chaos harness (pure: no clock, processes or network).

:func:`schedule` turns an injected :class:`random.Random`, the node ids and
the fault kinds enabled into a list of timed :class:`Action` s: faults
started and ended in fault periods, separated by quiet periods with no fault
in force, and a final heal-all.  Every fault started is ended; at most
``max_concurrent`` faults are in force at once, at most one of them a
network fault (a partition or a packet fault); a node is killed or paused
by one fault at a time; and with ``keep_majority`` some up node can reach
a majority of up nodes at every instant.  A backend carries the actions out; :func:`nemesis_op` and
:func:`action_ops` give the history ops of an action (``docs/history-format.md``,
the nemesis).

Fault kinds (:data:`FAULT_KINDS`):

- ``kill`` / ``pause``: one node, ended by ``start`` / ``resume`` of it;
- ``kill-leader``: the leader killed, an *intent* (``target="leader"``)
  resolved like ``isolate-leader``; its ``start`` carries the same intent
  and restarts the node that the kill resolved to;
- ``kill-majority``: a majority of the nodes killed at once (one ``kill``
  of them all, ended by one ``start`` of them all).  Naming it is the
  request to lose the majority: it is exempt from ``keep_majority``, but
  it starts only when no other fault is in force and no other fault starts
  while it is;
- ``isolate-one``: one node cut off from the rest;
- ``isolate-leader``: the leader cut off, an *intent* (``target="leader"``)
  that the backend resolves with :func:`resolve` when it acts;
- ``halves``: two halves (the larger one holds a majority);
- ``majorities-ring``: each node talks only to its neighbours on a ring, so
  it sees a majority but no two nodes see the same one (5 nodes or more);
- ``bridge``: two halves that share one node;
- ``packet``: slow, lossy links between every two nodes: each packet
  delayed by ``delay_ms`` ± ``jitter_ms`` and dropped with probability
  ``drop`` (:func:`packet_fault` draws them), ended by ``heal``.  It is a
  network fault like a partition (at most one network fault is in force),
  but it cuts no node off.  Its history value is the documented
  ``{"drop", "duplicate", "max_delay_ms"}``; ``duplicate`` is always 0 (the
  backends do not duplicate packets).

- ``power-loss``: one node (a controller or a broker) loses power: a
  ``kill`` with ``kind="power-loss"``, ended by a ``start`` of it with the
  same kind.  The runner starts every process of such a run in the
  storage's power-loss test mode (``server.storage_mode``), in which a
  kill drops every write not synced, as a power loss does;
- ``torn-power-loss`` / ``torn-power-loss-partition-leader``: the same
  power losses (of a random node, of a queue partition's leader) with torn
  writes: the run's processes start in the mode's torn variant, in which a
  broker's segment files keep a random prefix of their unsynced tail with
  whole sectors zeroed, as a real disk may after a power loss; a correct
  recovery cuts the log at the first damaged batch;

- ``kill-partition-leader`` / ``pause-partition-leader`` /
  ``power-loss-partition-leader``: the broker that leads a partition of
  the queue workload (drawn when the fault starts, from the controllers'
  metadata), killed, paused or power-cut: an *intent*
  (``target="partition-leader"``) the runner resolves when it acts; its
  ``start`` / ``resume`` carries the same intent and ends that node's fault;
- ``isolate-follower``: a follower of a partition (drawn likewise) cut off
  from every other node (``target="follower"``), so that it falls behind
  and leaves the ISR, and rejoins it after the ``heal``;
- ``sever-partition-leader``: the leader of a queue partition (drawn
  likewise) cut off from the other brokers only: a ``partition``
  (``target="partition-leader"``) of :func:`sever_groups`, in which the
  controllers still reach every node and the clients still reach it.  It
  keeps its controller session, so it is not fenced: it goes on leading
  and appending alone in its epoch until its ISR shrinks (no follower can
  fetch), and it learns every election the controllers make meanwhile (a
  preferred election may move the partition to a follower and back to
  it), which a leader cut off from every node (``isolate-one``) learns
  only after the heal, if it was not fenced first.  A network fault,
  ended by ``heal``;
- ``isolate-coordinator``: in a run whose consumers share a group, the
  group's coordinator (the broker that leads the group's partition of the
  offsets topic, found in the controllers' metadata when the fault
  starts) cut off from every other node, the controllers too
  (``target="coordinator"``); the clients still reach it.  It goes on
  answering the group's members while the controllers fence it and elect
  the partition's follower, which loads the group from its own log: what
  the cut-off coordinator acknowledged meanwhile, which no follower
  fetched, must not have been acknowledged (KAFKA-20634, brokers.md §4).
  A network fault, ended by ``heal``;

- ``strand-partition-leader`` / ``strand-power-loss-partition-leader``:
  KIP-966's worked example (ISR (0,1,2), min ISR 2: broker 0 partitioned
  out, then broker 1; broker 2 leads alone, then shuts down uncleanly; the
  partition heals and 2 comes back), on one queue partition drawn when the
  fault starts.  Four actions: a ``partition`` (``target="strand"``) that
  cuts every follower off from the leader and from each other while the
  controllers still reach every node (:func:`strand_groups`), so that the
  leader shrinks the ISR to itself through the controllers (a lagging
  follower's AlterPartition, not a fencing); :data:`STRAND_SHRINK_S`
  later a ``kill`` of that leader (``target="stranded"``; the power-loss
  variant drops its unsynced writes), which the runner carries out once
  the controllers' metadata shows the ISR shrunk to the leader alone (or a
  bound passed); then, :data:`STRAND_HOLD_S` later (past the brokers'
  session, so that the controllers fence the leader and elect, or do not,
  another replica while it is down), a ``heal`` and the leader's ``start``
  (``target="partition-leader"``).  Like ``kill-majority`` it is exclusive:
  it starts only when no fault is in force and nothing starts while it
  is; it is exempt from ``keep_majority`` (the controllers stay connected
  to every node, so the quorum keeps its majority);
- ``strand-isolated-power-loss-partition-leader``: the same four actions,
  but the ``partition`` cuts the leader off from every node, the
  controllers too (``isolate``; the clients still reach it), so its
  AlterPartition shrinking the ISR to itself stays pending (KIP-497: the
  shrink must not count toward the HW until committed) while it goes on
  taking sends alone; the controllers fence it when its session ends and
  elect a follower, and the ``kill`` (a power loss) comes once their
  metadata shows another leader (or a bound passed);

- ``elect-catching-up-follower``: KAFKA-7128's sequence (the broker
  simulator's R4) on one queue partition drawn when the fault starts,
  whose leader is up with two followers in its ISR.  Five actions, each
  carried out once the controllers' metadata shows what the one before
  was for (or a bound passed): a ``partition`` (``target="catch-up"``)
  that severs one follower from the other brokers
  (:func:`sever_groups`: it keeps its controller session), so that it
  falls behind and the leader shrinks it out of the ISR;
  :data:`CATCH_UP_SHRINK_S` later a ``kill`` of the leader, once the
  follower is out of the ISR, so that the other follower leads (after the
  brokers' session) with its HW a fetch behind the old leader's and alone
  in the ISR, below min ISR, so that HW stays there;
  :data:`CATCH_UP_FAILOVER_S` later a ``heal``, once that other leader
  leads, so that the severed follower catches up from it (one batch a
  fetch, one every 200 ms: the runner sets its own ``replica.fetch.max.bytes``
  to 1, ``replica.fetch.min.bytes`` to 64 KiB and ``replica.fetch.wait.max.ms``
  to 200 from the sever to the election, and on the other followers
  ``replica.fetch.min.bytes`` 64 KiB and ``replica.fetch.wait.max.ms``
  1000, so that they fetch in chunks of a second and the new leader's HW
  lags its epoch start by a chunk); then at once an
  ``elect-leader`` of the severed follower, made as soon as the
  controllers' metadata shows it back in the ISR (with the expansion
  rule broken, at the HW but below the leader's epoch start); and
  :data:`CATCH_UP_HOLD_S` later the ``start`` of the killed leader
  (``target="partition-leader"``).  Exclusive and exempt from
  ``keep_majority`` like the strands;

- ``rotate-certs``: every node's certificate and key re-issued from the
  cluster's CA while the nodes run (new key, new serial; the files replaced
  by rename), which they pick up on their next handshakes.  An instant
  action, like a heal: nothing stays in force and nothing ends it, so it
  may come at any time of a fault period, whatever else is in force.

- ``reassign``: a queue partition's replicas moved by a reassignment
  through the controllers (KIP-455): its leader's replica to a broker that
  holds none, so that leadership moves once the new replica has caught up,
  or, with no such broker, its replicas reordered; an intent
  (``target="partition"``) that the runner resolves with
  :mod:`chaos.leader_moves`, ended by a ``reassign`` of ``kind="revert"``
  back to the replicas found.  One at a time;
- ``elect-leader``: a partition's replicas reordered so that another ISR
  member is preferred, then a preferred leader election (``target=
  "partition"``): leadership moves with every node up.  Instant, like
  ``rotate-certs``; unlike other faults it also comes while faults are in
  force (half of the actions then, but under ``kill-majority`` or a
  strand, which run alone), since it takes no node down.

A partition's ``groups`` are the topologies of :mod:`chaos.backend` (built
by :func:`chaos.backend.partition_groups`, the leader's isolated by
:func:`chaos.backend.isolate`): two nodes talk if and only if some group
holds both, and a node in no group talks to nobody.  Disjoint groups split
the cluster; overlapping groups (the ring, the bridge) express links that
are not transitive.  Every partition is ended by ``heal``.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from chaos.backend import Groups, isolate, majority_available, partition_groups
from history.ops import NEMESIS, Op

__all__ = [
    "BROKER_KINDS",
    "CATCH_UP_FAILOVER_S",
    "CATCH_UP_HOLD_S",
    "CATCH_UP_KIND",
    "CATCH_UP_SHRINK_S",
    "COORDINATOR_KIND",
    "ELECT_LEADER_KIND",
    "FAULT_KINDS",
    "KILL_KINDS",
    "LEADER_MOVE_KINDS",
    "NETWORK_KINDS",
    "PACKET_KIND",
    "PARTITION_LEADER_KINDS",
    "PARTITION_KINDS",
    "POWER_LOSS_KIND",
    "POWER_LOSS_KINDS",
    "REASSIGN_KIND",
    "ROTATE_KIND",
    "SEVER_KIND",
    "STRAND_HOLD_S",
    "STRAND_ISOLATED_KIND",
    "STRAND_KINDS",
    "STRAND_SHRINK_S",
    "TORN_POWER_LOSS_KIND",
    "TORN_POWER_LOSS_KINDS",
    "Action",
    "action_ops",
    "majority_available",
    "nemesis_op",
    "packet_fault",
    "resolve",
    "schedule",
    "sever_groups",
    "strand_groups",
]

PARTITION_KINDS: Final = ("isolate-one", "isolate-leader", "halves", "majorities-ring", "bridge")
"""The topologies of :func:`chaos.backend.partition_groups` and the
``isolate-leader`` intent."""
KILL_KINDS: Final = ("kill", "kill-leader", "kill-majority")
"""Crashes: a random node, the leader, a majority."""
PACKET_KIND: Final = "packet"
"""Slow, lossy links between the nodes (ended by ``heal``)."""
STRAND_ISOLATED_KIND: Final = "strand-isolated-power-loss-partition-leader"
"""A strand whose leader is also cut off from the controllers, its shrink pending."""
STRAND_KINDS: Final = (
    "strand-partition-leader",
    "strand-power-loss-partition-leader",
    STRAND_ISOLATED_KIND,
)
"""A partition's leader stranded in its ISR, then killed or power-cut (brokers only)."""
STRAND_SHRINK_S: Final = 5.0
"""Seconds from a strand's partition to its kill: a lagging follower leaves
the ISR after ``replica.lag.time.max.ms`` (1 to 2 s in chaos runs) and the
leader's next ISR check (every half of it), then the AlterPartition, about
2 to 3 s; the leader then leads alone for the rest, as broker 2 does in
KIP-966's example (what it commits or serves alone is what its loss takes).
The runner waits longer, up to a bound, if the shrink is not committed yet."""
STRAND_HOLD_S: Final = (6.0, 9.0)
"""The range of seconds a stranded leader stays down before the heal and its
restart: past the brokers' session (4 s in chaos runs) and an election."""
CATCH_UP_KIND: Final = "elect-catching-up-follower"
"""A follower severed out of the ISR, the leader killed, the heal, and the
follower elected once back in the ISR (then the leader restarted)."""
CATCH_UP_SHRINK_S: Final = 4.0
"""Seconds from the follower's sever to the leader's kill: the lag
(``replica.lag.time.max.ms``, 1.5 to 2 s in chaos runs), the leader's ISR
check and its AlterPartition; the runner waits longer, up to a bound, if
the follower is still in the ISR."""
CATCH_UP_FAILOVER_S: Final = 6.0
"""Seconds from the leader's kill to the heal: past the brokers' 4 s
session, when the controllers fence it and elect the other follower; the
runner waits longer, up to a bound, for that leader."""
CATCH_UP_HOLD_S: Final = 4.0
"""Seconds from the heal (and the follower's election) to the killed
leader's restart."""
SEVER_KIND: Final = "sever-partition-leader"
"""A queue partition's leader cut off from the other brokers only (ended by ``heal``)."""
COORDINATOR_KIND: Final = "isolate-coordinator"
"""The group's coordinator cut off from every other node (ended by ``heal``)."""
NETWORK_KINDS: Final = (
    *PARTITION_KINDS,
    PACKET_KIND,
    "isolate-follower",
    SEVER_KIND,
    COORDINATOR_KIND,
    *STRAND_KINDS,
    CATCH_UP_KIND,
)
"""The network faults: at most one is in force, and ``heal`` ends it."""
ROTATE_KIND: Final = "rotate-certs"
"""Every node's certificate re-issued while it runs (instant; TLS only)."""
POWER_LOSS_KIND: Final = "power-loss"
"""A node's power cut: a kill of a process that keeps unsynced writes in memory."""
TORN_POWER_LOSS_KIND: Final = "torn-power-loss"
"""A node's power cut that leaves a torn part of its unsynced segment tails."""
_NODE_POWER_LOSSES: Final = (POWER_LOSS_KIND, TORN_POWER_LOSS_KIND)
PARTITION_LEADER_KINDS: Final = (
    "kill-partition-leader",
    "pause-partition-leader",
    "power-loss-partition-leader",
    "torn-power-loss-partition-leader",
)
"""The leader of a queue partition killed, paused or power-cut (brokers only)."""
TORN_POWER_LOSS_KINDS: Final = (TORN_POWER_LOSS_KIND, "torn-power-loss-partition-leader")
"""The faults whose run starts its processes in the power-loss test mode
with torn writes."""
POWER_LOSS_KINDS: Final = (
    POWER_LOSS_KIND,
    "power-loss-partition-leader",
    "strand-power-loss-partition-leader",
    STRAND_ISOLATED_KIND,
    *TORN_POWER_LOSS_KINDS,
)
"""The faults whose run starts its processes in the power-loss test mode."""
REASSIGN_KIND: Final = "reassign"
"""A queue partition's replicas moved by the controllers (ended by a revert)."""
ELECT_LEADER_KIND: Final = "elect-leader"
"""Another ISR member of a queue partition made its preferred leader (instant)."""
LEADER_MOVE_KINDS: Final = (REASSIGN_KIND, ELECT_LEADER_KIND)
"""Leadership moved through the controllers' admin RPCs, every node up."""
BROKER_KINDS: Final = (
    *PARTITION_LEADER_KINDS,
    "isolate-follower",
    SEVER_KIND,
    COORDINATOR_KIND,
    *LEADER_MOVE_KINDS,
    *STRAND_KINDS,
    CATCH_UP_KIND,
)
"""Faults aimed at a partition's replicas: they need brokers."""
FAULT_KINDS: Final = (
    *KILL_KINDS,
    "pause",
    *NETWORK_KINDS,
    ROTATE_KIND,
    *PARTITION_LEADER_KINDS,
    POWER_LOSS_KIND,
    TORN_POWER_LOSS_KIND,
    *LEADER_MOVE_KINDS,
)
_ENDS: Final = {
    "kill": "start",
    "pause": "resume",
    POWER_LOSS_KIND: "start",
    TORN_POWER_LOSS_KIND: "start",
    "partition": "heal",
    "packet": "heal",
}


@dataclass(frozen=True, slots=True)
class Action:
    """One thing the nemesis does at ``time_s`` seconds into the run.

    ``f`` is the history's: ``kill``, ``start``, ``pause``, ``resume``,
    ``partition``, ``packet``, ``heal`` or ``rotate-certs``.  ``nodes`` are the targets of the
    per-node ones; ``groups`` and ``kind`` describe a partition (``kind``
    also marks a ``kill-leader``, ``kill-majority`` or ``power-loss`` kill
    and its start).
    ``target`` is ``"leader"`` for an action whose targets are known only
    when it is carried out (:func:`resolve`).  ``drop``, ``delay_ms`` and
    ``jitter_ms`` describe a ``packet`` fault (each packet between nodes
    dropped with probability ``drop``, else delayed uniformly within
    ``delay_ms`` ± ``jitter_ms``).
    """

    time_s: float
    f: str
    nodes: tuple[int, ...] = ()
    groups: Groups = ()
    kind: str | None = None
    target: str | None = None
    drop: float = 0.0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0


def packet_fault(time_s: float, rng: random.Random) -> Action:
    """A ``packet`` action drawn with ``rng``: moderate faults that slow
    the cluster down without cutting it off (a delay of 50 to 150 ms with
    a jitter of 10 to 50 ms, a drop probability of 0.1 to 0.3), so that
    elections and timeouts are exercised rather than a plain outage."""
    delay = rng.randrange(50, 151, 10)
    jitter = rng.randrange(10, 51, 10)
    drop = rng.choice((0.1, 0.2, 0.3))
    return Action(time_s, "packet", drop=drop, delay_ms=delay, jitter_ms=jitter)


def resolve(action: Action, leader: int, nodes: Sequence[int]) -> Action:
    """``action`` with its ``"leader"`` intent made concrete (unchanged if it
    has none): a partition isolates ``leader``, a kill or start targets it
    (for the start of a ``kill-leader``, pass the node its kill resolved
    to)."""
    if action.target != "leader":
        return action
    if leader not in nodes:
        raise ValueError(f"leader {leader} is not one of the nodes {list(nodes)}")
    if action.f in ("kill", "start"):
        return replace(action, nodes=(leader,), target=None)
    return replace(action, groups=isolate(nodes, leader), target=None)


def strand_groups(
    nodes: Sequence[int], controllers: Collection[int], leader: int, followers: Collection[int]
) -> Groups:
    """The groups of a strand (KIP-966's worked example): ``leader`` with
    the ``controllers`` and every node that is not a follower, and each of
    ``followers`` alone with the controllers.  Each follower is cut off
    from the leader and from the other followers (none can fetch, so the
    leader shrinks the ISR to itself) but keeps its controller session: it
    is not fenced, so the ISR shrinks by the leader's AlterPartition, and
    it stays a live candidate the controllers may elect while the leader
    is down (from the ELR, or by an unclean election)."""
    known = set(nodes)
    ctl = set(controllers)
    fol = set(followers)
    if len(fol) != len(list(followers)) or not fol:
        raise ValueError(f"followers must be distinct and not empty, got {list(followers)}")
    for what, ids in (("controller", ctl), ("follower", fol), ("leader", {leader})):
        if not ids <= known:
            raise ValueError(f"{what} {sorted(ids - known)} not one of the nodes {sorted(known)}")
    if leader in fol or leader in ctl or fol & ctl:
        raise ValueError(
            f"leader {leader}, followers {sorted(fol)} and controllers {sorted(ctl)} must be apart"
        )
    rest = [n for n in known if n not in fol]
    return tuple(tuple(sorted(g)) for g in (rest, *([*ctl, f] for f in sorted(fol))))


def sever_groups(nodes: Sequence[int], controllers: Collection[int], node: int) -> Groups:
    """The groups of a sever: ``node`` with the ``controllers``, and every
    other node (the controllers among them) together.  ``node`` talks to
    no other broker, neither to fetch nor to be fetched from, but keeps its
    controller session (its heartbeats, its metadata fetches, its
    AlterPartition requests), so the controllers do not fence it and it
    learns their elections as they come; the other brokers still reach
    each other and the controllers."""
    known = set(nodes)
    ctl = set(controllers)
    if not ctl:
        raise ValueError("a sever needs the controllers, got none")
    for what, ids in (("controller", ctl), ("severed node", {node})):
        if not ids <= known:
            raise ValueError(f"{what} {sorted(ids - known)} not one of the nodes {sorted(known)}")
    if node in ctl:
        raise ValueError(f"node {node} is a controller: a sever cuts a broker off")
    rest = [n for n in known if n != node]
    if len(rest) == len(ctl):
        raise ValueError(f"node {node} is the only broker: nothing to sever it from")
    return (tuple(sorted([*ctl, node])), tuple(sorted(rest)))


def nemesis_op(action: Action) -> tuple[str, dict[str, Any]]:
    """The ``f`` and ``value`` of ``action``'s nemesis ops."""
    if action.target is not None:
        raise ValueError(f"resolve the {action.target!r} target of {action} first")
    if action.f in ("kill", "start", "pause", "resume", ROTATE_KIND):
        nodes: dict[str, Any] = {"nodes": list(action.nodes)}
        if action.kind is not None:
            nodes["kind"] = action.kind
        return action.f, nodes
    if action.f == "partition":
        value: dict[str, Any] = {"groups": [list(g) for g in action.groups]}
        if action.kind is not None:
            value["kind"] = action.kind
        return "partition", value
    if action.f == "packet":
        # docs/history-format.md: no duplicates are made, and the delay
        # never exceeds delay + jitter.
        return "packet", {
            "drop": action.drop,
            "duplicate": 0.0,
            "max_delay_ms": action.delay_ms + action.jitter_ms,
        }
    if action.f == "heal":
        return "heal", {}
    raise ValueError(f"unknown nemesis action {action.f!r}")


def action_ops(
    action: Action,
    *,
    index: int,
    invoke_ns: int,
    complete_ns: int,
    type: Literal["ok", "fail", "info"] = "ok",
    error: str | None = None,
) -> tuple[Op, Op]:
    """The invoke and completion of ``action`` as history ops (indexes
    ``index`` and ``index + 1``).  With a live recorder, record
    ``recorder.invoke(NEMESIS, *nemesis_op(...))`` before acting instead."""
    f, value = nemesis_op(action)
    if type not in ("ok", "fail", "info"):
        raise ValueError(f"a completion is ok, fail or info, not {type!r}")
    if (type == "ok") != (error is None):
        raise ValueError("fail and info need an error, ok has none")
    return (
        Op(index, invoke_ns, "invoke", NEMESIS, f, value=value),
        Op(index + 1, complete_ns, type, NEMESIS, f, value=value, error=error),
    )


# -- network state -------------------------------------------------------------


def _partition(kind: str, nodes: list[int], rng: random.Random) -> tuple[Groups | None, str | None]:
    """The groups of a partition kind (empty with a ``"leader"`` target;
    ``None`` for a packet fault, which cuts no node off)."""
    if kind == PACKET_KIND:
        return None, None
    if kind == "isolate-leader":
        return (), "leader"
    if kind == "isolate-follower":
        return (), "follower"
    if kind == COORDINATOR_KIND:
        return (), "coordinator"
    if kind == SEVER_KIND:
        return (), "partition-leader"
    return partition_groups(kind, nodes, rng), None


def _possible_groups(
    groups: Groups | None, target: str | None, nodes: list[int]
) -> list[Groups | None]:
    """Every network a partition may make (a leader intent: any node;
    ``None``: no partition)."""
    if target in ("leader", "follower", "coordinator"):
        return [isolate(nodes, n) for n in nodes]
    if target == "partition-leader":
        # A sever: the controllers still reach every node, so the quorum
        # keeps every link it had (as with the whole network).
        return [None]
    return [groups]


# -- schedules -----------------------------------------------------------------


def schedule(
    rng: random.Random,
    nodes: Sequence[int],
    faults: Iterable[str],
    *,
    duration_s: float,
    interval_s: float = 2.0,
    fault_period_s: float = 10.0,
    quiet_s: float = 5.0,
    max_concurrent: int = 1,
    keep_majority: bool = True,
    start_s: float = 0.0,
) -> list[Action]:
    """A fault schedule of ``duration_s`` seconds from ``start_s``.

    Fault periods of ``fault_period_s`` seconds alternate with quiet periods
    of ``quiet_s`` seconds (no fault in force).  In a fault period an action
    comes every ``interval_s`` seconds on average (uniformly 0.5 to 1.5
    times it): a new fault while fewer than ``max_concurrent`` are in force
    and one can be made, else the end of one in force.  Each fault period
    ends every fault still in force; the schedule ends with a ``heal``
    (heal-all) at ``start_s + duration_s`` at the latest.  Times never
    decrease.  With ``keep_majority`` no fault is started that could leave
    no node able to reach a majority of up nodes, except ``kill-majority``,
    which is asked for by name: it starts only with no other fault in
    force, and none starts while it is.  While a ``kill-leader`` is in
    force (its node unknown until run time) only partitions start.
    """
    ids = sorted(set(nodes))
    if len(ids) != len(nodes) or not ids:
        raise ValueError("nodes must be distinct and not empty")
    kinds = list(dict.fromkeys(faults))
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
    if "majorities-ring" in kinds and len(ids) < 5:
        raise ValueError("majorities-ring needs at least 5 nodes")
    if any(k in PARTITION_KINDS for k in kinds) and len(ids) < 2:
        raise ValueError("a partition needs at least 2 nodes")
    if PACKET_KIND in kinds and len(ids) < 2:
        raise ValueError("a packet fault needs at least 2 nodes")
    if "bridge" in kinds and len(ids) < 3:
        raise ValueError("bridge needs at least 3 nodes")
    if "kill-majority" in kinds and len(ids) < 3:
        raise ValueError("kill-majority needs at least 3 nodes")
    if min(duration_s, interval_s, fault_period_s) <= 0 or quiet_s < 0 or max_concurrent < 1:
        raise ValueError("durations and interval must be positive, max_concurrent at least 1")

    end_s = start_s + duration_s
    out: list[Action] = []
    # In force: the kill or pause of each node that is down, a kill of the
    # leader (node unknown), a kill of a majority, and the partition.
    down: dict[int, str] = {}
    leader_down = False
    # A kill or pause of a partition's leader in force (its node unknown).
    targeted: str | None = None
    majority: tuple[int, ...] | None = None
    # A reassignment in force (its partition drawn at run time).
    moved = False
    net: tuple[Groups | None, str | None, str] | None = None
    # A strand (or a catch-up) in force: its kind, and the earliest time of its heal and
    # restart (its kill time plus the hold drawn).
    strand: tuple[str, float] | None = None

    def safe(
        down_now: Iterable[int], groups: Groups | None, target: str | None, leader: bool
    ) -> bool:
        if not keep_majority:
            return True
        d = list(down_now)
        extra: list[int | None] = [n for n in ids if n not in d] if leader else [None]
        return all(
            majority_available(ids, [*d, *([k] if k is not None else [])], g)
            for k in extra
            for g in _possible_groups(groups, target, ids)
        )

    def start_one(t: float) -> bool:
        nonlocal net, leader_down, majority, targeted, moved
        nonlocal strand
        if majority is not None or strand is not None:
            return False
        options = [
            k
            for k in kinds
            if not (k in NETWORK_KINDS and net is not None)
            and not (k in ("kill-majority", *STRAND_KINDS, CATCH_UP_KIND) and count() > 0)
            and not (
                k in ("kill", "pause", *_NODE_POWER_LOSSES, "kill-leader", *PARTITION_LEADER_KINDS)
                and (leader_down or targeted is not None)
            )
        ]
        rng.shuffle(options)
        cur_groups, cur_target = (net[0], net[1]) if net is not None else (None, None)
        for kind in options:
            if kind in ("kill", "pause", *_NODE_POWER_LOSSES):
                free = [n for n in ids if n not in down]
                rng.shuffle(free)
                for n in free:
                    if safe([*down, n], cur_groups, cur_target, leader_down):
                        down[n] = kind
                        if kind in _NODE_POWER_LOSSES:
                            out.append(Action(t, "kill", nodes=(n,), kind=kind))
                        else:
                            out.append(Action(t, kind, nodes=(n,)))
                        return True
            elif kind == "kill-leader":
                if len(down) < len(ids) and safe(down, cur_groups, cur_target, True):
                    leader_down = True
                    out.append(Action(t, "kill", kind=kind, target="leader"))
                    return True
            elif kind in PARTITION_LEADER_KINDS:
                if len(down) < len(ids) and safe(down, cur_groups, cur_target, True):
                    targeted = kind
                    f = "pause" if kind == "pause-partition-leader" else "kill"
                    out.append(Action(t, f, kind=kind, target="partition-leader"))
                    return True
            elif kind in STRAND_KINDS:
                # Exclusive (nothing else in force, the options say), and
                # whole within the schedule: partition, then kill, then
                # heal and restart after the hold.
                kill_s = t + STRAND_SHRINK_S
                if kill_s + STRAND_HOLD_S[1] <= end_s:
                    strand = (kind, kill_s + rng.uniform(*STRAND_HOLD_S))
                    out.append(Action(t, "partition", kind=kind, target="strand"))
                    out.append(Action(kill_s, "kill", kind=kind, target="stranded"))
                    return True
            elif kind == CATCH_UP_KIND:
                # Exclusive and whole within the schedule, like a strand:
                # the sever, the kill, the heal and the election now, the
                # restart when the hold is over (end_one).
                kill_s = t + CATCH_UP_SHRINK_S
                heal_s = kill_s + CATCH_UP_FAILOVER_S
                until = heal_s + CATCH_UP_HOLD_S
                if until <= end_s:
                    strand = (kind, until)
                    out.extend(
                        [
                            Action(t, "partition", kind=kind, target="catch-up"),
                            Action(kill_s, "kill", kind=kind, target="catch-up"),
                            Action(heal_s, "heal", kind=kind, target="catch-up"),
                            Action(heal_s, ELECT_LEADER_KIND, kind=kind, target="catch-up"),
                        ]
                    )
                    return True
            elif kind == "kill-majority":
                majority = tuple(sorted(rng.sample(ids, len(ids) // 2 + 1)))
                out.append(Action(t, "kill", nodes=majority, kind=kind))
                return True
            elif kind == ROTATE_KIND:
                # Instant, and no threat to a majority: always possible.
                out.append(Action(t, ROTATE_KIND, nodes=tuple(ids)))
                return True
            elif kind == ELECT_LEADER_KIND:
                # Instant; no node goes down.
                out.append(Action(t, kind, kind=kind, target="partition"))
                return True
            elif kind == REASSIGN_KIND:
                if not moved:
                    moved = True
                    out.append(Action(t, kind, kind=kind, target="partition"))
                    return True
            else:
                groups, target = _partition(kind, ids, rng)
                if safe(down, groups, target, leader_down):
                    net = (groups, target, kind)
                    if kind == PACKET_KIND:
                        out.append(packet_fault(t, rng))
                    else:
                        assert groups is not None
                        out.append(Action(t, "partition", groups=groups, kind=kind, target=target))
                    return True
        return False

    def end_one(t: float, which: int | None) -> None:
        nonlocal strand
        nonlocal net, leader_down, majority, targeted, moved
        active: list[int | str] = [
            *sorted(down),
            *(["leader"] if leader_down else []),
            *(["targeted"] if targeted is not None else []),
            *(["majority"] if majority is not None else []),
            *(["net"] if net is not None else []),
            *(["strand"] if strand is not None else []),
            *(["moved"] if moved else []),
        ]
        pick = active[which if which is not None else rng.randrange(len(active))]
        if pick == "strand":
            assert strand is not None
            stranded, until = strand
            if which is None and t < until:
                return  # the hold is not over: the strand stays
            # At the hold's end exactly: nothing came since the kill (a
            # catch-up's heal came before its election).
            if stranded != CATCH_UP_KIND:
                out.append(Action(until, "heal"))
            out.append(Action(until, "start", kind=stranded, target="partition-leader"))
            strand = None
        elif pick == "net":
            net = None
            out.append(Action(t, "heal"))
        elif pick == "leader":
            leader_down = False
            out.append(Action(t, "start", kind="kill-leader", target="leader"))
        elif pick == "targeted":
            assert targeted is not None
            f = "resume" if targeted == "pause-partition-leader" else "start"
            out.append(Action(t, f, kind=targeted, target="partition-leader"))
            targeted = None
        elif pick == "moved":
            moved = False
            out.append(Action(t, REASSIGN_KIND, kind="revert", target="partition"))
        elif pick == "majority":
            assert majority is not None
            out.append(Action(t, "start", nodes=majority, kind="kill-majority"))
            majority = None
        else:
            assert isinstance(pick, int)
            how = down.pop(pick)
            # A power loss's start repeats its kind, as a kill-leader's does.
            kind = how if how in _NODE_POWER_LOSSES else None
            out.append(Action(t, _ENDS[how], nodes=(pick,), kind=kind))

    def count() -> int:
        return (
            len(down)
            + leader_down
            + (targeted is not None)
            + (majority is not None)
            + (net is not None)
            + (strand is not None)
            + moved
        )

    t = start_s
    while kinds and t < end_s:
        period_end = min(t + fault_period_s, end_s)
        while True:
            t += interval_s * rng.uniform(0.5, 1.5)
            if t >= period_end:
                break
            n = count()
            if (
                n > 0
                and majority is None
                and strand is None
                and ELECT_LEADER_KIND in kinds
                and rng.random() < 0.5
            ):
                # An election keeps every node up, so it may come while
                # other faults are in force (the draw is made only when the
                # kind is on, so other schedules stay what they were): a
                # leader moved while a follower is cut off or paused is
                # one whose purgatory holds produces.
                out.append(Action(t, ELECT_LEADER_KIND, kind=ELECT_LEADER_KIND, target="partition"))
                continue
            if n == 0 or (n < max_concurrent and rng.random() < 0.5):
                if not start_one(t) and n > 0:
                    end_one(t, None)
            elif n > 0:
                end_one(t, None)
        t = period_end
        while count():
            end_one(t, 0)
        # A strand's hold may outlast the period.
        t = max(t, out[-1].time_s) if out else t
        t += quiet_s
    final = min(t, end_s)
    out.append(Action(max(final, out[-1].time_s) if out else start_s, "heal"))
    return out
