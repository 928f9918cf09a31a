"""The follower fetch size of a chaos run (``replica.fetch.max.bytes``):
a queue option, a ``kq chaos run`` flag, a recipe setting, and part of the
run's replay command."""

from __future__ import annotations

import pytest

from chaos.catalogue import RECIPES, Recipe
from chaos.runner import _replay
from chaos.workloads.queue_setup import QueueOptions
from kq.cli import build_parser


def test_unset_by_default_so_the_cluster_keeps_kafkas_1_mib() -> None:
    options = QueueOptions()
    assert options.replica_fetch_max_bytes is None
    assert "--replica-fetch-max-bytes" not in options.topic_flags()
    assert options.to_json()["replica_fetch_max_bytes"] is None


def test_a_bad_size_is_named() -> None:
    with pytest.raises(ValueError, match="replica_fetch_max_bytes must be at least 1, got 0"):
        QueueOptions(replica_fetch_max_bytes=0).check()


def test_a_recipe_sets_it_and_the_replay_repeats_it() -> None:
    recipe = Recipe("queue", ("isolate-follower",), ("lost-write",), replica_fetch_max_bytes=64)
    config = recipe.config(name="r", bugs=frozenset(), seed=3, runs_dir="runs")
    config.check()
    assert config.queue.replica_fetch_max_bytes == 64
    assert "--replica-fetch-max-bytes 64" in _replay(config, 3)
    assert "replica-fetch-max-bytes=64" in recipe.describe()


def test_b4_fetches_one_batch_at_a_time() -> None:
    """KAFKA-7128 needs a follower that catches up over many fetches: the
    composite fault gives the severed follower alone a one-batch fetch
    size, the others fetching in bulk (the cluster's size)."""
    from chaos.runner import CATCH_UP_FETCH_BYTES

    recipe = next(r for b, r in RECIPES.items() if b.id == "B4")
    assert recipe.nemesis == ("elect-catching-up-follower",)
    assert CATCH_UP_FETCH_BYTES == 1 and recipe.replica_fetch_max_bytes is None


def test_the_run_flag_reaches_the_queue_options() -> None:
    args = build_parser().parse_args(
        ["chaos", "run", "--workload", "queue", "--replica-fetch-max-bytes", "128"]
    )
    assert args.replica_fetch_max_bytes == 128
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["chaos", "run", "--workload", "queue", "--replica-fetch-max-bytes", "0"]
        )
