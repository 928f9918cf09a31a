"""The transaction simulation's configuration (:mod:`broker.sim.txn`).

The cluster's last partition is the transaction-state partition (Kafka's
``__transaction_state`` with one partition); the others are the data
partitions the producers write.  Five rule switches break KIP-890's
defences or the coordinator's own rules on purpose, for the scenarios and
tests that show an invariant firing; they are the simulation's, not
:mod:`bugs`'s (the catalogue's transaction bugs come with their chaos
workload).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.sim.config import SimConfig

__all__ = ["TxnSimConfig"]


def _cluster() -> SimConfig:
    return SimConfig(brokers=3, partitions=3, replication_factor=3, min_insync_replicas=2)


@dataclass(frozen=True, slots=True)
class TxnSimConfig:
    """A transactional workload on a simulated cluster: ``cluster``'s
    partitions but the last hold data, the last the transaction log."""

    cluster: SimConfig = field(default_factory=_cluster)
    # Transactional ids of the random workload, each with one producer
    # instance at a time (plus the zombies the workload starts).
    transactional_ids: int = 2
    # transaction.timeout.ms of every producer.
    txn_timeout_ms: int = 4_000
    # A request unanswered this long is sent again (a new connection: the
    # old attempt's answer is no longer awaited).
    request_timeout_ms: int = 1_000
    retry_backoff_ms: int = 100
    # delivery.timeout.ms: a batch unacknowledged this long expires and its
    # transaction is aborted (the Java client's abortable error).
    delivery_timeout_ms: int = 3_000
    # The coordinator sends an unanswered marker again after this long.
    marker_retry_ms: int = 400
    # How often the coordinator looks for timed-out transactions.
    timeout_check_interval_ms: int = 500
    # How often the clients' timers fire.
    client_tick_ms: int = 25
    # The chance a transaction message (request, answer, verification,
    # marker) is delivered twice, each copy with its own delay.
    duplicate_rate: float = 0.0
    # The chance, at each workload step of a random run, that a second
    # producer instance of a transactional id starts (fencing the first,
    # which keeps trying: a zombie).
    zombie_rate: float = 0.0
    # The chance that a producer, between two transactions, recovers with
    # InitProducerId naming its id and epoch (KIP-360), bumping its epoch.
    recover_rate: float = 0.0
    # Rule switches, for tests only.
    # KIP-890 part 1: a leader verifies a producer's first transactional
    # batch of a transaction with the coordinator before appending it.
    verify_transactional_produce: bool = True
    # KIP-890 part 2 (transaction version 2): every EndTxn bumps the epoch.
    # Off: transaction version 1 (TransactionCoordinatorShard's
    # bump_epoch_on_end), KAFKA-17754's delayed EndTxn ends the next one.
    bump_epoch_on_end: bool = True
    # KAFKA-19446: a partition refuses a transaction version 2 marker at
    # the epoch of the transaction open there (a late copy of the previous
    # transaction's marker, which would end this one).
    refuse_late_markers: bool = True
    # On: the coordinator writes only a transaction's first marker, then
    # completes it (a commit marked in only some of its partitions).
    complete_after_first_marker: bool = False
    # On: read_committed readers read up to the high watermark instead of
    # the last stable offset (the LSO advanced past an open transaction).
    read_to_high_watermark: bool = False

    def __post_init__(self) -> None:
        if self.cluster.partitions < 2:
            raise ValueError(
                f"a transaction simulation needs a data partition and the transaction-state "
                f"partition, not {self.cluster.partitions} partitions"
            )
        if self.transactional_ids < 1:
            raise ValueError(f"transactional_ids must be at least 1, not {self.transactional_ids}")
        for name in ("duplicate_rate", "zombie_rate", "recover_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must be in [0, 1), not {rate}")

    @property
    def state_partition(self) -> int:
        """The transaction-state partition: the cluster's last."""
        return self.cluster.partitions - 1

    @property
    def data_partitions(self) -> tuple[int, ...]:
        return tuple(range(self.cluster.partitions - 1))
