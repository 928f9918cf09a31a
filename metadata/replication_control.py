"""Topics, partitions, leaders and ISRs (Kafka's ReplicationControlManager):
creating and deleting topics and partitions, AlterPartition (KIP-841),
elections (online, preferred, unclean; KIP-704), preferred-leader
rebalancing and reassignments (KIP-455).  Pure: decisions only."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import bugs
from bugs import Bug
from metadata import configs
from metadata.configs import ResourceType
from metadata.control_state import ControlState
from metadata.errors import ApiError, Errors
from metadata.image import PartitionRegistration, TopicImage
from metadata.partition_change import Election, PartitionChange, reassignment_replicas
from metadata.placement import UsableBroker, place, validate_assignment
from metadata.records import (
    NO_LEADER,
    ConfigRecord,
    LeaderRecoveryState,
    PartitionChangeRecord,
    PartitionRecord,
    Record,
    RemoveTopicRecord,
    TopicRecord,
)
from metadata.requests import (
    MAX_ELECTIONS_PER_REBALANCE,
    MAX_RECORDS_PER_ATOMIC_OP,
    AlterPartitionItem,
    ControllerResult,
    ItemResult,
    NewTopic,
    check_topic_name,
    new_topic_id,
)

__all__ = ["ReplicationControl"]


class ReplicationControl:
    """Decides on :class:`ControlState`'s image; changes nothing."""

    def __init__(self, state: ControlState) -> None:
        self.state = state
        # Each topic's unclean.leader.election.enable, per version of the
        # configs (fencing a broker decides for tens of thousands of
        # partitions).
        self._unclean: dict[str, bool] = {}
        # Each topic's min.insync.replicas, likewise.
        self._min_isr: dict[str, int] = {}
        self._unclean_configs: object = None

    def _unclean_allowed(self, topic: TopicImage) -> bool:
        # Fencing a broker decides for tens of thousands of partitions:
        # resolve each topic's setting once per version of the configs.
        self._check_configs_version()
        found = self._unclean.get(topic.name)
        if found is None:
            found = configs.as_bool(
                self.state.topic_config(topic, "unclean.leader.election.enable")
            )
            self._unclean[topic.name] = found
        return found

    def _check_configs_version(self) -> None:
        if self._unclean_configs is not self.state.image.configs:
            self._unclean_configs = self.state.image.configs
            self._unclean.clear()
            self._min_isr.clear()

    def _min_isr_of(self, topic: TopicImage, p: PartitionRegistration) -> int:
        """The topic's min.insync.replicas, at most its replication factor
        (Kafka's ReplicationControlManager.getTopicEffectiveMinIsr).  The
        topic's override, else the cluster's, else the default: a broker's
        own override is not read, as Kafka 4 requires a cluster-level value
        once ELR is on (KIP-966)."""
        self._check_configs_version()
        found = self._min_isr.get(topic.name)
        if found is None:
            found = configs.as_int(self.state.topic_config(topic, "min.insync.replicas"))
            self._min_isr[topic.name] = found
        return min(found, len(p.replicas))

    def _change(
        self,
        topic: TopicImage,
        partition_id: int,
        *,
        is_active: Callable[[int], bool] | None = None,
        **kwargs: object,
    ) -> PartitionChange:
        p = topic.partitions[partition_id]
        election = Election.UNCLEAN if self._unclean_allowed(topic) else Election.ONLINE
        change = PartitionChange(
            topic.topic_id,
            partition_id,
            p,
            is_active or self.state.active,
            election,
            min_isr=self._min_isr_of(topic, p),
            use_last_known_leader=self.state.options.use_last_known_leader,
        )
        for key, value in kwargs.items():
            setattr(change, key, value)
        return change

    def remove_broker_from_partitions(
        self, broker_id: int, only_leaderships: bool = False, unclean_shutdown: bool = False
    ) -> list[Record]:
        """Changes taking ``broker_id`` out of every ISR and leadership
        (fencing, controlled shutdown, unregistration); below min ISR it
        goes to the ELR (KIP-966).  With ``only_leaderships`` it stays in
        the ISRs.  With ``unclean_shutdown`` (it re-registered without its
        previous broker epoch, so it may have lost its unsynced tail) it
        leaves the ELRs too (Kafka's handleBrokerUncleanShutdown)."""
        records: list[Record] = []

        def active(b: int) -> bool:
            return b != broker_id and self.state.active(b)

        for topic in self.state.image.topics.values():
            for i, p in enumerate(topic.partitions):
                in_elr = unclean_shutdown and broker_id in p.elr
                if p.leader != broker_id and broker_id not in p.isr and not in_elr:
                    continue
                if only_leaderships and p.leader != broker_id:
                    continue
                target_isr = p.isr
                if not only_leaderships and broker_id in p.isr:
                    target_isr = tuple(b for b in p.isr if b != broker_id)
                change = self._change(
                    topic,
                    i,
                    is_active=active,
                    target_isr=target_isr,
                    unclean_shutdown=(broker_id,) if unclean_shutdown else (),
                ).build()
                if change is not None:
                    records.append(change)
        return records

    def elect_leaderless(self, newly_active: int) -> list[Record]:
        """Elections for partitions without a leader that ``newly_active``
        can now lead (it is in their ISR, or in their ELR with the ISR
        empty, or their last known leader with both empty, or unclean
        election is allowed)."""
        records: list[Record] = []
        for topic in self.state.image.topics.values():
            for i, p in enumerate(topic.partitions):
                if p.has_leader or newly_active not in p.replicas:
                    continue
                change = self._change(topic, i).build()
                if change is not None:
                    records.append(change)
        return records

    def create_topics(
        self, topics: Sequence[NewTopic], validate_only: bool = False
    ) -> ControllerResult[list[ItemResult]]:
        results: list[ItemResult] = []
        records: list[Record] = []
        counts: dict[str, int] = {}
        for t in topics:
            counts[t.name] = counts.get(t.name, 0) + 1
        for t in topics:
            try:
                if counts[t.name] > 1:
                    raise ApiError(Errors.INVALID_REQUEST, f"topic {t.name} appears more than once")
                made, result = self._create_topic(t)
            except ApiError as exc:
                results.append(ItemResult(t.name, exc.code, exc.message))
                continue
            if len(records) + len(made) > MAX_RECORDS_PER_ATOMIC_OP:
                results.append(
                    ItemResult(
                        t.name,
                        Errors.INVALID_REQUEST,
                        f"creating topic {t.name} would need {len(made)} more records; "
                        f"one request may write at most {MAX_RECORDS_PER_ATOMIC_OP}",
                    )
                )
                continue
            records.extend(made)
            results.append(result)
        return ControllerResult([] if validate_only else records, results)

    def _create_topic(self, t: NewTopic) -> tuple[list[Record], ItemResult]:
        check_topic_name(t.name)
        if t.name in self.state.image.topic_ids:
            raise ApiError(Errors.TOPIC_ALREADY_EXISTS, f"topic {t.name} already exists")
        topic_configs: dict[str, str] = {}
        for key, value in sorted(t.configs.items()):
            topic_configs[key] = configs.validate(ResourceType.TOPIC, t.name, key, value)
        cluster = self.state.cluster_config()
        if t.assignments:
            if t.num_partitions not in (-1, len(t.assignments)) or t.replication_factor != -1:
                raise ApiError(
                    Errors.INVALID_REQUEST,
                    "give either an explicit replica assignment or partitions and a "
                    "replication factor, not both",
                )
            if sorted(t.assignments) != list(range(len(t.assignments))):
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"the assignment must name partitions 0..{len(t.assignments) - 1}",
                )
            assignment = [tuple(t.assignments[i]) for i in range(len(t.assignments))]
            validate_assignment(assignment, {b.id: b for b in self.state.usable_brokers()})
        else:
            partitions = t.num_partitions
            if partitions == -1:
                partitions = configs.as_int(configs.effective("num.partitions", cluster=cluster))
            rf = t.replication_factor
            if rf == -1:
                rf = configs.as_int(
                    configs.effective("default.replication.factor", cluster=cluster)
                )
            if partitions < 1:
                raise ApiError(
                    Errors.INVALID_PARTITIONS,
                    f"a topic needs at least 1 partition, not {partitions}",
                )
            if partitions + 1 + len(topic_configs) > MAX_RECORDS_PER_ATOMIC_OP:
                raise ApiError(
                    Errors.INVALID_PARTITIONS,
                    f"{partitions} partitions are more than one request may create "
                    f"({MAX_RECORDS_PER_ATOMIC_OP - 1 - len(topic_configs)})",
                )
            assignment = place(0, partitions, rf, self.state.usable_brokers(), self.state.rng)
        topic_id = new_topic_id(self.state.rng)
        while topic_id in self.state.image.topics:
            topic_id = new_topic_id(self.state.rng)
        records: list[Record] = [TopicRecord(t.name, topic_id)]
        records.extend(self._new_partitions(topic_id, 0, assignment))
        for key, value in topic_configs.items():
            records.append(ConfigRecord(int(ResourceType.TOPIC), t.name, key, value))
        return records, ItemResult(
            t.name,
            topic_id=topic_id,
            num_partitions=len(assignment),
            replication_factor=len(assignment[0]),
        )

    def _new_partitions(
        self, topic_id: str, first: int, assignment: Sequence[tuple[int, ...]]
    ) -> list[Record]:
        out: list[Record] = []
        for i, replicas in enumerate(assignment):
            isr = tuple(r for r in replicas if self.state.active(r))
            if not isr:
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {first + i} has no unfenced replica among {list(replicas)}",
                )
            out.append(PartitionRecord(topic_id, first + i, replicas, isr, leader=isr[0]))
        return out

    def delete_topics(
        self, names: Sequence[str] = (), topic_ids: Sequence[str] = ()
    ) -> ControllerResult[list[ItemResult]]:
        results: list[ItemResult] = []
        records: list[Record] = []
        wanted = [(n, self.state.image.topic_ids.get(n)) for n in names]
        wanted += [
            (
                self.state.image.topics[i].name if i in self.state.image.topics else i,
                i if i in self.state.image.topics else None,
            )
            for i in topic_ids
        ]
        for label, topic_id in wanted:
            if topic_id is None:
                results.append(
                    ItemResult(
                        label, Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {label} does not exist"
                    )
                )
                continue
            if sum(1 for _, other in wanted if other == topic_id) > 1:
                results.append(
                    ItemResult(
                        label,
                        Errors.INVALID_REQUEST,
                        f"topic {label} is named more than once",
                        topic_id=topic_id,
                    )
                )
                continue
            records.append(RemoveTopicRecord(topic_id))
            results.append(ItemResult(label, topic_id=topic_id))
        return ControllerResult(records, results)

    def create_partitions(
        self,
        name: str,
        total: int,
        assignments: Sequence[tuple[int, ...]] = (),
        validate_only: bool = False,
    ) -> ControllerResult[ItemResult]:
        topic = self.state.image.topic_by_name(name)
        if topic is None:
            raise ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name} does not exist")
        current = len(topic.partitions)
        if total <= current:
            raise ApiError(
                Errors.INVALID_PARTITIONS,
                f"topic {name} has {current} partitions; the new count {total} must be larger",
            )
        new = total - current
        if new > MAX_RECORDS_PER_ATOMIC_OP:
            raise ApiError(
                Errors.INVALID_PARTITIONS,
                f"{new} new partitions are more than one request may create "
                f"({MAX_RECORDS_PER_ATOMIC_OP})",
            )
        rf = len(topic.partitions[0].target_replicas())
        if assignments:
            if len(assignments) != new:
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"{len(assignments)} assignments given for {new} new partitions",
                )
            assignment = [tuple(a) for a in assignments]
            validate_assignment(
                assignment,
                {b.id: b for b in self.state.usable_brokers()},
                start_partition=current,
                replication_factor=rf,
            )
        else:
            assignment = place(current, new, rf, self.state.usable_brokers(), self.state.rng)
        records = self._new_partitions(topic.topic_id, current, assignment)
        result = ItemResult(
            name, topic_id=topic.topic_id, num_partitions=total, replication_factor=rf
        )
        return ControllerResult([] if validate_only else records, result)

    def alter_partition(
        self, broker_id: int, broker_epoch: int, items: Sequence[AlterPartitionItem]
    ) -> ControllerResult[list[ItemResult]]:
        """ISR changes from partition leaders (KIP-497, KIP-841, KIP-903)."""
        self.state.broker(broker_id, broker_epoch)
        results: list[ItemResult] = []
        records: list[Record] = []
        for item in items:
            label = f"{item.topic_id}-{item.partition}"
            try:
                change, state = self._alter_one(broker_id, item)
            except ApiError as exc:
                results.append(
                    ItemResult(label, exc.code, exc.message, item.topic_id, item.partition)
                )
                continue
            if change is not None:
                records.append(change)
            results.append(
                ItemResult(
                    label, topic_id=item.topic_id, partition=item.partition, partition_state=state
                )
            )
        return ControllerResult(records, results, atomic=False)

    def _alter_one(
        self, broker_id: int, item: AlterPartitionItem
    ) -> tuple[PartitionChangeRecord | None, PartitionRegistration]:
        topic = self.state.image.topics.get(item.topic_id)
        p = topic.partition(item.partition) if topic is not None else None
        if topic is None or p is None:
            raise ApiError(
                Errors.UNKNOWN_TOPIC_OR_PARTITION,
                f"partition {item.partition} of topic id {item.topic_id} does not exist",
            )
        if p.leader != broker_id:
            raise ApiError(
                Errors.NOT_LEADER_OR_FOLLOWER,
                f"broker {broker_id} does not lead {topic.name}-{item.partition} "
                f"(the leader is {p.leader})",
            )
        if item.leader_epoch < p.leader_epoch:
            raise ApiError(
                Errors.FENCED_LEADER_EPOCH,
                f"leader epoch {item.leader_epoch} is older than the partition's {p.leader_epoch}",
            )
        if item.leader_epoch > p.leader_epoch:
            raise ApiError(
                Errors.UNKNOWN_LEADER_EPOCH,
                f"leader epoch {item.leader_epoch} is newer than the partition's {p.leader_epoch}",
            )
        if item.partition_epoch < p.partition_epoch:
            raise ApiError(
                Errors.INVALID_UPDATE_VERSION,
                f"partition epoch {item.partition_epoch} is older than the partition's "
                f"{p.partition_epoch}",
            )
        if item.partition_epoch > p.partition_epoch:
            raise ApiError(
                Errors.UNKNOWN_PARTITION_EPOCH,
                f"partition epoch {item.partition_epoch} is newer than the partition's "
                f"{p.partition_epoch}",
            )
        new_isr = tuple(b for b, _ in item.new_isr)
        if len(set(new_isr)) != len(new_isr):
            raise ApiError(Errors.INVALID_REQUEST, f"the new ISR {list(new_isr)} repeats a broker")
        if broker_id not in new_isr:
            raise ApiError(
                Errors.INVALID_REQUEST, f"the new ISR {list(new_isr)} leaves out the leader"
            )
        outside = [b for b in new_isr if b not in p.replicas]
        if outside:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"the new ISR holds brokers {outside} that are not replicas {list(p.replicas)}",
            )
        # B8 (KIP-841, KIP-903 undone): no member's eligibility is checked.
        ineligible_ok = bugs.on(Bug.EXPAND_WITH_INELIGIBLE)
        for b, epoch in item.new_isr:
            reg = self.state.image.brokers.get(b)
            why = ""
            if reg is None:
                why = "is not registered"
            elif reg.fenced:
                why = "is fenced"
            elif reg.in_controlled_shutdown:
                why = "is shutting down"
            elif epoch != -1 and epoch != reg.epoch:
                why = f"has broker epoch {reg.epoch}, not {epoch}"
            if why and ineligible_ok:
                continue
            if why and b not in p.isr:
                raise ApiError(
                    Errors.INELIGIBLE_REPLICA, f"broker {b} {why}: it may not join the ISR"
                )
            if why and b in p.isr and reg is not None and reg.fenced:
                raise ApiError(
                    Errors.INELIGIBLE_REPLICA, f"broker {b} {why}: it may not stay in the ISR"
                )
        if (
            p.leader_recovery_state is LeaderRecoveryState.RECOVERING
            and len(new_isr) > 1
            and not item.leader_recovered
        ):
            raise ApiError(
                Errors.INVALID_REQUEST,
                "a RECOVERING leader must report its log recovered before growing the ISR",
            )
        change = self._change(
            topic, item.partition, target_isr=new_isr, recovered=item.leader_recovered
        ).build()
        state = p.merge(change) if change is not None else p
        return change, state

    def elect_leaders(
        self, election: Election, partitions: Sequence[tuple[str, int]] | None
    ) -> ControllerResult[list[ItemResult]]:
        """Admin elections (kafka-leader-election.sh); ``None``: every
        partition."""
        if election is Election.ONLINE:
            raise ApiError(Errors.INVALID_REQUEST, "an election is preferred or unclean")
        wanted: list[tuple[str, int]] = []
        if partitions is None:
            for t in sorted(self.state.image.topics.values(), key=lambda t: t.name):
                wanted.extend((t.name, i) for i in range(len(t.partitions)))
        else:
            wanted = list(partitions)
        results: list[ItemResult] = []
        records: list[Record] = []
        for name, i in wanted:
            label = f"{name}-{i}"
            topic = self.state.image.topic_by_name(name)
            p = topic.partition(i) if topic is not None else None
            if topic is None or p is None:
                results.append(
                    ItemResult(
                        label,
                        Errors.UNKNOWN_TOPIC_OR_PARTITION,
                        f"{label} does not exist",
                        partition=i,
                    )
                )
                continue
            error, message, change = self._elect_one(topic, i, p, election)
            if change is not None:
                records.append(change)
            if partitions is None and error is Errors.ELECTION_NOT_NEEDED:
                continue  # "all partitions" reports only what it did or could not do
            results.append(ItemResult(label, error, message, topic.topic_id, i))
        return ControllerResult(records, results, atomic=False)

    def _elect_one(
        self, topic: TopicImage, i: int, p: PartitionRegistration, election: Election
    ) -> tuple[Errors, str, PartitionChangeRecord | None]:
        if election is Election.PREFERRED:
            preferred = p.preferred_leader
            if p.leader == preferred:
                return Errors.ELECTION_NOT_NEEDED, f"broker {preferred} already leads", None
            if preferred not in p.isr or not self.state.active(preferred):
                return (
                    Errors.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"preferred leader {preferred} is not an unfenced ISR member",
                    None,
                )
            change = self._change(topic, i, election=Election.PREFERRED).build()
            return Errors.NONE, "", change
        if p.has_leader:
            return Errors.ELECTION_NOT_NEEDED, f"broker {p.leader} leads", None
        change = self._change(topic, i, election=Election.UNCLEAN).build()
        if change is None or change.leader in (NO_LEADER, -2):
            return (
                Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                f"no replica of {list(p.replicas)} is unfenced",
                None,
            )
        return Errors.NONE, "", change

    def rebalance_leaders(self) -> ControllerResult[int]:
        """Automatic preferred-leader election, when on
        (``auto.leader.rebalance.enable``) and some broker's imbalance, the
        share of the partitions it prefers that it does not lead, passes
        ``leader.imbalance.per.broker.percentage``."""
        cluster = self.state.cluster_config()
        if not configs.as_bool(configs.effective("auto.leader.rebalance.enable", cluster=cluster)):
            return ControllerResult([], 0)
        threshold = configs.as_int(
            configs.effective("leader.imbalance.per.broker.percentage", cluster=cluster)
        )
        preferred: dict[int, int] = {}
        not_leading: dict[int, list[tuple[TopicImage, int, PartitionRegistration]]] = {}
        for topic, i, p in self.state.image.partitions():
            b = p.preferred_leader
            preferred[b] = preferred.get(b, 0) + 1
            if p.leader != b and b in p.isr and self.state.active(b):
                not_leading.setdefault(b, []).append((topic, i, p))
        records: list[Record] = []
        for b, parts in sorted(not_leading.items()):
            if 100 * len(parts) <= threshold * preferred[b]:
                continue
            for topic, i, _ in parts:
                if len(records) >= MAX_ELECTIONS_PER_REBALANCE:
                    break
                change = self._change(topic, i, election=Election.PREFERRED).build()
                if change is not None:
                    records.append(change)
        return ControllerResult(records, len(records), atomic=False)

    def alter_reassignments(
        self, items: Sequence[tuple[str, int, tuple[int, ...] | None]]
    ) -> ControllerResult[list[ItemResult]]:
        """Start (target replicas) or cancel (None) reassignments."""
        results: list[ItemResult] = []
        records: list[Record] = []
        brokers = {b.id: b for b in self.state.usable_brokers()}
        for name, i, target in items:
            label = f"{name}-{i}"
            topic = self.state.image.topic_by_name(name)
            p = topic.partition(i) if topic is not None else None
            try:
                if topic is None or p is None:
                    raise ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"{label} does not exist")
                change = self._reassign_one(topic, i, p, target, brokers)
            except ApiError as exc:
                results.append(ItemResult(label, exc.code, exc.message, partition=i))
                continue
            if change is not None:
                records.append(change)
            results.append(ItemResult(label, topic_id=topic.topic_id, partition=i))
        return ControllerResult(records, results, atomic=False)

    def _reassign_one(
        self,
        topic: TopicImage,
        i: int,
        p: PartitionRegistration,
        target: tuple[int, ...] | None,
        brokers: Mapping[int, UsableBroker],
    ) -> PartitionChangeRecord | None:
        if target is None:
            if not p.is_reassigning:
                raise ApiError(
                    Errors.NO_REASSIGNMENT_IN_PROGRESS, f"{topic.name}-{i} is not being reassigned"
                )
            original = tuple(r for r in p.replicas if r not in p.adding_replicas)
            isr = tuple(r for r in p.isr if r in original)
            if not isr:
                # Every ISR member is an added replica: going back is an
                # unclean election (Kafka's PartitionReassignmentRevert).
                if not self._unclean_allowed(topic):
                    raise ApiError(
                        Errors.INVALID_REPLICA_ASSIGNMENT,
                        f"cancelling the reassignment of {topic.name}-{i} needs an unclean "
                        f"leader election: no original replica {list(original)} is in the "
                        f"ISR {list(p.isr)}",
                    )
                isr = original[:1]
            return self._change(
                topic,
                i,
                target_replicas=original,
                target_isr=isr,
                target_adding=(),
                target_removing=(),
                bump_leader_epoch=True,
            ).build()
        validate_assignment([target], brokers)
        # A new target replaces one in progress: every current replica (the
        # old ones and those added so far) not in the new target goes.
        replicas, adding, removing = reassignment_replicas(p.replicas, target)
        if replicas == p.replicas and not adding and not removing and not p.is_reassigning:
            return None
        return self._change(
            topic,
            i,
            target_replicas=replicas,
            target_adding=adding,
            target_removing=removing,
        ).build()

    def list_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None = None
    ) -> list[tuple[str, int, PartitionRegistration]]:
        out = []
        for topic, i, p in self.state.image.partitions():
            if p.is_reassigning and (partitions is None or (topic.name, i) in partitions):
                out.append((topic.name, i, p))
        return sorted(out, key=lambda x: (x[0], x[1]))

    def elections_on_activation(self) -> list[Record]:
        """Elections a predecessor decided but lost in its failover (they
        are written apart from the unfencing that triggered them): every
        leaderless partition that an eligible ISR member (or, with the ISR
        empty, ELR member) can lead, or, with both empty, its last known
        leader (KIP-966)."""
        records: list[Record] = []
        last_known = self.state.options.use_last_known_leader
        for topic in self.state.image.topics.values():
            for i, p in enumerate(topic.partitions):
                eligible = p.isr or p.elr or (p.last_known_elr if last_known else ())
                if not p.has_leader and any(self.state.active(r) for r in eligible):
                    change = self._change(topic, i).build()
                    if change is not None:
                        records.append(change)
        return records
