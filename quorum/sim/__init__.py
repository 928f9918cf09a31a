"""Deterministic simulation of a kq quorum.

A seeded scheduler on virtual time drives real :class:`quorum.core.RaftCore`
instances through the Ready contract, over a network that drops, delays,
duplicates, reorders and partitions messages, with crashes that lose
unflushed writes.  Invariants are checked after every event (see
:mod:`quorum.sim.invariants`).  Everything is pure: one ``random.Random``
seeded from the schedule's seed decides everything, so a seed replays.
"""

from quorum.sim.cluster import SimCluster, SimConfig, SimResult
from quorum.sim.invariants import Violation
from quorum.sim.schedule import FaultPlan, run_schedule

__all__ = ["FaultPlan", "SimCluster", "SimConfig", "SimResult", "Violation", "run_schedule"]
