"""Verdicts: what every check returns, and how checks combine into one.

A check's verdict is three-valued, as Jepsen's and Knossos' are: ``True`` (the
history is valid under that check), ``False`` (an anomaly was found, and it
comes with a witness) or ``"unknown"`` (the check ran out of its budget, or had
nothing it could decide).  Combining: any ``False`` makes the whole ``False``;
otherwise any ``"unknown"`` makes it ``"unknown"``; otherwise ``True``.

The JSON written by ``kq verify --json`` (``verdict.json``) is built from these
types; ``docs/verification.md`` defines every field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Validity = bool | Literal["unknown"]

UNKNOWN: Literal["unknown"] = "unknown"

# How many anomalies a check keeps in full (with witnesses); the rest are
# counted only.  A history with a systematic fault has millions of them.
MAX_ANOMALIES = 100


def combine(validities: Iterable[Validity]) -> Validity:
    """False beats unknown beats true; no check at all is ``True``."""
    out: Validity = True
    for v in validities:
        if v is False:
            return False
        if v == UNKNOWN:
            out = UNKNOWN
    return out


def validity_from_json(value: object) -> Validity:
    if value is True or value is False or value == UNKNOWN:
        return value
    raise ValueError(f"a verdict's valid must be true, false or 'unknown', not {value!r}")


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One violation, with the smallest evidence that shows it.

    ``witness`` holds history operations (as their JSON objects, invoke and
    completion merged; see ``docs/verification.md``) or node-export lines.
    """

    check: str
    kind: str
    message: str
    run: str | None = None
    key: str | None = None
    node: int | None = None
    witness: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.check, "kind": self.kind, "message": self.message}
        if self.run is not None:
            out["run"] = self.run
        if self.key is not None:
            out["key"] = self.key
        if self.node is not None:
            out["node"] = self.node
        out["witness"] = [dict(w) for w in self.witness]
        return out


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The verdict of one check over every run verified together.

    ``count`` is the number of anomalies found; ``anomalies`` the first
    ``MAX_ANOMALIES`` of them in full.  ``detail`` holds check-specific
    counters (keys checked, records compared, ...).
    """

    name: str
    valid: Validity
    count: int = 0
    anomalies: tuple[Anomaly, ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "count": self.count,
            "anomalies": [a.to_json() for a in self.anomalies],
            "detail": dict(self.detail),
        }


def result_of(
    name: str,
    anomalies: Iterable[Anomaly],
    *,
    count: int | None = None,
    unknown: bool = False,
    detail: Mapping[str, Any] | None = None,
) -> CheckResult:
    """A check's result from its anomalies: ``False`` if any, else ``unknown`` or ``True``.

    ``count`` is the total when ``anomalies`` is only the first few of them.
    """
    kept = tuple(anomalies)[:MAX_ANOMALIES]
    total = len(kept) if count is None else count
    if total < len(kept):
        raise ValueError(f"{name}: count {total} is less than the {len(kept)} anomalies given")
    valid: Validity = False if total else (UNKNOWN if unknown else True)
    return CheckResult(name, valid, total, kept, dict(detail or {}))
