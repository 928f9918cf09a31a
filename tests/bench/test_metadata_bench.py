"""The metadata benchmark (bench/metadata_bench.py) at tiny sizes, so that it
keeps running as the metadata code changes.  Nothing here checks a speed:
the figures are recorded in docs/benchmarks.md, not asserted."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench import metadata_bench as mb

TINY = dataclasses.replace(
    mb.QUICK,
    topics=20,
    large_topic_partitions=50,
    fence_partitions=2_000,
    fence_topic_size=50,
    memory_partitions=(500, 1_000),
    quorum_clients=(2,),
    quorum_warmup_s=0.1,
    quorum_seconds=0.3,
    quorum_settle_s=0.1,
    quorum_fence_partitions=1_000,
    quorum_session_ms=1_000,
)


def test_pure_sections() -> None:
    results = mb.run(["topics", "fence", "memory", "snapshot"], TINY, repeat=1, profile=True)
    small, large = results["topics"]
    assert (small["topics"], small["partitions"]) == (20, 200)
    assert small["records"] == 20 * 11  # a TopicRecord and 10 PartitionRecords each
    assert (large["topics"], large["partitions"]) == (1, 50)
    fence = results["fence"]
    assert fence["partitions"] == 2_000
    # Broker 0 leads about a tenth of the partitions and is in 3 of 10 ISRs;
    # the fence writes one change per ISR it leaves, and the fence itself.
    assert 0 < fence["led_by_fenced_broker"] < fence["records"] - 1 < 2_000
    assert [row["partitions"] for row in results["memory"]] == [500, 1_000]
    assert all(row["bytes_per_partition"] > 0 for row in results["memory"])
    assert results["snapshot"]["records"] > 2_000
    for row in [small, large, fence]:
        assert row["seconds"] > 0 and row["peer_seconds"] > 0 and row["ratio"] > 0
        assert set(row["phase_share"]) == set(mb.PHASES)
    assert "remove_broker_from_partitions" in results["fence_profile"]
    text = mb.report(results)
    for heading in ("### topics", "### fence", "### memory", "### snapshot", "### cProfile"):
        assert heading in text
    json.dumps(results)


def test_unknown_section_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        mb.main(["topicz"])
    assert "unknown section" in capsys.readouterr().err


def test_size_overrides() -> None:
    sizes = mb.with_overrides(mb.FULL, ["topics=7", "quorum_clients=1,4", "quorum_seconds=0.5"])
    assert (sizes.topics, sizes.quorum_clients, sizes.quorum_seconds) == (7, (1, 4), 0.5)
    for bad in ["nope=1", "topics", "topics=x"]:
        with pytest.raises(ValueError, match="--size"):
            mb.with_overrides(mb.FULL, [bad])


def test_main_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    sizes = ["topics=5", "large_topic_partitions=20", "memory_partitions=200"]
    args = ["topics", "memory", "--repeat", "1", "--json"]
    assert mb.main([*args, *[f"--size={s}" for s in sizes]]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sizes"]["topics"] == 5
    assert [r["partitions"] for r in out["topics"]] == [50, 20]
    assert [r["partitions"] for r in out["memory"]] == [200]


@pytest.mark.slow
def test_quorum_sections() -> None:
    results = mb.run(["quorum", "fence-quorum"], TINY, repeat=1)
    (row,) = results["quorum"]["callers"]
    assert row["callers"] == 2 and row["topics_per_second"] > 0
    assert row["peer_puts_per_second"] > 0
    large = results["quorum"]["large_topic"]
    assert large["partitions"] == 50 and large["seconds"] > 0
    fence = results["fence-quorum"]
    assert fence["partitions"] == 1_000 and fence["led_by_fenced_broker"] > 0
    assert 0 < fence["seconds_to_leader_commit"] <= fence["seconds_to_all_nodes"]
    assert "### fence-quorum" in mb.report(results)
