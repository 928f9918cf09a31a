"""The local cluster's brokers in its state and folder, without processes:
the layout (ids after the controllers', each broker on its own loopback
address), cluster.json with and without brokers, the generated broker
configs as `kq broker start` loads them, their formatting and
certificates."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from quorum.driver.identity import identity_from_pem
from quorum.driver.storage_format import read_meta
from server.broker import broker_config, check_log_dirs
from server.config import load_settings
from server.errors import UserError
from server.local_brokers import wait_for_brokers
from server.local_cluster import (
    METRICS_PORT_OFFSET,
    STATE_FILE,
    broker_addresses,
    check_configs,
    check_none_exited,
    check_ports,
    format_new_nodes,
    free_base_port,
    host_bindable,
    load_state,
    local_cluster_state,
    make_certs,
    port_free,
    write_broker_configs,
    write_configs,
)


def test_brokers_follow_the_controllers_ids_each_on_its_own_address(tmp_path: Path) -> None:
    state = local_cluster_state(tmp_path, 9091, nodes=3, brokers=3)
    assert [(n.node_id, n.address) for n in state.nodes] == [
        (1, "127.0.0.1:9091"),
        (2, "127.0.0.1:9092"),
        (3, "127.0.0.1:9093"),
    ]
    assert [(b.node_id, b.address, b.metrics_address) for b in state.brokers] == [
        (4, "127.0.1.4:9094", f"127.0.1.4:{9094 + METRICS_PORT_OFFSET}"),
        (5, "127.0.1.5:9095", f"127.0.1.5:{9095 + METRICS_PORT_OFFSET}"),
        (6, "127.0.1.6:9096", f"127.0.1.6:{9096 + METRICS_PORT_OFFSET}"),
    ]
    b = state.broker(5)
    assert (b.config, b.data_dir, b.log_dirs, b.log_file) == (
        "broker-5/config.toml",
        "broker-5/metadata",
        ["broker-5/logs"],
        "broker-5/broker.log",
    )
    assert state.member(5) is b and state.member(2) is state.nodes[1]
    with pytest.raises(UserError, match="no node or broker 7 .controllers 1,2,3, brokers 4,5,6"):
        state.member(7)
    assert local_cluster_state(tmp_path, 9091, nodes=1, brokers=0).brokers == []


def test_state_with_brokers_round_trips_and_older_files_load(tmp_path: Path) -> None:
    state = local_cluster_state(tmp_path, 9091, nodes=3, brokers=2)
    state.brokers[0].pid = 1234
    state.save()
    loaded = load_state(tmp_path)
    assert loaded is not None
    assert loaded.brokers == state.brokers and loaded.nodes == state.nodes
    assert broker_addresses(tmp_path) == ["127.0.1.4:9094", "127.0.1.5:9095"]

    # A cluster.json written before brokers existed: no "brokers" key.
    obj = json.loads((tmp_path / STATE_FILE).read_text())
    del obj["brokers"]
    (tmp_path / STATE_FILE).write_text(json.dumps(obj))
    older = load_state(tmp_path)
    assert older is not None and older.brokers == [] and len(older.nodes) == 3
    assert broker_addresses(tmp_path) == []
    assert broker_addresses(tmp_path / "nothing") == []

    obj["brokers"] = [{"node_id": 4}]
    (tmp_path / STATE_FILE).write_text(json.dumps(obj))
    with pytest.raises(UserError, match="malformed"):
        load_state(tmp_path)


def test_broker_configs_load_format_and_carry_their_certificates(tmp_path: Path) -> None:
    state = local_cluster_state(tmp_path, 9091, nodes=3, brokers=3)
    state.tls = True
    make_certs(state)
    write_configs(state, {})
    write_broker_configs(state, {"broker.heartbeat_interval_ms": 200})
    check_configs(state)
    b = state.broker(4)
    config = broker_config(load_settings(state.path(b.config), {}))
    assert config.node_id == 4 and config.cluster_id == state.cluster_id
    assert config.voters == {1: "127.0.0.1:9091", 2: "127.0.0.1:9092", 3: "127.0.0.1:9093"}
    assert config.listen == "127.0.1.4:9094"
    assert config.metrics_listen == b.metrics_address
    assert config.metadata_dir == state.path(b.data_dir)
    assert list(config.log_dirs) == [state.path("broker-4/logs")]
    assert config.rack is None and config.heartbeat_interval_ms == 200
    assert config.offsets_topic.replication_factor == 3
    # The admin user produces and consumes, the brokers replicate: super users.
    assert config.authorizer.super_users == frozenset(
        {"User:admin", "Broker:4", "Broker:5", "Broker:6"}
    )
    assert config.tls is not None
    identity = identity_from_pem(config.tls.cert.read_bytes())
    assert identity.principal == "Broker:4"
    # Served on its own address: the certificate names it, as clients verify.
    cert = x509.load_pem_x509_certificate(config.tls.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.1.4")]

    assert format_new_nodes(state) == [1, 2, 3, 4, 5, 6]
    assert format_new_nodes(state) == []
    meta = read_meta(state.path(b.data_dir))
    assert (meta.cluster_id, meta.node_id) == (state.cluster_id, 4)
    check_log_dirs(config.log_dirs, state.cluster_id, 4)


def test_a_broker_address_no_interface_has_is_refused_by_name(tmp_path: Path) -> None:
    base = free_base_port(3, brokers=3)
    state = local_cluster_state(tmp_path, base, nodes=3, brokers=3)
    check_ports(state, state.members)
    assert all(port_free(b.address) for b in state.brokers)
    # 192.0.2.0/24 is TEST-NET-1: no interface here has it.
    assert host_bindable("127.0.1.4") and not host_bindable("192.0.2.1")
    state.brokers[1].address = "192.0.2.1:9095"
    with pytest.raises(UserError, match=r"cannot listen on 192\.0\.2\.1 \(node 5\)"):
        check_ports(state, state.members)


def test_a_broker_that_exits_or_never_registers_is_named_with_its_log(tmp_path: Path) -> None:
    """wait_for_brokers: a broker process that exits is reported with its
    status and the end of its log; one that never shows up, at the timeout
    (here no controller answers at all)."""
    base = free_base_port(1, brokers=1)
    state = local_cluster_state(tmp_path, base, nodes=1, brokers=1)
    state.save()
    broker = state.broker(2)
    state.path(broker.log_file).parent.mkdir(parents=True)
    state.path(broker.log_file).write_text("cannot start broker 2: the reason\n")
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exited.wait(timeout=30)
    with pytest.raises(UserError) as error:
        asyncio.run(wait_for_brokers(state, {2: exited}, 5.0))
    assert "broker 2 exited with status 3 while starting" in str(error.value)
    assert "cannot start broker 2: the reason" in str(error.value)

    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(UserError) as error:
            asyncio.run(wait_for_brokers(state, {2: sleeping}, 1.0))
        assert "broker(s) 2 not registered and unfenced within 1 s" in str(error.value)
        assert "no controller answered" in str(error.value)
    finally:
        sleeping.kill()
        sleeping.wait(timeout=30)


def test_a_controller_that_exits_while_starting_is_named_with_its_log(tmp_path: Path) -> None:
    """check_none_exited (wait_for_leader's check, as wait_for_brokers'):
    the node, its status and the end of its log; its pid is cleared."""
    state = local_cluster_state(tmp_path, free_base_port(1), nodes=1, brokers=0)
    node = state.node(1)
    node.pid = 12345
    state.save()
    state.path(node.log_file).parent.mkdir(parents=True)
    state.path(node.log_file).write_text("cannot start node 1: the reason\n")
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])
    exited.wait(timeout=30)
    with pytest.raises(UserError) as error:
        check_none_exited(state, {1: exited}, state.node, "node")
    assert "node 1 exited with status 4 while starting" in str(error.value)
    assert "cannot start node 1: the reason" in str(error.value)
    saved = load_state(state.dir)
    assert saved is not None and saved.node(1).pid is None


def test_bad_broker_flags_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kq.cli import main

    d = str(tmp_path / "c")
    assert main(["cluster", "up", "--cluster-dir", d, "--brokers", "-1"]) == 2
    assert "--brokers must be in 0..99 (0: controllers only), got -1" in capsys.readouterr().err
    assert main(["cluster", "up", "--cluster-dir", d, "--brokers", "100"]) == 2
    assert "got 100" in capsys.readouterr().err
    assert main(["cluster", "up", "--cluster-dir", d, "--set", "broker.log_dirs=x"]) == 2
    assert "but broker.log_dirs" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    # A cluster's number of brokers is fixed when it is made.
    Path(d).mkdir()
    local_cluster_state(Path(d), 9091, nodes=3, brokers=3).save()
    assert main(["cluster", "up", "--cluster-dir", d, "--brokers", "2"]) == 2
    assert "has 3 brokers, not 2" in capsys.readouterr().err


def test_status_of_a_cluster_made_before_brokers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kq.cli import main

    state = local_cluster_state(tmp_path, 9091, nodes=1, brokers=0)
    state.save()
    obj = json.loads((tmp_path / STATE_FILE).read_text())
    del obj["brokers"]
    (tmp_path / STATE_FILE).write_text(json.dumps(obj))
    assert main(["cluster", "status", "--cluster-dir", str(tmp_path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["brokers"] == [] and [n["alive"] for n in status["nodes"]] == [False]
    assert main(["cluster", "status", "--cluster-dir", str(tmp_path)]) == 0
    assert "BrokerId" not in capsys.readouterr().out


def test_a_one_broker_cluster_keeps_its_offsets_topic_on_that_broker(tmp_path: Path) -> None:
    state = local_cluster_state(tmp_path, 9091, nodes=1, brokers=1)
    write_configs(state, {})
    write_broker_configs(state, {})
    (b,) = state.brokers
    config = broker_config(load_settings(state.path(b.config), {}))
    assert config.offsets_topic.replication_factor == 1


def test_up_puts_group_and_offsets_settings_in_the_brokers_configs_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kq cluster up --set group.*=... --set offsets.*=...`: the brokers
    (which coordinate groups) get them, the controllers do not.  A busy
    port makes `up` stop after writing the configs, before starting
    anything."""
    import socket

    from kq.cli import main

    d = tmp_path / "c"
    base = free_base_port(1, brokers=1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base))
        busy.listen()
        code = main(
            ["cluster", "up", "--cluster-dir", str(d), "--nodes", "1", "--brokers", "1",
             "--base-port", str(base), "--insecure",
             "--set", "group.session_timeout_ms=6000",
             "--set", "group.heartbeat_interval_ms=500",
             "--set", "offsets.commit_timeout_ms=2000"]
        )  # fmt: skip
    assert code == 1 and "(node 1)" in capsys.readouterr().err
    state = load_state(d)
    assert state is not None
    (b,) = state.brokers
    config = broker_config(load_settings(state.path(b.config), {}))
    assert config.groups.session_timeout_ms == 6000
    assert config.groups.heartbeat_interval_ms == 500
    assert config.offsets_topic.commit_timeout_ms == 2000
    controller = load_settings(state.path(state.node(1).config), {})
    assert not any(k.startswith(("group.", "offsets.")) for k in controller.values)
