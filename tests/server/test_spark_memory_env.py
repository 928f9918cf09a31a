"""A node started by a verified chaos run or a catalogue inherits the Spark
driver's memory variable (spark_verify.session reads it): the node's
configuration skips it, as it refuses any other unknown ``KQ_*`` variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.config import ConfigError, controller_config, load_settings


def test_the_spark_memory_variable_is_not_a_node_setting(tmp_path: Path) -> None:
    base = {"node_id": "1", "cluster_id": "abcdefghijklmnopqrstuv", "data_dir": str(tmp_path)}
    env = {"KQ_" + k.upper(): v for k, v in base.items()} | {"KQ_VOTERS": "1@127.0.0.1:1"}
    config = controller_config(load_settings(None, env | {"KQ_SPARK_DRIVER_MEMORY": "2g"}))
    assert config.node_id == 1
    # Any other unknown KQ_ variable is still refused, naming it.
    with pytest.raises(ConfigError, match="KQ_SPARK_DRIVER_MEMORIES"):
        load_settings(None, env | {"KQ_SPARK_DRIVER_MEMORIES": "2g"})
