"""A packet delayer on a netfilter queue, in pure Python (standard library only).

Where the kernel has no ``sch_netem`` qdisc, the chaos backends delay
packets by sending them to a netfilter queue (iptables ``-j NFQUEUE
--queue-num N --queue-bypass``) that this program serves: it binds the
queue over ``AF_NETLINK``/``NETLINK_NETFILTER``, receives each queued
packet's id (copy mode ``NFQNL_COPY_META``: no payload), holds it for a
delay drawn uniformly from ``[delay - jitter, delay + jitter]`` (never
negative) and then gives the kernel the verdict ``NF_ACCEPT`` for that id.
Verdicts may come in any order, so jitter reorders packets, as netem's
does.  With ``--drop P`` each packet is dropped (``NF_DROP``) with
probability ``P`` instead.  Packets are never duplicated: a verdict lets a
packet through once (``NF_REPEAT`` runs the same packet through the hook
again; it makes no copy), and a copy sent from user space would have to
be rebuilt from the payload and would be queued again.

Run it as its own process::

    python -m chaos.nfqueue --queue N --delay-ms D --jitter-ms J [--drop P] [--seed S]

It prints ``ready`` on stdout once the queue is bound, and on SIGTERM or
SIGINT accepts every packet it still holds (a queued packet whose socket
closes is dropped by the kernel), prints its counts on stderr and exits 0.
Bad flags exit 2 with a message; a queue it cannot bind (not root, or the
queue taken) exits 1.  The queue is bound with ``NFQA_CFG_F_FAIL_OPEN``:
when it is full, or a message cannot reach this process, the kernel
accepts the packet instead of dropping it.

:class:`Delayer` starts and stops such a process by its id, for the
backends.  The wire format is in pure functions (:func:`bind_messages`,
:func:`verdict_message`, :func:`parse_messages`, :func:`parse_packet`) and
the hold queue (:class:`HoldQueue`) is a heap keyed by release time, so
that both are tested without privileges.

Constants: Linux ``include/uapi/linux/netfilter/nfnetlink_queue.h``
(message types, attributes, commands, copy modes, config flags),
``include/uapi/linux/netfilter/nfnetlink.h`` (``NFNL_SUBSYS_QUEUE``,
``struct nfgenmsg``), ``include/uapi/linux/netlink.h`` (``NETLINK_NETFILTER``,
``struct nlmsghdr``, ``struct nlattr``, ``NLMSG_ERROR``) and
``include/uapi/linux/netfilter.h`` (``NF_DROP``, ``NF_ACCEPT``).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import heapq
import math
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Final

__all__ = [
    "NF_ACCEPT",
    "NF_DROP",
    "Delayer",
    "DelayerError",
    "HoldQueue",
    "NetlinkMessage",
    "Packet",
    "bind_messages",
    "draw_delay_s",
    "main",
    "parse_attrs",
    "parse_error",
    "parse_messages",
    "parse_packet",
    "queue_number",
    "verdict_message",
]

# include/uapi/linux/netlink.h
NETLINK_NETFILTER: Final = 12
NLM_F_REQUEST: Final = 0x1
NLM_F_ACK: Final = 0x4
NLMSG_ERROR: Final = 0x2
NLMSG_DONE: Final = 0x3
NLA_TYPE_MASK: Final = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
SOL_NETLINK: Final = 270  # include/linux/socket.h
NETLINK_NO_ENOBUFS: Final = 5
# include/uapi/linux/netfilter/nfnetlink.h
NFNL_SUBSYS_QUEUE: Final = 3
NFNETLINK_V0: Final = 0
# include/uapi/linux/netfilter/nfnetlink_queue.h
NFQNL_MSG_PACKET: Final = 0
NFQNL_MSG_VERDICT: Final = 1
NFQNL_MSG_CONFIG: Final = 2
NFQA_PACKET_HDR: Final = 1
NFQA_VERDICT_HDR: Final = 2
NFQNL_CFG_CMD_BIND: Final = 1
NFQNL_COPY_META: Final = 1
NFQA_CFG_CMD: Final = 1
NFQA_CFG_PARAMS: Final = 2
NFQA_CFG_QUEUE_MAXLEN: Final = 3
NFQA_CFG_MASK: Final = 4
NFQA_CFG_FLAGS: Final = 5
NFQA_CFG_F_FAIL_OPEN: Final = 1 << 0
# include/uapi/linux/netfilter.h
NF_DROP: Final = 0
NF_ACCEPT: Final = 1

_NLMSGHDR: Final = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host order)
_NFGENMSG: Final = struct.Struct("!BBH")  # family, version, res_id (big endian)
_NLATTR: Final = struct.Struct("=HH")  # len, type
_PACKET_HDR: Final = struct.Struct("!IHB")  # packet_id, hw_protocol, hook (packed)

MAX_QUEUE_LEN: Final = 16384
"""Packets the kernel queues for us before it accepts new ones unheld
(``NFQA_CFG_F_FAIL_OPEN``)."""


# -- the wire format -------------------------------------------------------------------


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, data: bytes) -> bytes:
    """One ``struct nlattr`` with its payload, padded to 4 bytes."""
    raw = _NLATTR.pack(_NLATTR.size + len(data), kind) + data
    return raw + b"\0" * (_align(len(raw)) - len(raw))


def _nfq_message(msg: int, queue: int, attrs: bytes, *, seq: int, flags: int) -> bytes:
    """An nfnetlink_queue message: ``nlmsghdr``, ``nfgenmsg`` (the queue
    number in ``res_id``, network order) and the attributes."""
    if not 0 <= queue <= 0xFFFF:
        raise ValueError(f"a queue number is in 0..65535, got {queue}")
    body = _NFGENMSG.pack(socket.AF_UNSPEC, NFNETLINK_V0, queue) + attrs
    kind = (NFNL_SUBSYS_QUEUE << 8) | msg
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def bind_messages(queue: int, *, seq: int = 1) -> list[bytes]:
    """The config messages that bind ``queue`` (``NFQNL_CFG_CMD_BIND``), ask
    for metadata only (``NFQNL_COPY_META``), raise its length to
    :data:`MAX_QUEUE_LEN` and make it fail open; each asks for an ack
    (sequence numbers from ``seq``)."""
    config = NFQNL_MSG_CONFIG
    flags = NLM_F_REQUEST | NLM_F_ACK
    # struct nfqnl_msg_config_cmd {u8 command; u8 _pad; __be16 pf}
    bind = _attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, 0))
    # struct nfqnl_msg_config_params {__be32 copy_range; u8 copy_mode} __packed
    params = _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
    length = _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", MAX_QUEUE_LEN))
    fail_open = _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)) + _attr(
        NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)
    )
    return [
        _nfq_message(config, queue, bind, seq=seq, flags=flags),
        _nfq_message(config, queue, params + length, seq=seq + 1, flags=flags),
        _nfq_message(config, queue, fail_open, seq=seq + 2, flags=flags),
    ]


def verdict_message(queue: int, packet_id: int, verdict: int, *, seq: int = 0) -> bytes:
    """``NFQNL_MSG_VERDICT`` for one packet: ``struct nfqnl_msg_verdict_hdr
    {__be32 verdict; __be32 id}``."""
    if verdict not in (NF_DROP, NF_ACCEPT):
        raise ValueError(f"a verdict here is NF_DROP or NF_ACCEPT, got {verdict}")
    if not 0 <= packet_id <= 0xFFFFFFFF:
        raise ValueError(f"a packet id is a 32-bit number, got {packet_id}")
    hdr = _attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id))
    return _nfq_message(NFQNL_MSG_VERDICT, queue, hdr, seq=seq, flags=NLM_F_REQUEST)


@dataclass(frozen=True, slots=True)
class NetlinkMessage:
    """One netlink message: its header fields and the bytes after the header."""

    type: int
    flags: int
    seq: int
    payload: bytes


def parse_messages(data: bytes) -> list[NetlinkMessage]:
    """The netlink messages of one datagram; :class:`ValueError` for a
    truncated or malformed one."""
    out = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            raise ValueError(f"netlink message at byte {offset} has a bad length {length}")
        payload = data[offset + _NLMSGHDR.size : offset + length]
        out.append(NetlinkMessage(kind, flags, seq, payload))
        offset += _align(length)
    if offset < len(data) and any(data[offset:]):
        raise ValueError(f"{len(data) - offset} stray bytes after the last netlink message")
    return out


def parse_attrs(data: bytes) -> dict[int, bytes]:
    """The attributes of a message body, by type (flags masked off)."""
    out = {}
    offset = 0
    while offset + _NLATTR.size <= len(data):
        length, kind = _NLATTR.unpack_from(data, offset)
        if length < _NLATTR.size or offset + length > len(data):
            raise ValueError(f"netlink attribute at byte {offset} has a bad length {length}")
        out[kind & NLA_TYPE_MASK] = data[offset + _NLATTR.size : offset + length]
        offset += _align(length)
    return out


@dataclass(frozen=True, slots=True)
class Packet:
    """A queued packet: its queue, its id (for the verdict) and the
    netfilter hook it was queued at."""

    queue: int
    id: int
    hook: int


def parse_packet(message: NetlinkMessage) -> Packet | None:
    """The packet of an ``NFQNL_MSG_PACKET`` message (``None`` for any other
    message); :class:`ValueError` if it has no ``NFQA_PACKET_HDR``."""
    if message.type != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
        return None
    if len(message.payload) < _NFGENMSG.size:
        raise ValueError("an nfqueue packet message without its nfgenmsg header")
    _family, _version, queue = _NFGENMSG.unpack_from(message.payload)
    attrs = parse_attrs(message.payload[_NFGENMSG.size :])
    hdr = attrs.get(NFQA_PACKET_HDR)
    if hdr is None or len(hdr) < _PACKET_HDR.size:
        raise ValueError("an nfqueue packet message without NFQA_PACKET_HDR")
    packet_id, _proto, hook = _PACKET_HDR.unpack_from(hdr)
    return Packet(queue, packet_id, hook)


def parse_error(message: NetlinkMessage) -> int | None:
    """For an ``NLMSG_ERROR`` message, its errno (0: an ack); else ``None``."""
    if message.type != NLMSG_ERROR:
        return None
    if len(message.payload) < 4:
        raise ValueError("a netlink error message without its error code")
    (code,) = struct.unpack_from("=i", message.payload)
    return -code


def queue_number(tag: str) -> int:
    """A queue number for the cluster named ``tag``, in 1024..65535, so that
    clusters with different tags (almost surely) use different queues."""
    return 1024 + zlib.crc32(tag.encode()) % (65536 - 1024)


# -- the hold queue --------------------------------------------------------------------


def draw_delay_s(rng: random.Random, delay_ms: float, jitter_ms: float) -> float:
    """A delay in seconds, uniform in ``[delay - jitter, delay + jitter]``
    milliseconds and never negative."""
    return max(0.0, rng.uniform(delay_ms - jitter_ms, delay_ms + jitter_ms)) / 1000.0


@dataclass(slots=True)
class HoldQueue:
    """Packet ids held until their release times (any clock, seconds): a
    heap keyed by release time, ties in arrival order."""

    _heap: list[tuple[float, int, int]] = field(default_factory=list)
    _arrivals: int = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, packet_id: int, release_at: float) -> None:
        heapq.heappush(self._heap, (release_at, self._arrivals, packet_id))
        self._arrivals += 1

    def next_release(self) -> float | None:
        """When the next packet is due (``None``: nothing held)."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[int]:
        """Remove and return the ids due at ``now``, earliest first."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def drain(self) -> list[int]:
        """Remove and return every id held, earliest first."""
        return self.due(math.inf)


# -- the delayer process ---------------------------------------------------------------


def _bind(queue: int, timeout_s: float = 5.0) -> socket.socket:
    """A netlink socket bound to ``queue``; :class:`OSError` naming the
    problem if the kernel refuses (or does not answer)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        sock.bind((0, 0))
        # A message the kernel cannot deliver is a packet accepted unheld
        # (fail open), not a reason to fail our next recv.
        with contextlib.suppress(OSError):
            sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.settimeout(timeout_s)
        for message in bind_messages(queue):
            sock.send(message)
            seq = parse_messages(message)[0].seq
            code: int | None = None
            while code is None:
                answers = parse_messages(sock.recv(1 << 16))
                errors = [m for m in answers if m.type == NLMSG_ERROR and m.seq == seq]
                code = parse_error(errors[0]) if errors else None
            if code:
                raise OSError(code, f"binding netfilter queue {queue}: {os.strerror(code)}")
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class _Counts:
    held: int = 0
    dropped: int = 0
    accepted: int = 0
    errors: int = 0


