"""Real quorum nodes (gRPC over TLS, RocksDB) log the votes they grant and
the quorum state each start restores; their exports
(``chaos.node_exports.vote_events``) hold them with the state left in
storage, and ``vote-durability`` finds nothing in them, unless the vote is
not persisted (Q3, forget-vote), when it finds every restart that lost one."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import bugs
from bugs import Bug
from chaos.node_exports import export_node
from history.runs import RunDir
from history.votes import check_vote_durability, read_run_votes
from kq.commands.controller import LOG_FORMAT
from tests.driver.cluster_util import CLUSTER_ID, run, running


@pytest.fixture
def node_log() -> Iterator[io.StringIO]:
    """The ``kq.node`` logger's lines, as a controller's log file has them."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger = logging.getLogger("kq.node")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _restart_everyone(root: Path) -> None:
    async def go() -> None:
        async with running(root, tls=True) as cluster:
            await cluster.wait_leader()
            # Killed, not resigning: each comes back in the epoch it voted in.
            for n in list(cluster.servers):
                await cluster.stop(n, resign=False)
            for n in cluster.voters:
                await cluster.start(n)
            await cluster.wait_leader()

    run(go())


def _exported(root: Path, text: str) -> list[dict[str, Any]]:
    exports = RunDir(root / "run")
    for n in (1, 2, 3):
        export_node(exports, n, text, root / f"node-{n}", CLUSTER_ID, 0, 0)
    return read_run_votes(exports.path)


def test_votes_survive_restarts_and_the_check_finds_nothing(
    tmp_path: Path, node_log: io.StringIO
) -> None:
    _restart_everyone(tmp_path)
    lines = _exported(tmp_path, node_log.getvalue())
    events = [x["event"] for x in lines]
    assert events.count("start") == 6 and events.count("stored") == 3
    assert events.count("grant") >= 2 and events.count("candidate") >= 2
    # Every node voted in the first election's epoch (for itself or the
    # winner), and its second start restored that vote.
    first_epoch = min(x["epoch"] for x in lines if x["event"] == "grant")
    restored = [x for x in lines if x["event"] == "start" and x["life"] == 2]
    assert all(x["voted_for"] is not None for x in restored if x["epoch"] == first_epoch)
    assert any(x["epoch"] == first_epoch for x in restored)
    assert check_vote_durability(lines) == []


def test_a_vote_not_persisted_is_found_at_each_restart(
    tmp_path: Path, node_log: io.StringIO
) -> None:
    with bugs.injected(Bug.FORGET_VOTE):
        _restart_everyone(tmp_path)
    lines = _exported(tmp_path, node_log.getvalue())
    found = check_vote_durability(lines)
    starts = [a for a in found if a.witness[-1]["event"] == "start"]
    assert starts and all(a.kind == "vote-forgotten" for a in starts)
    assert all(a.witness[-1]["voted_for"] is None for a in found)
    # The stored states lost the last election's votes too.
    assert any(a.witness[-1]["event"] == "stored" for a in found)
