"""The broker simulation's configuration.

Rules are broken on purpose by the process-wide switch of :mod:`bugs`
(``with bugs.injected(Bug.X):``), at the line of the replica state machine
or of the controller stub that keeps the rule; the scenarios
(:mod:`broker.sim.scenarios`) run once with every rule and once with their
bug on, and show that an invariant (:mod:`broker.sim.invariants`) fires.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SimConfig"]


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
    # replica.fetch.max.bytes of every follower fetch (KIP-74: at least one
    # batch is answered); None: the replica config's.
    replica_fetch_max_bytes: int | None = None
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
    # The chance that a workload step of a random run is a DeleteRecords of
    # a partition below the consumer's position there; 0 draws nothing, so
    # runs without deletes keep their seeds' schedules.
    delete_rate: float = 0.0

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
        if not 0.0 <= self.delete_rate < 1.0:
            raise ValueError(f"delete_rate must be in [0, 1), not {self.delete_rate}")

    @property
    def rf(self) -> int:
        return min(self.replication_factor, self.brokers)
