"""A rotation caught half done: the key file replaced, the certificate not
yet (``kq certs issue`` and the chaos nemesis rename the key, then the
certificate).  A new handshake in between still gets the old certificate
(gRPC keeps its current pair when the fetched one does not load), and once
both files are replaced the new one, without a restart (real
handshakes)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from kvstore.client import KvClient
from quorum.driver.identity import Identity, Role
from server.certs import issue
from tests.driver.cluster_util import CLUSTER_ID, file_serial, run, running, served_serial


def _replace(source: Path, target: Path) -> None:
    """``target`` becomes a copy of ``source`` by one rename, as ``kq certs``
    writes."""
    tmp = target.with_name(target.name + ".new")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def test_half_a_rotation_keeps_the_old_pair_until_both_files_match(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path / "cluster", tls=True) as cluster:
            await cluster.wait_leader()
            assert cluster.certs is not None
            me = cluster.tls_files(Identity.user(CLUSTER_ID, "ops"))
            address = cluster.voters[1]
            old = await asyncio.to_thread(served_serial, address, me)
            # A new pair for node 1 from the same CA, made aside.
            aside = tmp_path / "aside"
            aside.mkdir()
            for name in ("ca.crt", "ca.key"):
                shutil.copyfile(cluster.certs / name, aside / name)
            new = issue(aside, Identity.node(CLUSTER_ID, Role.CONTROLLER, 1))
            await asyncio.sleep(0.05)  # a later modification time
            _replace(new.key, cluster.certs / "controller-1.key")
            # Half done: a new handshake still gets the old certificate.
            assert await asyncio.to_thread(served_serial, address, me) == old
            _replace(new.cert, cluster.certs / "controller-1.crt")
            served = await asyncio.to_thread(served_serial, address, me)
            assert served == file_serial(new.cert) != old
            async with KvClient(
                list(cluster.voters.values()), credentials=me.channel_credentials()
            ) as c:
                await c.put("after-rotation", b"1")

    run(go())
