"""Broker sessions on the active controller: soft state, never logged.

Kafka's ``BrokerHeartbeatManager`` (KIP-631): the active controller notes
when it last heard from each broker; a broker whose session (default 9 s)
passes without a heartbeat is fenced.  Only the active controller keeps this;
a new one starts every registered broker on a fresh session when it takes
over (KAFKA-18138), so a failover never fences a live broker that simply
had not yet found the new controller.  Such a session is granted, not
heard: it keeps the broker from being fenced but does not make the broker
"alive" for a registration by another incarnation (:meth:`HeartbeatManager.is_heard_alive`).
Kafka's ``BrokerHeartbeatManager.hasValidSession`` gives no valid session to
a broker that was fenced when the controller took over (the brokers of a
whole cluster stopped under control are); kq counts no granted session at
all, so a killed broker's new incarnation also registers at once instead of
waiting out its predecessor's session (9 s) after a failover.  Time enters
as ``now_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BrokerSession", "HeartbeatManager"]


@dataclass(slots=True)
class BrokerSession:
    last_contact_ms: int
    # The metadata offset the broker last said it had applied.
    metadata_offset: int = -1
    # Whether this controller has heard from the broker (a registration or
    # a heartbeat), rather than granted the session when it took over.
    heard: bool = True


class HeartbeatManager:
    def __init__(self, session_timeout_ms: int) -> None:
        if session_timeout_ms <= 0:
            raise ValueError("the broker session timeout must be positive")
        self.session_timeout_ms = session_timeout_ms
        self._sessions: dict[int, BrokerSession] = {}

    def reset(self, broker_ids: list[int], now_ms: int) -> None:
        """Every broker gets a fresh session (a controller takes over), not
        yet heard from."""
        self._sessions = {b: BrokerSession(now_ms, heard=False) for b in broker_ids}

    def touch(self, broker_id: int, now_ms: int, metadata_offset: int = -1) -> None:
        session = self._sessions.get(broker_id)
        if session is None:
            self._sessions[broker_id] = BrokerSession(now_ms, metadata_offset)
        else:
            session.last_contact_ms = max(session.last_contact_ms, now_ms)
            session.metadata_offset = max(session.metadata_offset, metadata_offset)
            session.heard = True

    def remove(self, broker_id: int) -> None:
        self._sessions.pop(broker_id, None)

    def session(self, broker_id: int) -> BrokerSession | None:
        return self._sessions.get(broker_id)

    def is_alive(self, broker_id: int, now_ms: int) -> bool:
        session = self._sessions.get(broker_id)
        return session is not None and now_ms - session.last_contact_ms < self.session_timeout_ms

    def is_heard_alive(self, broker_id: int, now_ms: int) -> bool:
        """Whether this controller itself heard from the broker within the
        session timeout: what refuses another incarnation's registration
        (``ClusterControlManager.registerBroker``). A session granted on
        taking over does not count: the new controller has no evidence that
        the old incarnation still runs."""
        session = self._sessions.get(broker_id)
        return session is not None and session.heard and self.is_alive(broker_id, now_ms)

    def expired(self, broker_ids: list[int], now_ms: int) -> list[int]:
        """The brokers of ``broker_ids`` whose session has passed, oldest
        contact first (a broker with no session at all counts as expired)."""
        out = [b for b in broker_ids if not self.is_alive(b, now_ms)]
        out.sort(key=lambda b: (s.last_contact_ms if (s := self._sessions.get(b)) else -1, b))
        return out
