"""The pieces of the malformed-request guard (quorum/driver/rpc_guard.py);
the guard itself runs against real nodes in test_malformed_rpcs.py."""

from __future__ import annotations

import logging

import pytest

from quorum.driver.rpc_guard import RateLimitedLog, peer_host


def test_one_line_per_key_and_interval_then_the_count_kept_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    limited = RateLimitedLog(logging.getLogger("kq.test"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="kq.test"):
        assert limited.warning(("a", "m"), "first")
        assert not limited.warning(("a", "m"), "again")
        assert not limited.warning(("a", "m"), "and again")
        assert limited.warning(("b", "m"), "another peer")
        now[0] += 10.0
        assert limited.warning(("a", "m"), "later")
    assert [r.getMessage() for r in caplog.records] == [
        "first",
        "another peer",
        "later (2 more like it since the last report)",
    ]


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:5000", "127.0.0.1"),
        ("ipv6:[::1]:5000", "[::1]"),
        ("unix:/run/kq.sock", "unix:/run/kq.sock"),
    ],
)
def test_the_peer_is_its_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host
