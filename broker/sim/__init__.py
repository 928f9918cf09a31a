"""A seeded, deterministic simulation of brokers replicating partitions
under a controller stub, with crashes, partitions and message loss, and the
invariants checked after every event (docs/brokers.md, "Simulation")."""

from broker.sim.cluster import SimCluster
from broker.sim.config import SimConfig
from broker.sim.invariants import InvariantChecker, Violation
from broker.sim.schedule import ALL_NEMESES, Nemesis, SimResult, replay_command, run_random

__all__ = [
    "ALL_NEMESES",
    "InvariantChecker",
    "Nemesis",
    "SimCluster",
    "SimConfig",
    "SimResult",
    "Violation",
    "replay_command",
    "run_random",
]
