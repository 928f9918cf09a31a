"""Listeners name their security protocol (Kafka's
``listener.security.protocol.map``), checked against the [tls] section;
configs without the setting derive it; the node says it on every start."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from kq.commands.controller import _log_listener
from quorum.driver.identity import Identity, Role
from server.certs import create_ca, issue
from server.config import (
    CONTROLLER_LISTENER,
    ConfigError,
    ControllerConfig,
    SecurityProtocol,
    controller_config,
    load_settings,
    parse_protocol_map,
    render_toml,
)

BASE = 'node_id = 1\ncluster_id = "c1"\ndata_dir = "data"\nvoters = "1@127.0.0.1:9091"\n'
TLS = '[tls]\nca_file = "certs/ca.crt"\ncert_file = "n.crt"\nkey_file = "n.key"\n'


def config(
    tmp_path: Path, top: str = "", tls: bool = False, env: dict[str, str] | None = None
) -> ControllerConfig:
    path = tmp_path / "node.toml"
    path.write_text(BASE + top + (TLS if tls else ""))
    return controller_config(load_settings(path, env or {}))


def test_parse_protocol_map() -> None:
    assert parse_protocol_map("CONTROLLER:SSL") == {"CONTROLLER": SecurityProtocol.SSL}
    assert parse_protocol_map(" CONTROLLER : PLAINTEXT , BROKER:SSL") == {
        "CONTROLLER": SecurityProtocol.PLAINTEXT,
        "BROKER": SecurityProtocol.SSL,
    }
    for text, why in (
        ("CONTROLLER", "expected NAME:PROTOCOL"),
        ("CONTROLLER:", "expected NAME:PROTOCOL"),
        ("controller:SSL", "upper case"),
        ("CONTROLLER:SSL,CONTROLLER:SSL", "named twice"),
        ("CONTROLLER:SASL_SSL", "SASL_SSL (listener CONTROLLER) is Kafka's"),
        ("CONTROLLER:TLS", "unknown security protocol 'TLS' for listener CONTROLLER"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_protocol_map(text)


def test_old_configs_derive_the_protocol_from_tls(tmp_path: Path) -> None:
    plain = config(tmp_path)
    assert plain.listeners == {CONTROLLER_LISTENER: SecurityProtocol.PLAINTEXT}
    assert plain.security_protocol is SecurityProtocol.PLAINTEXT
    ssl = config(tmp_path, tls=True)
    assert ssl.listeners == {CONTROLLER_LISTENER: SecurityProtocol.SSL}
    assert ssl.security_protocol is SecurityProtocol.SSL


def test_a_named_protocol_must_agree_with_tls(tmp_path: Path) -> None:
    key = 'listener_security_protocol_map = "CONTROLLER:{}"\n'
    assert config(tmp_path, key.format("SSL"), tls=True).security_protocol is SecurityProtocol.SSL
    plain = config(tmp_path, key.format("PLAINTEXT"))
    assert plain.security_protocol is SecurityProtocol.PLAINTEXT
    # SSL without the files, or PLAINTEXT with them: both settings named.
    with pytest.raises(ConfigError) as ssl:
        config(tmp_path, key.format("SSL"))
    assert "listener_security_protocol_map (from config file" in str(ssl.value)
    assert "[tls] section (tls.ca_file, tls.cert_file, tls.key_file) is not set" in str(ssl.value)
    with pytest.raises(ConfigError) as plaintext:
        config(tmp_path, key.format("PLAINTEXT"), tls=True)
    assert "makes CONTROLLER PLAINTEXT, but the [tls] section" in str(plaintext.value)
    assert "tls.ca_file" in str(plaintext.value)
    # From the environment, the origin says so.
    with pytest.raises(ConfigError, match="environment variable KQ_LISTENER_SECURITY"):
        config(tmp_path, env={"KQ_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:SSL"})


def test_a_controller_has_one_listener(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="names listener\\(s\\) BROKER; a controller has one"):
        config(tmp_path, 'listener_security_protocol_map = "CONTROLLER:SSL,BROKER:SSL"\n', True)
    with pytest.raises(ConfigError, match="names listener\\(s\\) CONTROLLER2; a controller"):
        config(tmp_path, 'listener_security_protocol_map = "CONTROLLER2:SSL"\n', True)
    with pytest.raises(ConfigError, match="bad value for 'listener_security_protocol_map'"):
        config(tmp_path, "listener_security_protocol_map = 3\n")
    with pytest.raises(ConfigError, match="expected NAME:PROTOCOL"):
        config(tmp_path, 'listener_security_protocol_map = ""\n')


def test_render_toml_writes_the_map_back(tmp_path: Path) -> None:
    values: dict[str, object] = {
        "node_id": 1,
        "cluster_id": "c1",
        "data_dir": "data",
        "voters": {1: "127.0.0.1:9091"},
        "listener_security_protocol_map": {CONTROLLER_LISTENER: SecurityProtocol.PLAINTEXT},
    }
    path = tmp_path / "n.toml"
    path.write_text(render_toml(values))
    assert 'listener_security_protocol_map = "CONTROLLER:PLAINTEXT"' in path.read_text()
    assert load_settings(path, {}).get("listener_security_protocol_map") == {
        CONTROLLER_LISTENER: SecurityProtocol.PLAINTEXT
    }


def test_the_node_logs_its_listener_on_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kq.controller")
    _log_listener(config(tmp_path))
    [plain] = caplog.records
    assert plain.levelno == logging.WARNING
    assert "listener CONTROLLER on 127.0.0.1:9091 is PLAINTEXT" in plain.getMessage()
    assert "no authentication and no authorization" in plain.getMessage()
    caplog.clear()
    certs = tmp_path / "certs"
    create_ca(certs, "c1")
    issue(certs, Identity.node("c1", Role.CONTROLLER, 1))
    _log_listener(config(tmp_path, tls=True))
    [ssl] = caplog.records
    assert ssl.levelno == logging.INFO
    assert "listener CONTROLLER on 127.0.0.1:9091 is SSL: mutual TLS" in ssl.getMessage()
