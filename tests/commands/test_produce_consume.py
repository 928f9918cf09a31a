"""kq produce, kq consume and kq offsets end to end against real brokers
(three controllers, three brokers, mutual TLS with the admin's certificate
from the cluster's certificate folder), in this process: records from stdin
come back in order with their keys, partitions and offsets; bad flags and a
topic that does not exist get clear errors and their exit statuses."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kq.cli import main
from tests.broker.grpc_client.cluster import BrokerCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    running = BrokerCluster(tmp_path_factory.mktemp("commands"))
    try:
        running.start()
        running.create_topic("lines", 1, 3, {"min.insync.replicas": "2"})
        running.create_topic("spread", 3, 2)
        running.create_topic("snappy", 1, 3)
        yield running
    finally:
        running.stop()


def flags(cluster: BrokerCluster) -> list[str]:
    return [
        "--bootstrap-server",
        ",".join(cluster.addresses),
        "--certs-dir",
        str(cluster.certs_dir),
        "--user",
        "admin",
    ]


def run(argv: list[str], monkeypatch: pytest.MonkeyPatch, stdin: bytes = b"") -> int:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_produce_sync_then_consume_with_keys_offsets_and_partitions(
    cluster: BrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run(
        ["produce", "--topic", "lines", "--key-separator", ":", "--sync", *flags(cluster)],
        monkeypatch,
        b"k1:hello\nk2:world\r\n:no key\n",
    )
    out = capsys.readouterr()
    assert status == 0, out.err
    assert out.out.splitlines() == ["lines:0:0", "lines:0:1", "lines:0:2"]
    status = run(
        [
            "consume",
            "--topic",
            "lines",
            "--from-beginning",
            "--max-messages",
            "3",
            "--print-key",
            "--print-offset",
            "--print-partition",
            "--key-separator",
            "=",
            *flags(cluster),
        ],
        monkeypatch,
    )
    out = capsys.readouterr()
    assert status == 0, out.err
    assert out.out.splitlines() == [
        "Partition:0\tOffset:0\tk1=hello",
        "Partition:0\tOffset:1\tk2=world",
        "Partition:0\tOffset:2\t=no key",
    ]
    assert "Processed a total of 3 messages" in out.err
    # From an offset of one partition, as JSON lines.
    status = run(
        ["consume", "--topic", "lines", "--partition", "0", "--offset", "1",
         "--max-messages", "2", "--json", *flags(cluster)],
        monkeypatch,
    )  # fmt: skip
    out = capsys.readouterr()
    assert status == 0, out.err
    got = [json.loads(line) for line in out.out.splitlines()]
    assert [(g["offset"], g["key"], g["value"]) for g in got] == [
        (1, "k2", "world"),
        (2, "", "no key"),
    ]


def test_produce_batched_with_compression_and_offsets(
    cluster: BrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = b"".join(b"record %d\n" % i for i in range(30))
    status = run(
        ["produce", "--topic", "spread", "--compression", "zstd", "--json", *flags(cluster)],
        monkeypatch,
        lines,
    )
    out = capsys.readouterr()
    assert status == 0, out.err
    summary = json.loads(out.out)
    assert summary["records"] == 30 and summary["acknowledged"] == 30
    assert summary["failed"] == summary["unknown"] == 0
    status = run(["offsets", "--topic", "spread", *flags(cluster)], monkeypatch)
    out = capsys.readouterr()
    assert status == 0, out.err
    latest = {}
    for line in out.out.splitlines():
        topic, partition, offset = line.split(":")
        assert topic == "spread"
        latest[int(partition)] = int(offset)
    assert sorted(latest) == [0, 1, 2] and sum(latest.values()) == 30
    status = run(
        ["offsets", "--topic", "spread", "--time", "earliest", "--partition", "1", "--json",
         *flags(cluster)],
        monkeypatch,
    )  # fmt: skip
    out = capsys.readouterr()
    assert status == 0, out.err
    assert [(o["partition"], o["offset"]) for o in json.loads(out.out)] == [(1, 0)]
    status = run(
        ["consume", "--topic", "spread", "--from-beginning", "--max-messages", "30",
         *flags(cluster)],
        monkeypatch,
    )  # fmt: skip
    out = capsys.readouterr()
    assert status == 0, out.err
    assert sorted(out.out.splitlines()) == sorted(f"record {i}" for i in range(30))
    # Nothing more: --timeout-ms ends the wait.
    status = run(
        ["consume", "--topic", "spread", "--timeout-ms", "500", *flags(cluster)], monkeypatch
    )
    out = capsys.readouterr()
    assert status == 0 and out.out == ""
    assert "Processed a total of 0 messages" in out.err


def test_acks_one_and_zero(
    cluster: BrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for acks in ("1", "0"):
        status = run(
            ["produce", "--topic", "lines", "--acks", acks, "--partition", "0", *flags(cluster)],
            monkeypatch,
            b"acks %s\n" % acks.encode(),
        )
        out = capsys.readouterr()
        assert status == 0, out.err
        assert "1 record(s) acknowledged to lines" in out.out


@pytest.mark.parametrize("command", ["produce", "consume", "offsets"])
def test_a_topic_that_does_not_exist(
    cluster: BrokerCluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    status = run([command, "--topic", "nowhere", *flags(cluster)], monkeypatch, b"x\n")
    err = capsys.readouterr().err
    assert status == 1
    assert f"kq {command}:" in err and "'nowhere' does not exist" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["consume", "--topic", "lines", "--offset", "3"], "--offset needs --partition"),
        (["consume", "--topic", "lines", "--partition", "0", "--offset", "soon"],
         "an offset, earliest or latest"),
        (["consume", "--topic", "lines", "--partition", "0", "--offset", "1",
          "--from-beginning"], "cannot be given together"),
        (["consume", "--topic", "lines", "--max-messages", "0"], "--max-messages must be >= 1"),
        (["offsets", "--topic", "lines", "--time", "yesterday"], "--time 'yesterday'"),
        (["produce", "--topic", "lines", "--key-separator", ""], "must not be empty"),
        (["produce", "--topic", "lines", "--partition", "5"], "has no partition 5"),
        (["produce", "--topic", "lines", "--acks", "2"], "invalid choice: '2'"),
        (["consume", "--topic", "lines", "--partition", "-1"], "a partition is >= 0"),
    ],
)  # fmt: skip
def test_bad_flags(
    cluster: BrokerCluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    status = run([*argv, *flags(cluster)], monkeypatch)
    err = capsys.readouterr().err
    assert status == 2
    assert message in err


def test_a_line_without_the_key_separator_is_refused_by_number(
    cluster: BrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run(
        ["produce", "--topic", "lines", "--key-separator", ":", *flags(cluster)],
        monkeypatch,
        b"a:1\nno separator\nb:2\n",
    )
    out = capsys.readouterr()
    assert status == 1
    assert "line 2 has no key separator ':'" in out.err
    assert "2 record(s) acknowledged to lines, 1 failed" in out.err


def test_brokers_of_the_local_cluster_by_default(
    cluster: BrokerCluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: object,
) -> None:
    # No local cluster there: the flag is required.
    status = run(["offsets", "--topic", "lines", "--cluster-dir", str(tmp_path)], monkeypatch)
    assert status == 2
    assert "--bootstrap-server is required" in capsys.readouterr().err
    # The local cluster's brokers (server.local_cluster.broker_addresses).
    import server.local_cluster

    monkeypatch.setattr(server.local_cluster, "broker_addresses", lambda d: cluster.addresses)
    status = run(
        ["offsets", "--topic", "lines", "--time", "earliest", "--certs-dir",
         str(cluster.certs_dir)],
        monkeypatch,
    )  # fmt: skip
    out = capsys.readouterr()
    assert status == 0, out.err
    assert out.out.splitlines() == ["lines:0:0"]


class Interrupted:
    """stdin whose reader presses Ctrl-C after some lines."""

    def __init__(self, lines: list[bytes]) -> None:
        self.buffer = self
        self._lines = lines

    def __iter__(self) -> Iterator[bytes]:
        yield from self._lines
        raise KeyboardInterrupt


def test_ctrl_c_sends_what_was_read(
    cluster: BrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.create_topic("interrupted", 1, 3)
    monkeypatch.setattr(sys, "stdin", Interrupted([b"one\n", b"two\n"]))
    status = main(["produce", "--topic", "interrupted", "--sync", *flags(cluster)])
    out = capsys.readouterr()
    assert status == 0, out.err
    assert out.out.splitlines() == ["interrupted:0:0", "interrupted:0:1"]
    assert "interrupted; sending what was read" in out.err


@pytest.mark.parametrize("command", ["produce", "consume", "offsets"])
def test_no_broker_answering_is_a_clear_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    from tests.driver.cluster_util import free_ports

    (port,) = free_ports(1)
    status = run(
        [command, "--topic", "t", "--bootstrap-server", f"127.0.0.1:{port}"], monkeypatch, b"x\n"
    )
    err = capsys.readouterr().err
    assert status == 1
    assert f"kq {command}: BROKER_NOT_AVAILABLE: no broker answered Metadata" in err
    assert f"127.0.0.1:{port}" in err


def test_a_bad_bootstrap_address_is_bad_usage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run(["offsets", "--topic", "t", "--bootstrap-server", "nowhere"], monkeypatch)
    assert status == 2
    assert "nowhere" in capsys.readouterr().err


def test_consume_as_a_group_resumes_from_its_commits(
    cluster: BrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.create_topic("grouped", 1, 3)
    assert run(["produce", "--topic", "grouped", "--sync", *flags(cluster)], monkeypatch,
               b"a\nb\nc\nd\ne\n") == 0  # fmt: skip
    capsys.readouterr()
    group = ["consume", "--group", "cg", "--topic", "grouped", "--from-beginning", *flags(cluster)]
    assert run([*group, "--max-messages", "3"], monkeypatch) == 0
    assert capsys.readouterr().out.split() == ["a", "b", "c"]
    # A new member of the group starts where the first one's commits say.
    assert run([*group, "--max-messages", "2", "--timeout-ms", "20000"], monkeypatch) == 0
    assert capsys.readouterr().out.split() == ["d", "e"]
    assert (
        run(["groups", "--describe", "--group", "cg", "--json", *flags(cluster)], monkeypatch) == 0
    )
    described = json.loads(capsys.readouterr().out)
    text = json.dumps(described)
    assert '"lag": 0' in text and '"current_offset": 5' in text, text


def test_print_commits_shows_each_acknowledged_commit_after_its_records(
    cluster: BrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.create_topic("reported", 2, 3)
    assert run(["produce", "--topic", "reported", "--partition", "1", "--sync", *flags(cluster)],
               monkeypatch, b"a\nb\nc\n") == 0  # fmt: skip
    capsys.readouterr()
    group = ["consume", "--group", "pc", "--topic", "reported", "--from-beginning",
             "--print-commits", *flags(cluster)]  # fmt: skip
    assert run([*group, "--max-messages", "3", "--json"], monkeypatch) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["value"] for line in lines[:3]] == ["a", "b", "c"]
    # Stopping commits what was printed; the coordinator acknowledged it.
    committed = [line["committed"] for line in lines[3:]]
    assert committed and all("value" not in line for line in lines[3:]), lines
    assert {c["topic"] for c in committed} == {"reported"}
    last = {c["partition"]: (c["offset"], c["leader_epoch"]) for c in committed}
    # Partition 1 past its 3 records, with the epoch they were written in;
    # the empty partition 0 (if committed) at 0.
    assert last[1] == (3, 0) and last.get(0, (0, -1))[0] == 0, committed
    # The group has what was acknowledged.
    assert run(["groups", "--describe", "--group", "pc", "--json", *flags(cluster)],
               monkeypatch) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert '"current_offset": 3' in text, text
    # As text: after the records, each commit on its own line.
    assert run(["produce", "--topic", "reported", "--partition", "1", "--sync", *flags(cluster)],
               monkeypatch, b"d\n") == 0  # fmt: skip
    capsys.readouterr()
    assert run([*group, "--max-messages", "1"], monkeypatch) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "d"
    assert out[-1] == "Committed\tTopic:reported\tPartition:1\tOffset:4", out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--group", "g", "--topic", "t", "--partition", "0"], "--partition cannot"),
        (["--group", "g", "--topic", "t", "--offset", "3"], "--offset cannot"),
        (["--include", "t.*", "--topic", "t"], "--include needs --group"),
        (["--group", "g", "--topic", "t", "--include", "t.*"], "exactly one"),
        (["--group", "g"], "exactly one"),
        (["--group", "", "--topic", "t"], "must not be empty"),
        (["--topic", "t", "--print-commits"], "--print-commits needs --group"),
        ([], "--topic is required"),
    ],
)
def test_bad_group_flags(
    argv: list[str],
    words: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["consume", *argv, "--bootstrap-server", "127.0.0.1:1"], monkeypatch) == 2
    assert words in capsys.readouterr().err


def test_sigterm_makes_a_group_consumer_commit_and_leave(
    cluster: BrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.create_topic("terminated", 2, 3)
    assert run(["produce", "--topic", "terminated", "--sync", *flags(cluster)], monkeypatch,
               b"x\ny\n") == 0  # fmt: skip
    argv = [sys.executable, "-m", "kq.cli", "consume", "--group", "tg", "--topic", "terminated"]
    child = subprocess.Popen(
        [*argv, "--from-beginning", *flags(cluster)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert child.stdout is not None
        got = sorted(child.stdout.readline().strip() for _ in range(2))
        assert got == [b"x", b"y"]
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert b"Processed a total of 2 messages" in err
    capsys.readouterr()
    assert (
        run(["groups", "--describe", "--group", "tg", "--json", *flags(cluster)], monkeypatch) == 0
    )
    text = capsys.readouterr().out
    # It left (no member holds a partition) and committed what it printed.
    assert '"consumer_id": null' in text and '"consumer_id": "' not in text, text
    assert '"lag": 0' in text and '"lag": 1' not in text, text


def test_snappy_batches_are_stored_and_consumed(
    cluster: BrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = b"".join(b"snappy record %d\n" % i for i in range(20))
    status = run(
        ["produce", "--topic", "snappy", "--compression", "snappy", "--json", *flags(cluster)],
        monkeypatch,
        lines,
    )
    out = capsys.readouterr()
    assert status == 0, out.err
    assert json.loads(out.out)["acknowledged"] == 20
    status = run(
        ["consume", "--topic", "snappy", "--from-beginning", "--max-messages", "20",
         *flags(cluster)],
        monkeypatch,
    )  # fmt: skip
    out = capsys.readouterr()
    assert status == 0, out.err
    assert out.out.splitlines() == [f"snappy record {i}" for i in range(20)]
