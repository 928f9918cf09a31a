"""The packet delayer's pure parts (chaos.nfqueue): the nfnetlink_queue wire
format against hand-built bytes, the hold queue, the delays, the flags, and
the serving loop over a socket pair standing in for the kernel (no
privileges needed)."""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from chaos import nfqueue
from chaos.nfqueue import (
    NF_ACCEPT,
    NF_DROP,
    Delayer,
    DelayerError,
    HoldQueue,
    NetlinkMessage,
    Packet,
    bind_messages,
    draw_delay_s,
    parse_attrs,
    parse_error,
    parse_messages,
    parse_packet,
    queue_number,
    verdict_message,
)

QUEUE_TYPE = 3 << 8  # NFNL_SUBSYS_QUEUE << 8


def nlmsg(kind: int, flags: int, seq: int, payload: bytes) -> bytes:
    """A netlink message built by hand: struct nlmsghdr in host order."""
    raw = struct.pack("=IHHII", 16 + len(payload), kind, flags, seq, 0) + payload
    return raw + b"\0" * (-len(raw) % 4)


def nla(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def kernel_packet(queue: int, packet_id: int, hook: int = 3) -> bytes:
    """An NFQNL_MSG_PACKET as the kernel sends it with NFQNL_COPY_META: the
    packet header, a mark and an interface (attributes it may add)."""
    body = struct.pack("!BBH", socket.AF_INET, 0, queue)
    body += nla(1, struct.pack("!IHB", packet_id, 0x0800, hook))  # NFQA_PACKET_HDR
    body += nla(3, struct.pack("!I", 7))  # NFQA_MARK
    body += nla(6, struct.pack("!I", 1))  # NFQA_IFINDEX_OUTDEV
    return nlmsg(QUEUE_TYPE | 0, 0, 0, body)


# -- the wire format ---------------------------------------------------------------------


def test_a_verdict_is_the_documented_bytes() -> None:
    message = verdict_message(7, 0x01020304, NF_ACCEPT, seq=9)
    assert message == (
        struct.pack("=IHHII", 32, 0x0301, 0x1, 9, 0)  # nlmsghdr: NFQNL_MSG_VERDICT, REQUEST
        + bytes([0, 0, 0, 7])  # nfgenmsg: AF_UNSPEC, NFNETLINK_V0, res_id 7 (big endian)
        + struct.pack("=HH", 12, 2)  # nlattr NFQA_VERDICT_HDR
        + bytes([0, 0, 0, 1, 1, 2, 3, 4])  # verdict NF_ACCEPT, id (big endian)
    )
    dropped = parse_messages(verdict_message(65535, 5, NF_DROP))[0]
    assert dropped.payload[2:4] == b"\xff\xff"
    assert parse_attrs(dropped.payload[4:]) == {2: struct.pack("!II", NF_DROP, 5)}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((70000, 1, NF_ACCEPT), "queue number"),
        ((-1, 1, NF_ACCEPT), "queue number"),
        ((1, 2**32, NF_ACCEPT), "packet id"),
        ((1, 1, 4), "NF_DROP or NF_ACCEPT"),  # NF_REPEAT is not a verdict we give
    ],
)
def test_bad_verdicts_are_refused(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verdict_message(*args)


def test_binding_asks_for_metadata_only_a_long_queue_and_failing_open() -> None:
    messages = [parse_messages(m) for m in bind_messages(300, seq=5)]
    assert [len(m) for m in messages] == [1, 1, 1]
    bind, params, flags = (m[0] for m in messages)
    for seq, m in enumerate((bind, params, flags), start=5):
        assert m.type == QUEUE_TYPE | 2  # NFQNL_MSG_CONFIG
        assert m.flags == 0x1 | 0x4  # NLM_F_REQUEST | NLM_F_ACK: errors come back
        assert m.seq == seq
        assert m.payload[:4] == bytes([0, 0, 1, 44])  # AF_UNSPEC, v0, queue 300
    # NFQA_CFG_CMD: NFQNL_CFG_CMD_BIND, pad, pf 0.
    assert parse_attrs(bind.payload[4:]) == {1: bytes([1, 0, 0, 0])}
    # NFQA_CFG_PARAMS (packed, 5 bytes: copy_range 0, NFQNL_COPY_META) and
    # NFQA_CFG_QUEUE_MAXLEN.
    assert parse_attrs(params.payload[4:]) == {
        2: bytes([0, 0, 0, 0, 1]),
        3: struct.pack("!I", nfqueue.MAX_QUEUE_LEN),
    }
    assert params.payload[4:8] == struct.pack("=HH", 9, 2)  # length before padding
    # NFQA_CFG_MASK and NFQA_CFG_FLAGS: NFQA_CFG_F_FAIL_OPEN.
    assert parse_attrs(flags.payload[4:]) == {4: struct.pack("!I", 1), 5: struct.pack("!I", 1)}


def test_packets_are_read_from_a_datagram_of_several_messages() -> None:
    ack = nlmsg(2, 0, 3, struct.pack("=i", 0) + b"\0" * 16)  # NLMSG_ERROR 0: an ack
    data = kernel_packet(12, 41) + kernel_packet(12, 0xFFFFFFFF, hook=1) + ack
    messages = parse_messages(data)
    assert [parse_packet(m) for m in messages] == [
        Packet(12, 41, 3),
        Packet(12, 0xFFFFFFFF, 1),
        None,
    ]
    assert [parse_error(m) for m in messages] == [None, None, 0]


def test_errors_attribute_flags_and_malformed_messages() -> None:
    eperm = NetlinkMessage(2, 0, 1, struct.pack("=i", -1) + b"\0" * 16)
    assert parse_error(eperm) == 1  # EPERM
    # NLA_F_NESTED and NLA_F_NET_BYTEORDER are flags of the type, not the type.
    assert parse_attrs(nla(0x8000 | 19, b"ab") + nla(0x4000 | 10, b"")) == {19: b"ab", 10: b""}
    with pytest.raises(ValueError, match="bad length"):
        parse_messages(kernel_packet(1, 1)[:-4])
    with pytest.raises(ValueError, match="bad length"):
        parse_attrs(struct.pack("=HH", 40, 1) + b"abcd")
    no_header = NetlinkMessage(QUEUE_TYPE, 0, 0, struct.pack("!BBH", 2, 0, 1) + nla(3, b"1234"))
    with pytest.raises(ValueError, match="NFQA_PACKET_HDR"):
        parse_packet(no_header)
    with pytest.raises(ValueError, match="nfgenmsg"):
        parse_packet(NetlinkMessage(QUEUE_TYPE, 0, 0, b"\x02"))


def test_queue_numbers_are_stable_per_cluster_and_in_range() -> None:
    tags = [f"KQ-DOCKER-{i:08x}" for i in range(200)]
    numbers = [queue_number(t) for t in tags]
    assert all(1024 <= n <= 65535 for n in numbers)
    assert numbers == [queue_number(t) for t in tags]
    assert len(set(numbers)) > 190


# -- the hold queue and the delays -----------------------------------------------------


def test_the_hold_queue_releases_by_time_not_arrival() -> None:
    held = HoldQueue()
    assert held.next_release() is None and held.due(100.0) == [] and len(held) == 0
    for packet_id, at in ((1, 5.0), (2, 1.0), (3, 3.0), (4, 1.0), (5, 9.0)):
        held.push(packet_id, at)
    assert held.next_release() == 1.0 and len(held) == 5
    assert held.due(0.5) == []
    assert held.due(1.0) == [2, 4]  # a tie keeps arrival order
    assert held.due(4.0) == [3]
    assert held.next_release() == 5.0
    assert held.drain() == [1, 5]
    assert len(held) == 0 and held.next_release() is None


def test_delays_are_uniform_within_the_jitter_and_never_negative() -> None:
    rng = random.Random(3)
    delays = [draw_delay_s(rng, 100, 20) for _ in range(2000)]
    assert all(0.080 <= d <= 0.120 for d in delays)
    assert min(delays) < 0.082 and max(delays) > 0.118  # the whole range is used
    wide = [draw_delay_s(rng, 10, 50) for _ in range(1000)]
    assert min(wide) == 0.0 and all(0.0 <= d <= 0.060 for d in wide)
    assert draw_delay_s(rng, 40, 0) == 0.040
    assert [draw_delay_s(random.Random(1), 50, 25) for _ in range(3)] == [
        draw_delay_s(random.Random(1), 50, 25) for _ in range(3)
    ]


# -- the serving loop, with a socket pair for the kernel -------------------------------


def _serve_in_thread(
    delay_ms: float, jitter_ms: float, drop: float
) -> tuple[socket.socket, threading.Thread, list[bool], int, nfqueue._Counts]:
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    wakeup, wake = os.pipe()
    stopping = [False]
    counts = nfqueue._Counts()
    rng = random.Random(0)
    thread = threading.Thread(
        target=nfqueue._serve,
        args=(ours, wakeup, stopping, 9, delay_ms, jitter_ms, drop, rng, counts),
    )
    thread.start()
    return kernel, thread, stopping, wake, counts


def _verdicts(kernel: socket.socket, n: int, timeout_s: float = 10.0) -> list[tuple[int, int]]:
    """(packet id, verdict) of the next ``n`` verdicts the loop sends."""
    kernel.settimeout(timeout_s)
    out: list[tuple[int, int]] = []
    while len(out) < n:
        for m in parse_messages(kernel.recv(1 << 16)):
            assert m.type == QUEUE_TYPE | 1 and m.payload[2:4] == b"\x00\x09"
            verdict, packet_id = struct.unpack("!II", parse_attrs(m.payload[4:])[2])
            out.append((packet_id, verdict))
    return out


def test_the_loop_accepts_each_packet_after_its_delay() -> None:
    kernel, thread, stopping, wake, counts = _serve_in_thread(50, 0, 0.0)
    try:
        sent = time.monotonic()
        kernel.send(kernel_packet(9, 1) + kernel_packet(9, 2))
        kernel.send(kernel_packet(9, 3))
        verdicts = _verdicts(kernel, 3)
        assert time.monotonic() - sent >= 0.050  # not before the delay
        assert sorted(verdicts) == [(1, NF_ACCEPT), (2, NF_ACCEPT), (3, NF_ACCEPT)]
    finally:
        stopping[0] = True
        os.write(wake, b"\0")
        thread.join(10)
    assert not thread.is_alive()
    assert (counts.held, counts.accepted, counts.dropped) == (3, 3, 0)


def test_the_loop_drops_with_probability_one_and_nothing_is_held() -> None:
    kernel, thread, stopping, wake, counts = _serve_in_thread(10_000, 0, 1.0)
    try:
        kernel.send(kernel_packet(9, 5) + kernel_packet(9, 6))
        assert _verdicts(kernel, 2) == [(5, NF_DROP), (6, NF_DROP)]
    finally:
        stopping[0] = True
        os.write(wake, b"\0")
        thread.join(10)
    assert (counts.held, counts.accepted, counts.dropped) == (0, 0, 2)


def test_stopping_accepts_every_packet_still_held() -> None:
    kernel, thread, stopping, wake, counts = _serve_in_thread(60_000, 0, 0.0)
    try:
        kernel.send(b"".join(kernel_packet(9, i) for i in range(1, 6)))
        deadline = time.monotonic() + 10
        while counts.held < 5:  # the loop has read them (they are held for a minute)
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        stopping[0] = True
        os.write(wake, b"\0")  # what the SIGTERM handler's wakeup fd does
        thread.join(10)
    assert not thread.is_alive()
    assert _verdicts(kernel, 5) == [(i, NF_ACCEPT) for i in range(1, 6)]
    assert (counts.held, counts.accepted) == (5, 5)


# -- the command line and the process ----------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--queue"),
        (["--queue", "1"], "--delay-ms"),
        (["--queue", "70000", "--delay-ms", "5"], "queue number in 0..65535"),
        (["--queue", "x", "--delay-ms", "5"], "must be a queue number"),
        (["--queue", "1", "--delay-ms", "-5"], "milliseconds"),
        (["--queue", "1", "--delay-ms", "nan"], "milliseconds"),
        (["--queue", "1", "--delay-ms", "5", "--jitter-ms", "fast"], "--jitter-ms"),
        (["--queue", "1", "--delay-ms", "5", "--drop", "1.5"], "probability"),
        (["--queue", "1", "--delay-ms", "5", "--seed", "s"], "--seed"),
    ],
)
def test_bad_flags_exit_2_naming_what_was_wrong(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        nfqueue.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_queue_that_cannot_be_bound_exits_1_saying_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(queue: int, timeout_s: float = 5.0) -> socket.socket:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(nfqueue, "_bind", refuse)
    assert nfqueue.main(["--queue", "3", "--delay-ms", "5"]) == 1
    err = capsys.readouterr().err
    assert "cannot bind queue 3" in err and "needs root" in err


def test_the_module_runs_as_a_program() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "chaos.nfqueue", "--queue", "1", "--delay-ms", "5", "--drop", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--drop: must be a probability" in done.stderr


def test_a_delayer_that_does_not_start_says_why_and_leaves_no_process() -> None:
    delayer = Delayer(70000, 10)
    with pytest.raises(DelayerError, match="queue number in 0..65535"):
        delayer.start()
    assert delayer.pid is None
    delayer.stop()  # twice is fine
