"""The ``topics`` workload's final check (pure): :func:`check_final_metadata`.

The history's client ops name their target in ``key``: the topic of a
``create-topic`` or ``delete-topic``, the broker id (decimal) of a
``register-broker`` or ``heartbeat``.  Each topic name is created at most
once.  After the run, a linearizable read of the topics and the registered
brokers is compared with the history:

- a topic whose creation was ``ok`` and of which no delete was ``ok`` or
  ``info`` must exist (``lost-topic``);
- a topic that exists must have had a create invoked that did not ``fail``
  (``phantom-topic``), and no ``ok`` delete (``resurrected-topic``);
- a broker whose registration was ``ok`` must be registered
  (``lost-broker``), and a registered broker must have had a registration
  invoked that did not ``fail`` (``phantom-broker``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from chaos.ops import NEMESIS, Op

__all__ = ["MetadataProblem", "check_final_metadata"]


@dataclass(frozen=True, slots=True)
class MetadataProblem:
    """One disagreement of the final metadata with the history."""

    kind: str
    target: str
    message: str


def _outcomes(ops: Sequence[Op], f: str) -> dict[str, set[str]]:
    """Completion types of the ops ``f`` by key."""
    out: dict[str, set[str]] = {}
    for op in ops:
        if op.process != NEMESIS and op.f == f and op.key is not None:
            out.setdefault(op.key, set())
            if op.type != "invoke":
                out[op.key].add(op.type)
    return out


def check_final_metadata(
    ops: Sequence[Op], topics: Collection[str], brokers: Collection[int]
) -> list[MetadataProblem]:
    """What in the final ``topics`` and registered ``brokers`` the history
    ``ops`` cannot explain; empty if everything agrees."""
    out: list[MetadataProblem] = []
    created = _outcomes(ops, "create-topic")
    deleted = _outcomes(ops, "delete-topic")
    present = set(topics)
    for name in sorted(created):
        gone = deleted.get(name, set()) & {"ok", "info"}
        if "ok" in created[name] and not gone and name not in present:
            out.append(
                MetadataProblem("lost-topic", name, f"topic {name} was created ok but is missing")
            )
    for name in sorted(present):
        kinds = created.get(name)
        if kinds is None or kinds == {"fail"}:
            why = "no create of it was invoked" if kinds is None else "every create of it failed"
            out.append(MetadataProblem("phantom-topic", name, f"topic {name} exists but {why}"))
        elif "ok" in deleted.get(name, set()):
            out.append(
                MetadataProblem(
                    "resurrected-topic", name, f"topic {name} exists but was deleted ok"
                )
            )
    registered = _outcomes(ops, "register-broker")
    live = {str(b) for b in brokers}
    for broker in sorted(registered, key=_broker_order):
        if "ok" in registered[broker] and broker not in live:
            out.append(
                MetadataProblem(
                    "lost-broker", broker, f"broker {broker} registered ok but is not registered"
                )
            )
    for broker in sorted(live, key=_broker_order):
        kinds = registered.get(broker)
        if kinds is None or kinds == {"fail"}:
            why = "no registration was invoked" if kinds is None else "every registration failed"
            message = f"broker {broker} is registered but {why}"
            out.append(MetadataProblem("phantom-broker", broker, message))
    return out


def _broker_order(key: str) -> tuple[int, str]:
    return (int(key), key) if key.isdigit() else (-1, key)
