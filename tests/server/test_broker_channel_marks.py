"""A broker's channels to other nodes carry its ``node.dscp`` mark, the
controllers' (its metadata client) as well as the leaders' (replica
fetches), and a client of the cluster's carry none.  The chaos harness's
local partitions cut a node by its mark (chaos.netfilter); that a cut-off
broker is fenced on a real cluster is
tests/chaos/test_local_broker_partition.py."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from metadata.client import MetadataClient
from quorum.driver.client import ChannelPool, LeaderFollowingClient
from quorum.driver.node import NodeOptions
from quorum.driver.rocks import RocksStorage
from quorum.driver.storage_format import format_storage
from server.broker import BrokerProcess, BrokerSettings

MARK = ("grpc.dscp", 21)


def test_a_pool_adds_the_given_options_after_its_own() -> None:
    plain = ChannelPool()
    assert all(name != "grpc.dscp" for name, _ in plain.options)
    marked = ChannelPool(options=[MARK])
    assert marked.options == (*plain.options, MARK)


def test_a_leader_following_client_dials_with_its_options() -> None:
    async def main() -> None:
        async with LeaderFollowingClient(["127.0.0.1:1"], options=[MARK]) as client:
            assert client._channels.options[-1] == MARK
            client.quorum_stub("127.0.0.1:1")  # a channel of the pool, dialled
        async with MetadataClient(["127.0.0.1:1"]) as plain:
            assert MARK not in plain._channels.options

    asyncio.run(main())


@pytest.mark.parametrize("dscp", [0, 21])
def test_a_broker_marks_its_calls_to_the_controllers_and_leaders(tmp_path: Path, dscp: int) -> None:
    metadata_dir = tmp_path / "metadata"
    logs = tmp_path / "logs"
    format_storage(metadata_dir, "kq-marks", 4, [1])
    logs.mkdir()
    settings = BrokerSettings(
        4, "kq-marks", {1: "127.0.0.1:1"}, metadata_dir, [logs], "127.0.0.1:0"
    )
    settings = dataclasses.replace(settings, options=NodeOptions(dscp=dscp))

    async def options() -> tuple[tuple[str, object], ...]:
        process = BrokerProcess(settings)
        try:
            # The replica fetches dial with the same options (_fetch_from).
            assert process._channel_options == ([("grpc.dscp", dscp)] if dscp else [])
            return process.client._channels.options
        finally:
            assert isinstance(process.node.storage, RocksStorage)
            process.node.storage.close()

    got = asyncio.run(options())
    if dscp:
        assert got[-1] == ("grpc.dscp", dscp)
    else:
        assert all(name != "grpc.dscp" for name, _ in got)
