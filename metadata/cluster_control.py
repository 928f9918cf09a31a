"""Brokers (Kafka's ClusterControlManager, KIP-631): registration,
heartbeats and sessions, fencing and unfencing, controlled shutdown,
unregistration.  A broker leaving or coming back moves partition
leaderships through :class:`~metadata.replication_control.ReplicationControl`.
Pure: decisions only."""

from __future__ import annotations

from metadata.control_state import ControlState
from metadata.errors import ApiError, Errors
from metadata.image import BrokerRegistration
from metadata.records import (
    BrokerRegistrationChangeRecord,
    Record,
    RegisterBrokerRecord,
    UnregisterBrokerRecord,
)
from metadata.replication_control import ReplicationControl
from metadata.requests import (
    MAX_RECORDS_PER_ATOMIC_OP,
    ControllerResult,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
)

__all__ = ["ClusterControl"]


class ClusterControl:
    """Decides on :class:`ControlState`'s image; changes nothing."""

    def __init__(self, state: ControlState, replication: ReplicationControl) -> None:
        self.state = state
        self.replication = replication

    def register_broker(self, req: RegisterRequest, now_ms: int) -> ControllerResult[int]:
        if req.cluster_id != self.state.options.cluster_id:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"broker {req.broker_id} belongs to cluster {req.cluster_id!r}, "
                f"this is cluster {self.state.options.cluster_id!r}",
            )
        if req.broker_id < 0:
            raise ApiError(Errors.INVALID_REQUEST, f"broker id {req.broker_id} is negative")
        if not req.incarnation_id:
            raise ApiError(Errors.INVALID_REQUEST, "a registration needs an incarnation id")
        supported = {f.name: f for f in req.features}
        for name, level in sorted(self.state.image.features.items()):
            f = supported.get(name)
            if f is None or not f.min_level <= level <= f.max_level:
                offered = f"{f.min_level}..{f.max_level}" if f else "nothing"
                raise ApiError(
                    Errors.UNSUPPORTED_VERSION,
                    f"broker {req.broker_id} supports {name} {offered}; the cluster's "
                    f"finalized level is {level}",
                )
        for other in self.state.image.brokers.values():
            shared = set(other.log_dirs) & set(req.log_dirs)
            if other.broker_id != req.broker_id and shared:
                # A copied disk, or two brokers on one directory: a log
                # directory belongs to one broker (KIP-858).
                raise ApiError(
                    Errors.INVALID_REQUEST,
                    f"broker {req.broker_id} names log directories {sorted(shared)} that "
                    f"broker {other.broker_id} registered",
                )
        records: list[Record] = []
        old = self.state.image.brokers.get(req.broker_id)
        if old is not None:
            # Only a session this controller heard the old incarnation on
            # refuses the new one; one granted when it took over does not
            # (a whole cluster restarted: every broker comes back at once).
            if old.incarnation_id != req.incarnation_id and self.state.heartbeats.is_heard_alive(
                req.broker_id, now_ms
            ):
                raise ApiError(
                    Errors.DUPLICATE_BROKER_REGISTRATION,
                    f"broker {req.broker_id} is registered by another incarnation "
                    f"({old.incarnation_id}) whose session is still alive",
                )
            # The old registration ends: it leaves every ISR and leadership.
            # Without its previous broker epoch the broker did not shut down
            # cleanly and may have lost its unsynced tail: it leaves every
            # ELR too (KIP-966; Kafka's ClusterControlManager.registerBroker
            # and ReplicationControlManager.handleBrokerUncleanShutdown).
            unclean = req.previous_broker_epoch != old.epoch
            records.extend(
                self.replication.remove_broker_from_partitions(
                    req.broker_id, unclean_shutdown=unclean
                )
            )
        else:
            # No registration to match: an unregistered broker coming back
            # (its disks may be new) is unclean too, as in Kafka; it is no
            # longer in any ISR, but may still be in ELRs.
            records.extend(
                self.replication.remove_broker_from_partitions(req.broker_id, unclean_shutdown=True)
            )
        epoch = self.state.next_offset + len(records)
        records.append(
            RegisterBrokerRecord(
                req.broker_id,
                epoch,
                req.incarnation_id,
                req.endpoints,
                req.rack,
                req.features,
                fenced=True,
                log_dirs=tuple(sorted(req.log_dirs)),
            )
        )
        if len(records) > MAX_RECORDS_PER_ATOMIC_OP:
            raise ApiError(
                Errors.THROTTLING,
                f"re-registering broker {req.broker_id} needs {len(records)} records; "
                "fence it first",
            )
        self.state.heartbeats.touch(req.broker_id, now_ms)
        return ControllerResult(records, epoch)

    def heartbeat(self, req: HeartbeatRequest, now_ms: int) -> ControllerResult[HeartbeatResponse]:
        b = self.state.broker(req.broker_id, req.broker_epoch)
        self.state.heartbeats.touch(req.broker_id, now_ms, req.current_metadata_offset)
        caught_up = req.current_metadata_offset >= b.epoch
        records: list[Record] = []
        fenced, shutting_down, shut_down = b.fenced, b.in_controlled_shutdown, False
        if req.want_shutdown:
            # Controlled shutdown in two steps (KIP-631): first the broker
            # is marked shutting down and its leaderships and ISR places go
            # to others; once that has committed and it leads nothing, the
            # next heartbeat fences it and tells it to go.
            if b.fenced:
                shut_down = True  # leads nothing already
            elif not b.in_controlled_shutdown:
                records.append(
                    BrokerRegistrationChangeRecord(
                        b.broker_id, b.epoch, in_controlled_shutdown=True
                    )
                )
                records.extend(
                    self.state.after(
                        records, lambda: self.replication.remove_broker_from_partitions(b.broker_id)
                    )
                )
                shutting_down = True
            elif not self._leads_anything(b.broker_id):
                # _fence also takes it out of any ISR it is still in (step
                # 1's changes may have been lost with a failover while its
                # flag committed).
                records.extend(self._fence(b))
                fenced, shutting_down, shut_down = True, False, True
            else:
                # Still leads (a leadership came back meanwhile): move again.
                records.extend(self.replication.remove_broker_from_partitions(b.broker_id))
        elif req.want_fence:
            if not b.fenced:
                records.extend(self._fence(b))
                fenced, shutting_down = True, False
        elif b.fenced and caught_up:
            records.append(BrokerRegistrationChangeRecord(b.broker_id, b.epoch, fenced=False))
            fenced = False
            # Replay the unfence into a scratch view so elections see it.
            records.extend(
                self.state.after(records, lambda: self.replication.elect_leaderless(b.broker_id))
            )
        return ControllerResult(
            records,
            HeartbeatResponse(caught_up, fenced, shutting_down, shut_down),
            atomic=False,
        )

    def _leads_anything(self, broker_id: int) -> bool:
        return any(p.leader == broker_id for _, _, p in self.state.image.partitions())

    def _fence(self, b: BrokerRegistration) -> list[Record]:
        records = self.replication.remove_broker_from_partitions(b.broker_id)
        records.append(
            BrokerRegistrationChangeRecord(
                b.broker_id,
                b.epoch,
                fenced=True,
                in_controlled_shutdown=False if b.in_controlled_shutdown else None,
            )
        )
        return records

    def fence_expired(self, now_ms: int, limit: int = 1) -> ControllerResult[list[int]]:
        """Fence up to ``limit`` brokers whose session passed (Kafka fences
        one per check, so a stalled controller cannot fence everyone at
        once)."""
        live = [b.broker_id for b in self.state.image.brokers.values() if not b.fenced]
        expired = self.state.heartbeats.expired(live, now_ms)[:limit]
        records: list[Record] = []
        for broker_id in expired:

            def fence(b: int = broker_id) -> list[Record]:
                return self._fence(self.state.image.brokers[b])

            records.extend(self.state.after(records, fence))
        return ControllerResult(records, expired, atomic=False)

    def unregister_broker(self, broker_id: int) -> ControllerResult[None]:
        b = self.state.broker(broker_id)
        records = self.replication.remove_broker_from_partitions(broker_id)
        records.append(UnregisterBrokerRecord(broker_id, b.epoch))
        self.state.heartbeats.remove(broker_id)
        return ControllerResult(records, None, atomic=False)
