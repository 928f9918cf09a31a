"""Client workloads of the chaos harness: each drives a data model's
operations against a cluster's client addresses and records them as a
history (``docs/history-format.md``).

The runner drives every workload through :class:`Workload`: :meth:`run` for
the main phase, :meth:`final` after the final heal and recovery (the final
reads and the workload's check of them), :meth:`close`, and :attr:`stats`
for progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["FinalVerdict", "Workload", "WorkloadStats"]


@dataclass
class WorkloadStats:
    """What a run did: invokes and completions by type, and retirements."""

    invokes: int = 0
    completions: dict[str, int] = field(default_factory=lambda: {"ok": 0, "fail": 0, "info": 0})
    retired: int = 0


@dataclass(frozen=True, slots=True)
class FinalVerdict:
    """What a workload's final phase found.  ``event`` is a line for the
    harness log; ``check`` (if any) goes to ``summary.json`` as
    ``final_check``; ``ok`` is false if the check found problems (or could
    not be made)."""

    event: str
    check: dict[str, Any] | None = None
    ok: bool = True


class Workload(Protocol):
    """A workload as the runner drives it."""

    @property
    def stats(self) -> WorkloadStats: ...

    async def run(self, time_limit_s: float) -> object:
        """The main phase; returns when the time is up (ops still in flight
        are left for the recorder's close)."""
        ...

    async def final(self) -> FinalVerdict:
        """After the final heal and recovery: read the final state and check it."""
        ...

    async def close(self) -> None: ...
