"""The broker simulation's configuration and its bug switches.

A :class:`Bug` breaks on purpose one rule of Kafka's replication, each the
rule a historical bug broke (``brokers.md`` §1.12 and the bug-injection
catalogue of §5.7); the scenarios (:mod:`broker.sim.scenarios`) run once
with every rule and once with their rule broken, and show that an invariant
(:mod:`broker.sim.invariants`) fires. Bugs exist only in the simulator: the
replica state machine has no switch; the simulator breaks a rule by
replacing one of its decisions (:mod:`broker.sim.replica`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["Bug", "SimConfig"]


class Bug(enum.Enum):
    # B1, R1: a follower truncates its log to its HW when it starts
    # following (the rule before KIP-101).
    TRUNCATE_TO_HW_ON_BECOME_FOLLOWER = "truncate-to-hw-on-become-follower"
    # R2: the leader answers a fetch without the divergence check of the last
    # fetched epoch (KIP-101 before epochs, KIP-595's check removed).
    NO_DIVERGENCE_CHECK = "no-divergence-check"
    # B2, R3: a follower truncates once to the leader's end offset of the
    # diverging epoch, whether or not it has that epoch, then fetches by
    # offset (KIP-101 before KIP-279: KAFKA-6361).
    TRUNCATE_BY_OFFSET = "truncate-by-offset"
    # B4, R4: ISR expansion on LEO >= HW alone, without the leader epoch
    # start offset (KAFKA-7128).
    EXPAND_WITHOUT_EPOCH_START = "expand-without-epoch-start"
    # B6, R5: the leader's HW advances while the ISR is below min ISR
    # (KAFKA-15583).
    HW_UNDER_MIN_ISR = "hw-under-min-isr"
    # R9: the controller keeps no eligible leader replicas (KIP-966): the
    # last ISR member is the only clean candidate.
    NO_ELR = "no-elr"
    # R10: min.insync.replicas is ignored: acks=all is accepted and
    # acknowledged by a leader alone (Jepsen's Kafka 0.8 finding).
    IGNORE_MIN_ISR = "ignore-min-isr"
    # B10: consumers read up to the LEO instead of the HW.
    CONSUME_TO_LEO = "consume-to-leo"


@dataclass(frozen=True, slots=True)
class SimConfig:
    """A simulated cluster: ``brokers`` brokers, ``partitions`` partitions
    each replicated on every broker (replication factor = brokers, at most
    ``replication_factor``), one controller, clients. Times are virtual
    milliseconds."""

    brokers: int = 3
    partitions: int = 2
    replication_factor: int = 3
    min_insync_replicas: int = 2
    replica_lag_time_max_ms: int = 2_000
    # The controller fences a broker whose last heartbeat is older than this
    # (broker.session.timeout.ms) and elects elsewhere.
    session_timeout_ms: int = 1_500
    heartbeat_interval_ms: int = 200
    # Followers fetch every fetch_interval_ms (a long poll answered at once);
    # a fetch unanswered for fetch_timeout_ms is given up.
    fetch_interval_ms: int = 50
    fetch_timeout_ms: int = 500
    # Brokers pull the metadata log every metadata_interval_ms (observers).
    metadata_interval_ms: int = 100
    isr_tick_ms: int = 250
    alter_partition_timeout_ms: int = 500
    produce_timeout_ms: int = 2_000
    # Message delays, uniform in [min, max], and the chance a message is lost.
    min_delay_ms: int = 1
    max_delay_ms: int = 20
    drop_rate: float = 0.0
    # Elections: ELR under strict min ISR (KIP-966); unclean only if set.
    elr: bool = True
    unclean_election: bool = False
    # A restarted broker registers again: its old incarnation is fenced (out
    # of the ISRs and its leaderships), and after a power loss it also leaves
    # the ELR (KIP-966's unclean shutdown). On: a restart faster than the
    # session timeout keeps its ISR places, as ZooKeeper-era brokers did
    # (KIP-101's scenarios assume it).
    restart_keeps_isr: bool = False
    # flush.messages; None: nothing is synced but by an explicit flush.
    flush_messages: int | None = None
    # Power losses are drawn only for a broker that leaves another intact
    # in-sync copy of every partition it holds (losing the last one is the
    # loss Kafka documents, brokers.md §1.10); off: drawn for any broker.
    guard_power_loss: bool = True
    bugs: frozenset[Bug] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.brokers < 1:
            raise ValueError(f"brokers must be at least 1, not {self.brokers}")
        if self.partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {self.partitions}")
        if self.replication_factor < 1:
            raise ValueError(
                f"replication_factor must be at least 1, not {self.replication_factor}"
            )
        if self.min_insync_replicas < 1:
            raise ValueError(
                f"min_insync_replicas must be at least 1, not {self.min_insync_replicas}"
            )
        if not 0 <= self.min_delay_ms <= self.max_delay_ms:
            raise ValueError(
                f"delays must satisfy 0 <= min_delay_ms <= max_delay_ms, not "
                f"{self.min_delay_ms} and {self.max_delay_ms}"
            )
        if not 0.0 <= self.drop_rate < 1.0:
            raise ValueError(f"drop_rate must be in [0, 1), not {self.drop_rate}")

    @property
    def rf(self) -> int:
        return min(self.replication_factor, self.brokers)
