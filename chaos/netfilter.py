"""Network faults between nodes that share a host's loopback, with iptables.

gRPC clients bind no source address, so every connection between local
nodes starts from 127.0.0.1 and addresses alone cannot tell the nodes
apart.  Each node therefore marks its packets with its own DSCP value
(``node.dscp``, on its server and on every channel it opens to another
node: Raft, a broker's calls to the controllers and its replica fetches),
and:

- in ``nat``, a chain ``<tag>`` hooked to POSTROUTING source-NATs each
  node's new connections on ``lo`` to the node's own address (DSCP value
  -> address), so replies to a node are addressed to that node;
- in ``filter``, a chain ``<tag>`` hooked to OUTPUT drops the packets of
  each blocked pair: those marked with a's DSCP value going to b's address
  (a's requests to b and a's answers to b's requests alike).  A packet
  fault (:meth:`Netfilter.packet`) matches the same way, drops at random
  (``-m statistic``) and sends the rest to a netfilter queue
  (``-j NFQUEUE --queue-bypass``) that :mod:`chaos.nfqueue` delays.

Packets without a mark (test clients) are never touched.  Healing flushes
the filter chain; :meth:`Netfilter.remove` deletes both chains and their
hooks.  Needs root and the ``iptables`` command (Debian: ``apt-get install
iptables``; ``scripts/bootstrap`` installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping

__all__ = [
    "IptablesChains",
    "Netfilter",
    "NetfilterError",
    "nfqueue_target",
    "random_match",
    "require_iptables",
]

INSTALL_HINT = (
    "partitions of the local backend need the iptables command: install it with "
    "`apt-get install iptables` (scripts/bootstrap does) and run as root"
)


class NetfilterError(RuntimeError):
    """iptables is missing, or a rule could not be added or removed."""


def _find() -> str | None:
    path = shutil.which("iptables")
    if path is None and os.access("/usr/sbin/iptables", os.X_OK):
        path = "/usr/sbin/iptables"
    return path


def require_iptables() -> str:
    """The path of ``iptables``; :class:`NetfilterError` naming how to
    install it if it is missing or unusable."""
    path = _find()
    if path is None:
        raise NetfilterError(f"no iptables command: {INSTALL_HINT}")
    probe = subprocess.run(
        [path, "-w", "-t", "nat", "-S", "POSTROUTING"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise NetfilterError(
            f"iptables does not work here ({probe.stderr.strip()}): {INSTALL_HINT}"
        )
    return path


def random_match(p: float) -> list[str]:
    """The match of a packet with probability ``p`` (none for 1)."""
    if not 0 < p <= 1:
        raise ValueError(f"a drop probability must be in (0, 1], got {p}")
    if p >= 1:
        return []
    return ["-m", "statistic", "--mode", "random", "--probability", f"{p:.6f}"]


def nfqueue_target(queue: int) -> list[str]:
    """Send to netfilter queue ``queue``; with ``--queue-bypass`` packets go
    on unqueued while no program listens (the delayer not started, or
    dead), so a fault can never outlive its delayer as an outage."""
    if not 0 <= queue <= 0xFFFF:
        raise ValueError(f"a queue number is in 0..65535, got {queue}")
    return ["-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]


class IptablesChains:
    """Rules in iptables chains of one's own, named ``tag`` (at most 28
    characters): the ``iptables`` command found on first use, and
    :meth:`_run` to call it."""

    def __init__(self, tag: str) -> None:
        if not 0 < len(tag) <= 28:
            raise ValueError(f"chain name {tag!r} must have 1..28 characters")
        self.tag = tag
        self._iptables: str | None = None
        self._installed = False

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``iptables -w args``; :class:`NetfilterError` if it fails and
        ``check``."""
        if self._iptables is None:
            self._iptables = require_iptables()
        done = subprocess.run(
            [self._iptables, "-w", *args], capture_output=True, text=True, check=False
        )
        if check and done.returncode != 0:
            raise NetfilterError(f"iptables {' '.join(args)}: {done.stderr.strip()}")
        return done


class Netfilter(IptablesChains):
    """The rules of one cluster, in chains named ``tag`` (at most 28
    characters) of the filter and nat tables."""

    def install(self, sources: Mapping[int, str]) -> None:
        """Create the chains: SNAT for each DSCP value -> host address, and
        an empty filter chain (nothing blocked).  Replaces earlier rules of
        this tag."""
        self.remove()
        self._installed = True
        t = self.tag
        self._run("-t", "nat", "-N", t)
        for dscp, host in sorted(sources.items()):
            if not 1 <= dscp <= 63:
                raise ValueError(f"DSCP value must be in 1..63, got {dscp}")
            self._run(
                "-t", "nat", "-A", t, "-o", "lo", "-p", "tcp",
                "-m", "dscp", "--dscp", str(dscp),
                "-j", "SNAT", "--to-source", host,
            )  # fmt: skip
        self._run("-t", "nat", "-I", "POSTROUTING", "1", "-o", "lo", "-j", t)
        self._run("-N", t)
        self._run("-I", "OUTPUT", "1", "-o", "lo", "-j", t)

    def block(self, drops: Iterable[tuple[int, str]]) -> None:
        """Drop exactly these: packets marked with DSCP value ``d`` going to
        host ``h`` for each ``(d, h)``; nothing else."""
        if not self._installed:
            raise NetfilterError("the rules are not installed")
        self._run("-F", self.tag)
        for dscp, host in sorted(set(drops)):
            self._run(
                "-A", self.tag, "-o", "lo", "-d", host,
                "-m", "dscp", "--dscp", str(dscp), "-j", "DROP",
            )  # fmt: skip

    def packet(self, links: Iterable[tuple[int, str]], drop: float, queue: int | None) -> None:
        """Exactly these faults: of the packets marked with DSCP value ``d``
        going to host ``h``, for each ``(d, h)``, drop each with probability
        ``drop`` (0: none) and send the rest to netfilter queue ``queue``
        (``None``: none)."""
        if not self._installed:
            raise NetfilterError("the rules are not installed")
        self._run("-F", self.tag)
        for dscp, host in sorted(set(links)):
            match = ["-o", "lo", "-d", host, "-m", "dscp", "--dscp", str(dscp)]
            if drop > 0:
                self._run("-A", self.tag, *match, *random_match(drop), "-j", "DROP")
            if queue is not None:
                self._run("-A", self.tag, *match, *nfqueue_target(queue))

    def heal(self) -> None:
        """Drop nothing."""
        if self._installed:
            self._run("-F", self.tag)

    def remove(self) -> None:
        """Delete both chains and their hooks (whatever of them exists)."""
        if _find() is None:
            self._installed = False
            return
        t = self.tag
        for table, hook in (("filter", "OUTPUT"), ("nat", "POSTROUTING")):
            while (
                self._run("-t", table, "-D", hook, "-o", "lo", "-j", t, check=False).returncode == 0
            ):
                pass
            self._run("-t", table, "-F", t, check=False)
            self._run("-t", table, "-X", t, check=False)
        self._installed = False

    def leftovers(self) -> list[str]:
        """Rules of both tables that name this tag (none after :meth:`remove`)."""
        out = []
        for table in ("filter", "nat"):
            listing = self._run("-t", table, "-S", check=False).stdout
            out += [f"{table}: {line}" for line in listing.splitlines() if self.tag in line]
        return out