def _serve(
    sock: socket.socket,
    wakeup: int,
    stopping: list[bool],
    queue: int,
    delay_ms: float,
    jitter_ms: float,
    drop: float,
    rng: random.Random,
    counts: _Counts,
) -> None:
    """Hold and release packets until ``stopping[0]`` (set by a signal
    handler, which also writes to the ``wakeup`` pipe so that select
    returns); then accept everything still held."""
    held = HoldQueue()

    def send(verdicts: Iterable[tuple[int, int]]) -> None:
        # Several messages may share one datagram; the kernel reads them in turn.
        batch = [verdict_message(queue, pid, v) for pid, v in verdicts]
        for i in range(0, len(batch), 64):
            sock.send(b"".join(batch[i : i + 64]))

    try:
        while not stopping[0]:
            due = held.due(time.monotonic())
            if due:
                send((pid, NF_ACCEPT) for pid in due)
                counts.accepted += len(due)
            nxt = held.next_release()
            timeout = None if nxt is None else max(0.0, nxt - time.monotonic())
            ready, _, _ = select.select([sock.fileno(), wakeup], [], [], timeout)
            if wakeup in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wakeup, 512)
            if sock.fileno() not in ready:
                continue
            try:
                data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    continue
                raise
            arrived = time.monotonic()
            drops = []
            for message in parse_messages(data):
                code = parse_error(message)
                if code:
                    counts.errors += 1
                    print(f"nfqueue: kernel error: {os.strerror(code)}", file=sys.stderr)
                packet = parse_packet(message)
                if packet is None:
                    continue
                if drop and rng.random() < drop:
                    drops.append((packet.id, NF_DROP))
                    continue
                held.push(packet.id, arrived + draw_delay_s(rng, delay_ms, jitter_ms))
                counts.held += 1
            if drops:
                send(drops)
                counts.dropped += len(drops)
    finally:
        # Let through what is still held: a held packet is dropped by the
        # kernel when this socket closes.
        rest = held.drain()
        with contextlib.suppress(OSError):
            send((pid, NF_ACCEPT) for pid in rest)
            counts.accepted += len(rest)


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    return value


