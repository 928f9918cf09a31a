"""Failover by partition: cut the leader off with iptables, with no
connection error for anyone to react to, and time from the cut to the first
commit of a write sent after it to the other members.

Every member of a local cluster talks from 127.0.0.1 (a client binds no
source address, so a loopback connection starts from 127.0.0.1 whatever
address it goes to), so addresses alone cannot tell a member's own packets
from its peers'.  The cut is made of the member's process and its
listening ports instead:

- the member's process is moved into a cgroup of its own (cgroup v2), and
  in ``mangle`` every packet it sends marks its connection (``CONNMARK``);
- in ``filter``, the packets it sends (``-m cgroup --path``), every packet
  of a connection it has sent on (``-m connmark``: its peers' answers on
  connections it opened), and every packet to or from its listening ports
  and the ports of the connections it had when cut (``ss``: a socket keeps
  the cgroup it was made in) are dropped.

Everything is in chains of this module's own (``KQ-BENCH-CUT``) hooked to
OUTPUT (on loopback every packet passes OUTPUT once); :meth:`Cut.heal`
removes the hooks and the chains, moves the process back and removes the
cgroup, and runs on every exit path (``with``).  Needs root, the
``iptables`` command with the cgroup and connmark matches, and a writable
cgroup v2 hierarchy: :func:`check` says which is missing, and the workload
is skipped with that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

__all__ = [
    "CHAIN",
    "Cut",
    "PartitionTarget",
    "PartitionTrial",
    "PartitionUnavailable",
    "check",
    "leftover_rules",
    "partition",
    "socket_ports",
    "partition_trial",
]

CHAIN = "KQ-BENCH-CUT"
MARK = "0x4b51"


class PartitionUnavailable(RuntimeError):
    """This machine cannot cut a local member off (the reason says why)."""


def _iptables() -> str | None:
    path = shutil.which("iptables")
    if path is None and os.access("/usr/sbin/iptables", os.X_OK):
        path = "/usr/sbin/iptables"
    return path


def _cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` or, on a
    hybrid host, ``/sys/fs/cgroup/unified``)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


def _run(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, "-w", *args], capture_output=True, text=True, timeout=30, check=False
    )


def check() -> tuple[str, Path]:
    """The iptables binary and the cgroup v2 root, after trying a rule of
    each kind this module uses; :class:`PartitionUnavailable` naming what
    is missing otherwise."""
    if os.geteuid() != 0:
        raise PartitionUnavailable("cutting a member off needs root (iptables, cgroups)")
    binary = _iptables()
    if binary is None:
        raise PartitionUnavailable(
            "no iptables command (apt-get install iptables; scripts/bootstrap installs it)"
        )
    root = _cgroup2_root()
    if root is None or not os.access(root, os.W_OK):
        raise PartitionUnavailable("no writable cgroup v2 hierarchy in /proc/mounts")
    probe = f"kq-bench-probe-{uuid.uuid4().hex[:8]}"
    group = root / probe
    try:
        group.mkdir()
    except OSError as exc:
        raise PartitionUnavailable(f"cannot make a cgroup in {root}: {exc}") from None
    chain = f"KQ-PROBE-{uuid.uuid4().hex[:6]}"
    try:
        made = _run(binary, "-N", chain)
        if made.returncode != 0:
            raise PartitionUnavailable(f"iptables cannot make a chain: {made.stderr.strip()}")
        for rule in (
            ["-m", "cgroup", "--path", probe, "-j", "DROP"],
            ["-m", "connmark", "--mark", MARK, "-j", "DROP"],
        ):
            added = _run(binary, "-A", chain, *rule)
            if added.returncode != 0:
                raise PartitionUnavailable(
                    f"iptables refuses a rule ({' '.join(rule)}): {added.stderr.strip()}"
                )
    finally:
        _run(binary, "-F", chain)
        _run(binary, "-X", chain)
        with contextlib.suppress(OSError):
            group.rmdir()
    return binary, root


class Cut:
    """The cut of one member (``with Cut(pid, ports): ...``): made on
    entry, removed on exit whatever happened."""

    def __init__(self, pid: int, ports: Sequence[int], host: str = "127.0.0.1") -> None:
        self.binary, self.root = check()
        self.pid = pid
        self.ports = list(ports)
        self.host = host
        self.group = self.root / f"kq-bench-cut-{pid}"
        self._hooked: list[tuple[str, str]] = []
        self._chains: list[tuple[str, str]] = []

    def _must(self, *args: str) -> None:
        done = _run(self.binary, *args)
        if done.returncode != 0:
            raise RuntimeError(f"iptables {' '.join(args)}: {done.stderr.strip()}")

    def __enter__(self) -> Cut:
        try:
            self.make()
        except BaseException:
            self.heal()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.heal()

    def make(self) -> None:
        self.group.mkdir(exist_ok=True)
        path = self.group.name
        for table in ("mangle", "filter"):
            self._must("-t", table, "-N", CHAIN)
            self._chains.append((table, CHAIN))
        self._must("-t", "mangle", "-A", CHAIN, "-m", "cgroup", "--path", path,
                   "-j", "CONNMARK", "--set-mark", MARK)  # fmt: skip
        self._must("-t", "filter", "-A", CHAIN, "-m", "cgroup", "--path", path, "-j", "DROP")
        self._must("-t", "filter", "-A", CHAIN, "-m", "connmark", "--mark", MARK, "-j", "DROP")
        # Its listening ports and the ports of every TCP socket it has now
        # (a socket keeps the cgroup it was made in, so the connections it
        # opened before the move are matched by port), both directions.
        for port in sorted({*self.ports, *socket_ports(self.pid)}):
            for way in ("--dport", "--sport"):
                self._must("-t", "filter", "-A", CHAIN, "-p", "tcp", "-d", self.host,
                           way, str(port), "-j", "DROP")  # fmt: skip
        # The rules are in place before the process moves: from its first
        # packet in the group on, nothing of it gets through.
        for table in ("mangle", "filter"):
            self._must("-t", table, "-I", "OUTPUT", "-j", CHAIN)
            self._hooked.append((table, CHAIN))
        (self.group / "cgroup.procs").write_text(str(self.pid))

    def heal(self) -> None:
        """Remove everything :meth:`make` did (what of it was done)."""
        errors: list[str] = []
        for table, chain in reversed(self._hooked):
            done = _run(self.binary, "-t", table, "-D", "OUTPUT", "-j", chain)
            if done.returncode != 0:
                errors.append(done.stderr.strip())
        self._hooked.clear()
        for table, chain in reversed(self._chains):
            _run(self.binary, "-t", table, "-F", chain)
            done = _run(self.binary, "-t", table, "-X", chain)
            if done.returncode != 0:
                errors.append(done.stderr.strip())
        self._chains.clear()
        if self.group.exists():
            with contextlib.suppress(OSError, ProcessLookupError):
                (self.root / "cgroup.procs").write_text(str(self.pid))
            with contextlib.suppress(OSError):
                self.group.rmdir()
        # Connections marked during the cut keep their mark, harmless once
        # the rule that dropped them is gone.
        if errors:
            raise RuntimeError("could not remove every rule of the cut: " + "; ".join(errors))


def socket_ports(pid: int) -> set[int]:
    """The local ports of the TCP sockets of process ``pid`` (``ss``)."""
    ss = shutil.which("ss")
    if ss is None:
        raise PartitionUnavailable("no ss command (iproute2) to list a member's connections")
    listed = subprocess.run(
        [ss, "-tanpH"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    ports = set()
    for line in listed.splitlines():
        if f"pid={pid}," not in line:
            continue
        fields = line.split()
        if len(fields) >= 4:
            port = fields[3].rsplit(":", 1)[-1]
            if port.isdigit():
                ports.add(int(port))
    return ports


def leftover_rules() -> list[str]:
    """Hooks of :data:`CHAIN` still in OUTPUT (none after a heal)."""
    binary = _iptables()
    if binary is None:
        return []
    out = []
    for table in ("mangle", "filter"):
        listed = _run(binary, "-t", table, "-S", "OUTPUT")
        out += [line for line in listed.stdout.splitlines() if CHAIN in line]
    return out


class PartitionTarget(Protocol):
    """What a target offers for partition trials (besides harness.Target)."""

    name: str

    async def leader_member(self) -> tuple[int, int, list[int]]:
        """The leader: its member index, pid and listening ports."""
        ...

    async def put_to_others(self, member: int, key: bytes, value: bytes, timeout: float) -> None:
        """Write ``key`` through each member but ``member`` at once; return
        when one commits it, raise if none does."""
        ...

    async def wait_healed(self) -> None:
        """Wait until every member is healthy and caught up again."""
        ...


@dataclass(frozen=True, slots=True)
class PartitionTrial:
    trial: int
    isolated_pid: int
    recovered: bool
    # Cut to the commit of the first write sent after the cut.
    recovery_s: float | None


async def partition_trial(
    target: PartitionTarget,
    trial: int,
    *,
    settle_s: float,
    probe_interval_s: float,
    request_timeout_s: float,
    max_wait_s: float,
    clock: Callable[[], float],
) -> PartitionTrial:
    await asyncio.sleep(settle_s)
    member, pid, ports = await target.leader_member()
    first: list[float] = []
    done = asyncio.Event()
    probes: set[asyncio.Task[None]] = set()

    async def probe(seq: int, t_cut: float) -> None:
        t0 = clock()
        with contextlib.suppress(Exception):
            await target.put_to_others(
                member, f"cut/{trial}/{seq}".encode(), b"x" * 100, request_timeout_s
            )
            t1 = clock()
            if t0 >= t_cut:
                first.append(t1)
                done.set()

    cut = Cut(pid, ports)
    with cut:
        t_cut = clock()
        seq = 0
        deadline = t_cut + max_wait_s
        while not done.is_set() and clock() < deadline:
            task = asyncio.create_task(probe(seq, t_cut))
            probes.add(task)
            task.add_done_callback(probes.discard)
            seq += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), probe_interval_s)
        for task in list(probes):
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
    await target.wait_healed()
    recovery = min(first) - t_cut if first else None
    return PartitionTrial(trial, pid, recovery is not None, recovery)


async def partition(
    target: PartitionTarget,
    trials: int,
    summary: Callable[[Sequence[float]], dict[str, Any]],
    clock: Callable[[], float],
    log: Callable[[str], None] | None = None,
    *,
    settle_s: float = 1.0,
    probe_interval_s: float = 0.01,
    request_timeout_s: float = 2.0,
    max_wait_s: float = 30.0,
) -> dict[str, Any]:
    """``trials`` partition trials; ``{"skipped": reason}`` when this
    machine cannot cut a member off."""
    try:
        check()
    except PartitionUnavailable as exc:
        if log is not None:
            log(f"{target.name}: partition skipped: {exc}")
        return {"skipped": str(exc)}
    results: list[PartitionTrial] = []
    start = clock()
    for i in range(trials):
        trial = await partition_trial(
            target,
            i,
            settle_s=settle_s,
            probe_interval_s=probe_interval_s,
            request_timeout_s=request_timeout_s,
            max_wait_s=max_wait_s,
            clock=clock,
        )
        results.append(trial)
        if log is not None:
            shown = (
                "no recovery" if trial.recovery_s is None else f"{trial.recovery_s * 1e3:.0f} ms"
            )
            log(f"partition trial {i + 1}/{trials}: {shown}")
    times = [t.recovery_s for t in results if t.recovery_s is not None]
    return {
        "trials": len(results),
        "recovered": len(times),
        "failed": len(results) - len(times),
        "seconds": clock() - start,
        **summary(times),
        "trial_results": [asdict(t) for t in results],
    }
