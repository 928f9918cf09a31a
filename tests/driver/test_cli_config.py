"""Controller configuration: TOML file < KQ_* environment < flags, and its errors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kq.cli import main
from server.broker import broker_config
from server.config import (
    SETTINGS,
    ConfigError,
    controller_config,
    env_name,
    load_settings,
    render_toml,
)

REPO = Path(__file__).resolve().parents[2]

BASE = """
node_id = 1
cluster_id = "abc"
data_dir = "data"

[voters]
1 = "127.0.0.1:9091"
2 = "127.0.0.1:9092"
3 = "127.0.0.1:9093"

[quorum]
fetch_timeout_ms = 3000
election_timeout_ms = 800

[node]
append_linger_ms = 1.5
"""


def write(tmp_path: Path, text: str = BASE) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def test_file_values_and_defaults(tmp_path: Path) -> None:
    config = controller_config(load_settings(write(tmp_path), {}))
    assert config.node_id == 1
    assert config.cluster_id == "abc"
    # Relative to the config file's directory.
    assert config.data_dir == tmp_path / "data"
    assert config.voters == {1: "127.0.0.1:9091", 2: "127.0.0.1:9092", 3: "127.0.0.1:9093"}
    assert config.address == "127.0.0.1:9091"
    assert config.options.quorum.fetch_timeout_ms == 3000
    assert config.options.quorum.election_timeout_ms == 800
    assert config.options.quorum.request_timeout_ms == 1000  # default
    assert config.options.append_linger_ms == 1.5
    assert config.log_level == "INFO"
    assert config.metrics_listen == ""
    assert config.settings.origin("quorum.fetch_timeout_ms") == f"config file {tmp_path}/node.toml"
    assert config.settings.origin("quorum.request_timeout_ms") == "default"
    node = config.node_config()
    assert node.options.quorum.fetch_timeout_ms == 3000 and node.address == "127.0.0.1:9091"


def test_environment_overrides_file_and_flags_override_both(tmp_path: Path) -> None:
    path = write(tmp_path)
    env = {
        "KQ_NODE_ID": "2",
        "KQ_QUORUM_FETCH_TIMEOUT_MS": "4000",
        "KQ_NODE_MAX_BATCH_RECORDS": "77",
        "KQ_METRICS_LISTEN": "127.0.0.1:9300",
        "KQ_LOG_LEVEL": "debug",
        "KQ_DEBUG": "1",  # not a setting, ignored
        "HOME": "/nowhere",
    }
    flags = [
        ("node_id", "3", "flag --node-id"),
        ("quorum.fetch_timeout_ms", "5000", "flag --set quorum.fetch_timeout_ms=5000"),
    ]
    config = controller_config(load_settings(path, env, flags))
    assert config.node_id == 3
    assert config.settings.origin("node_id") == "flag --node-id"
    assert config.options.quorum.fetch_timeout_ms == 5000
    assert config.options.max_batch_records == 77
    assert config.settings.origin("node.max_batch_records") == (
        "environment variable KQ_NODE_MAX_BATCH_RECORDS"
    )
    assert config.metrics_listen == "127.0.0.1:9300"
    assert config.log_level == "DEBUG"
    assert config.options.quorum.election_timeout_ms == 800  # still the file's
    # The environment alone beats the file.
    alone = controller_config(load_settings(path, env))
    assert alone.node_id == 2 and alone.options.quorum.fetch_timeout_ms == 4000


def test_voters_as_a_string_and_everything_without_a_file(tmp_path: Path) -> None:
    env = {
        "KQ_NODE_ID": "4",
        "KQ_CLUSTER_ID": "xyz",
        "KQ_DATA_DIR": "rel/dir",
        "KQ_VOTERS": "1@127.0.0.1:9091, 2@127.0.0.1:9092",
        "KQ_LISTEN": "127.0.0.1:9099",
    }
    config = controller_config(load_settings(None, env))
    assert config.voters == {1: "127.0.0.1:9091", 2: "127.0.0.1:9092"}
    assert config.data_dir == Path("rel/dir")  # relative to the working directory
    assert config.address == "127.0.0.1:9099"  # an observer with its own address
    path = write(tmp_path, 'voters = "1@127.0.0.1:1,2@127.0.0.1:2"\n')
    assert load_settings(path, {}).get("voters") == {1: "127.0.0.1:1", 2: "127.0.0.1:2"}


@pytest.mark.parametrize(
    ("text", "env", "flags", "message"),
    [
        ("bogus = 1\n" + BASE, {}, [], "unknown key 'bogus' in config file"),
        (BASE + "\nbogus = 1\n", {}, [], "unknown key 'node.bogus' in config file"),
        (
            BASE.replace("[quorum]", "[quorum]\nfetch_timout_ms = 1"),
            {},
            [],
            "unknown key 'quorum.fetch_timout_ms' in config file",
        ),
        (BASE, {"KQ_QUORUM_FETCH_TIMOUT_MS": "1"}, [], "environment variable KQ_QUORUM_FETCH"),
        (BASE, {}, [("quorum.nope", "1", "flag --set quorum.nope=1")], "unknown key 'quorum.nope'"),
        (
            BASE.replace("fetch_timeout_ms = 3000", 'fetch_timeout_ms = "3000"'),
            {},
            [],
            "bad value for 'quorum.fetch_timeout_ms' from config file",
        ),
        (
            BASE,
            {"KQ_QUORUM_FETCH_TIMEOUT_MS": "soon"},
            [],
            "bad value for 'quorum.fetch_timeout_ms' from environment variable "
            "KQ_QUORUM_FETCH_TIMEOUT_MS: expected an integer, got 'soon'",
        ),
        (
            BASE,
            {},
            [("node_id", "-1", "flag --node-id")],
            "bad value for 'node_id' from flag --node-id: must be at least 0",
        ),
        (BASE, {"KQ_LOG_LEVEL": "loud"}, [], "bad value for 'log_level'"),
        (BASE, {"KQ_LISTEN": "nowhere"}, [], "bad value for 'listen'"),
        (BASE, {"KQ_VOTERS": "1@127.0.0.1:99999"}, [], "port outside 1..65535"),
        (BASE, {"KQ_VOTERS": "1,2"}, [], "voter(s) 1, 2 have no address"),
        ("quorum = 3\n", {}, [], "'quorum' in config file"),
        ("node_id = [", {}, [], "is not valid TOML"),
        (
            BASE,
            {"KQ_QUORUM_FETCH_MAX_WAIT_MS": "2900"},
            [],
            "quorum.fetch_max_wait_ms from environment variable KQ_QUORUM_FETCH_MAX_WAIT_MS",
        ),
        (
            BASE.replace("node_id = 1", "node_id = 7"),
            {},
            [],
            "node 7 (from config file",
        ),
        (BASE.replace('cluster_id = "abc"', ""), {}, [], "missing required setting 'cluster_id'"),
    ],
)
def test_errors_name_the_key_and_its_source(
    tmp_path: Path, text: str, env: dict[str, str], flags: list[tuple[str, str, str]], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        controller_config(load_settings(write(tmp_path, text), env, flags))
    assert message in str(info.value)


def test_a_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "absent.toml", {})


def test_env_names() -> None:
    assert env_name("node_id") == "KQ_NODE_ID"
    assert env_name("quorum.fetch_timeout_ms") == "KQ_QUORUM_FETCH_TIMEOUT_MS"
    assert env_name("node.append_linger_ms") == "KQ_NODE_APPEND_LINGER_MS"
    assert len({env_name(k) for k in SETTINGS}) == len(SETTINGS)


def test_render_toml_round_trips(tmp_path: Path) -> None:
    values: dict[str, object] = {
        "node_id": 2,
        "cluster_id": "abc",
        "data_dir": "data",
        "voters": {1: "127.0.0.1:1", 2: "127.0.0.1:2"},
        "quorum.fetch_timeout_ms": 2500,
        "quorum.check_quorum_factor": 2.0,
        "node.snapshot_every_offsets": 0,
    }
    path = write(tmp_path, render_toml(values))
    settings = load_settings(path, {})
    assert settings.get("voters") == {1: "127.0.0.1:1", 2: "127.0.0.1:2"}
    assert settings.get("quorum.fetch_timeout_ms") == 2500
    assert settings.get("quorum.check_quorum_factor") == 2.0
    assert settings.get("data_dir") == tmp_path / "data"


def test_the_example_config_documents_every_key() -> None:
    path = REPO / "docs" / "config.example.toml"
    doc = tomllib.loads(path.read_text())
    keys = set()
    for name, value in doc.items():
        if name in ("quorum", "node", "controller", "tls", "authorizer"):
            keys |= {f"{name}.{sub}" for sub in value}
        else:
            keys.add(name)
    # The broker's own sections are in the broker's example.
    broker_path = REPO / "docs" / "broker.example.toml"
    broker_doc = tomllib.loads(broker_path.read_text())
    broker_sections = ("broker", "group", "offsets", "transaction", "transaction_state")
    for section in broker_sections:
        keys |= {f"{section}.{sub}" for sub in broker_doc[section]}
    assert keys == set(SETTINGS)
    config = controller_config(load_settings(path, {}))
    broker = load_settings(broker_path, {})
    broker_config(broker)
    for key, setting in SETTINGS.items():
        if key.startswith(("quorum.", "node.", "controller.")):
            # The example shows the defaults.
            assert config.settings.get(key) == setting.default, key
        if key.startswith(tuple(s + "." for s in broker_sections)) and setting.default is not None:
            assert broker.get(key) == setting.default, key


def test_controller_start_exits_2_on_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path)
    monkeypatch.setenv("KQ_QUORUM_ELECTION_TIMEOUT_MS", "x")
    assert main(["controller", "start", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "KQ_QUORUM_ELECTION_TIMEOUT_MS" in err and "quorum.election_timeout_ms" in err
    monkeypatch.delenv("KQ_QUORUM_ELECTION_TIMEOUT_MS")
    assert main(["controller", "start", "--config", str(path), "--set", "quorum.x=1"]) == 2
    assert "unknown key 'quorum.x' in flag --set quorum.x=1" in capsys.readouterr().err
    assert main(["controller", "start", "--config", str(path), "--set", "noequals"]) == 2
    assert "is not KEY=VALUE" in capsys.readouterr().err
    assert main(["controller", "start", "--config", str(path), "--node-id", "one"]) == 2
    assert "'node_id' from flag --node-id" in capsys.readouterr().err