def _probability(text: str) -> float:
    value = _number(text, "a probability in [0, 1]")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1], got {text}")
    return value


def _milliseconds(text: str) -> float:
    value = _number(text, "milliseconds in [0, 60000]")
    if not 0.0 <= value <= 60_000.0:
        raise argparse.ArgumentTypeError(f"must be milliseconds in [0, 60000], got {text}")
    return value


def _queue(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a queue number, got {text!r}") from None
    if not 0 <= value <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"must be a queue number in 0..65535, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos.nfqueue",
        description="Delay (and drop) the packets of a netfilter queue, then accept them.",
    )
    p.add_argument("--queue", type=_queue, required=True, help="the NFQUEUE --queue-num")
    p.add_argument("--delay-ms", type=_milliseconds, required=True, help="mean delay")
    p.add_argument(
        "--jitter-ms", type=_milliseconds, default=0.0, help="delays are uniform in delay±jitter"
    )
    p.add_argument("--drop", type=_probability, default=0.0, help="drop probability")
    p.add_argument("--seed", type=int, default=None, help="seed of the delays and drops")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # exits 2 with a message for bad flags
    counts = _Counts()
    stopping = [False]

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping[0] = True

    try:
        sock = _bind(args.queue)
    except OSError as exc:
        hint = " (binding a queue needs root: CAP_NET_ADMIN)" if exc.errno == errno.EPERM else ""
        print(f"nfqueue: cannot bind queue {args.queue}: {exc}{hint}", file=sys.stderr)
        return 1
    wakeup, wake = os.pipe()
    os.set_blocking(wakeup, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        print("ready", flush=True)
        rng = random.Random(args.seed)
        _serve(
            sock, wakeup, stopping, args.queue, args.delay_ms, args.jitter_ms, args.drop, rng,
            counts,
        )  # fmt: skip
    finally:
        sock.close()
    print(
        f"nfqueue: queue {args.queue}: held {counts.held}, dropped {counts.dropped}, "
        f"accepted {counts.accepted}, kernel errors {counts.errors}",
        file=sys.stderr,
    )
    return 0


# -- a delayer process, for the backends ---------------------------------------------


class DelayerError(RuntimeError):
    """The delayer did not start (its stderr says why)."""


class Delayer:
    """One ``python -m chaos.nfqueue`` process: :meth:`start` runs it and
    waits until its queue is bound; :meth:`stop` ends it by its process id
    (SIGTERM, so that it accepts what it holds; SIGKILL if it does not exit)."""

    def __init__(
        self, queue: int, delay_ms: float, jitter_ms: float = 0.0, drop: float = 0.0
    ) -> None:
        self.queue = queue
        self.args = [
            "--queue", str(queue), "--delay-ms", f"{delay_ms:g}",
            "--jitter-ms", f"{jitter_ms:g}", "--drop", f"{drop:g}",
        ]  # fmt: skip
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self.report = ""

    @property
    def pid(self) -> int | None:
        """The process id while it runs."""
        proc = self._proc
        return None if proc is None or proc.poll() is not None else proc.pid

    def start(self, timeout_s: float = 10.0) -> None:
        """Run the delayer; return once it said ``ready``.
        :class:`DelayerError` with its message if it exits or stays silent."""
        if self._proc is not None:
            raise RuntimeError("the delayer was started already")
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "chaos.nfqueue", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        line = self._proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.stop()
            raise DelayerError(
                f"the packet delayer on queue {self.queue} did not start: "
                f"{self.report or 'no answer within ' + format(timeout_s, 'g') + ' s'}"
            )

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the process (safe to call twice, and after a failed start);
        :attr:`report` is what it said on stderr."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.seek(0)
            self.report = self._stderr.read().decode(errors="replace").strip()
            self._stderr.close()
            self._stderr = None


if __name__ == "__main__":
    sys.exit(main())
