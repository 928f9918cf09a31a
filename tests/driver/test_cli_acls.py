"""``kq acls`` against a real controller quorum on mutual TLS: kafka-acls.sh's
--add, --list and --remove, what they grant, and the usage errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kq.cli import main
from metadata.client import PermissionDeniedError
from quorum.driver.identity import Identity
from tests.driver.cluster_util import CLUSTER_ID, run
from tests.driver.test_acl_enforcement import ADMIN, TlsMetadataCluster, _everywhere, tls_metadata


def _flags(cluster: TlsMetadataCluster, user: str) -> list[str]:
    assert cluster.certs is not None
    cluster.tls_files(Identity.user(CLUSTER_ID, user))  # user-<name>.crt in the folder
    return [
        "--bootstrap-server",
        ",".join(cluster.voters.values()),
        "--certs-dir",
        str(cluster.certs),
        "--user",
        user,
    ]


async def kq(
    capsys: pytest.CaptureFixture[str], cluster: TlsMetadataCluster, *argv: str, user: str = ADMIN
) -> tuple[int, str, str]:
    capsys.readouterr()
    status = await asyncio.to_thread(main, ["acls", *argv, *_flags(cluster, user)])
    out, err = capsys.readouterr()
    return status, out, err


def test_add_list_remove_and_what_they_grant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def go() -> None:
        async with tls_metadata(tmp_path) as cluster:
            # alice may not list ACLs, nor describe the cluster.
            status, _, err = await kq(capsys, cluster, "--list", user="alice")
            assert status == 1
            assert "PERMISSION_DENIED: User:alice is not allowed DESCRIBE on CLUSTER" in err
            status, out, err = await kq(
                capsys,
                cluster,
                "--add",
                "--allow-principal",
                "User:alice",
                "--operation",
                "Describe",
                "--operation",
                "alter_configs",
                "--cluster",
            )
            assert status == 0, err
            assert out.splitlines() == [
                "Added: User:alice ALLOW DESCRIBE from * on CLUSTER kafka-cluster (literal)",
                "Added: User:alice ALLOW ALTER_CONFIGS from * on CLUSTER kafka-cluster (literal)",
            ]
            status, out, err = await kq(
                capsys,
                cluster,
                "--add",
                "--deny-principal",
                "User:alice",
                "--deny-host",
                "10.9.9.9",
                "--operation",
                "Read",
                "--topic",
                "team-a.",
                "--resource-pattern-type",
                "prefixed",
            )
            assert status == 0, err
            await _everywhere(cluster, 3)
            # Now alice may list them (DESCRIBE on the cluster).
            status, out, err = await kq(capsys, cluster, "--list", user="alice")
            assert status == 0, err
            assert (
                "Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=team-a., "
                "patternType=PREFIXED)`:\n \t(principal=User:alice, host=10.9.9.9, "
                "operation=READ, permissionType=DENY)"
            ) in out
            assert "operation=ALTER_CONFIGS, permissionType=ALLOW" in out
            # --json; MATCH finds the prefixed binding from a topic's name.
            status, out, _ = await kq(
                capsys,
                cluster,
                "--list",
                "--topic",
                "team-a.orders",
                "--resource-pattern-type",
                "match",
                "--json",
            )
            assert status == 0
            listed = json.loads(out)["acls"]
            assert [(a["resource_name"], a["pattern_type"], a["permission"]) for a in listed] == [
                ("team-a.", "PREFIXED", "DENY")
            ]
            # --principal filters; a literal --topic does not match the prefix.
            status, out, _ = await kq(
                capsys, cluster, "--list", "--principal", "User:bob", "--json"
            )
            assert json.loads(out) == {"acls": []}
            status, out, _ = await kq(capsys, cluster, "--list", "--topic", "team-a.", "--json")
            assert json.loads(out) == {"acls": []}
            # What the bindings grant: alice may describe the cluster, not
            # elect leaders (ALTER).
            async with cluster.client("alice") as alice:
                assert (await alice.describe_cluster()).cluster_id == CLUSTER_ID
                with pytest.raises(PermissionDeniedError, match="ALTER on CLUSTER"):
                    await alice.unregister_broker(9)
            # --remove needs --force off a terminal; then removes what matches.
            status, _, err = await kq(capsys, cluster, "--remove", "--cluster")
            assert status == 2 and "pass --force" in err
            status, out, err = await kq(
                capsys,
                cluster,
                "--remove",
                "--allow-principal",
                "User:alice",
                "--operation",
                "Describe",
                "--cluster",
                "--force",
                "--json",
            )
            assert status == 0, err
            removed = json.loads(out)["removed"]
            assert [(r["operation"], r["permission"]) for r in removed] == [("DESCRIBE", "ALLOW")]
            await _everywhere(cluster, 2)
            # alice lost DESCRIBE on the cluster (ALTER_CONFIGS implies only
            # DESCRIBE_CONFIGS).
            status, _, err = await kq(capsys, cluster, "--list", user="alice")
            assert status == 1 and "PERMISSION_DENIED" in err
            # Every binding of a resource, whoever it is for.
            status, out, err = await kq(
                capsys,
                cluster,
                "--remove",
                "--topic",
                "team-a.",
                "--resource-pattern-type",
                "prefixed",
                "--force",
            )
            assert status == 0, err
            assert out.startswith("Removed 1 ACL binding(s).")

    run(go())


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--add", "--allow-principal", "User:a"], "--add needs a resource"),
        (["--add", "--topic", "t"], "--add needs --allow-principal or --deny-principal"),
        (
            [
                *("--add", "--allow-principal", "User:a", "--topic", "t"),
                *("--resource-pattern-type", "match"),
            ],
            "--add needs a literal or prefixed pattern",
        ),
        (["--add", "--allow-principal", "alice", "--topic", "t"], "is not Type:name"),
        (
            ["--add", "--allow-principal", "User:a", "--operation", "Fly", "--topic", "t"],
            "unknown operation",
        ),
        (
            ["--add", "--allow-host", "1.2.3.4", "--topic", "t"],
            "--allow-host needs --allow-principal",
        ),
        (["--remove", "--allow-principal", "User:a"], "--remove needs a resource"),
        (["--list", "--operation", "Read"], "--list takes --principal"),
        (["--list", "--add"], "not allowed with argument"),
    ],
)
def test_usage_errors(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    status: object
    try:
        status = main(["acls", *argv, "--bootstrap-server", "127.0.0.1:1"])
    except SystemExit as exc:  # argparse's own refusals
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert fragment in err, err


def test_quorum_commands_say_a_refusal_is_a_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kq quorum describe`` and ``kq quorum resign`` from a user without the
    ACL: the node's PERMISSION_DENIED, not "no leader found" after the whole
    timeout; after the grant the same user describes the quorum."""

    async def quorum(cluster: TlsMetadataCluster, *argv: str, user: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = await asyncio.to_thread(
            main, ["quorum", *argv, "--timeout", "30", *_flags(cluster, user)]
        )
        out, err = capsys.readouterr()
        return status, out, err

    async def go() -> None:
        async with tls_metadata(tmp_path) as cluster:
            status, _, err = await quorum(cluster, "describe", "--status", user="alice")
            assert status == 1
            assert "refused DescribeQuorum" in err
            assert "User:alice is not allowed DESCRIBE on CLUSTER kafka-cluster" in err
            status, _, err = await quorum(cluster, "resign", user="alice")
            assert status == 1
            assert "User:alice is not allowed DESCRIBE on CLUSTER" in err
            status, _, err = await kq(
                capsys,
                cluster,
                "--add",
                "--allow-principal",
                "User:alice",
                "--operation",
                "Describe",
                "--cluster",
            )
            assert status == 0, err
            await _everywhere(cluster, 1)
            status, out, err = await quorum(cluster, "describe", "--status", "--json", user="alice")
            assert status == 0, err
            assert json.loads(out)["cluster_id"] == CLUSTER_ID
            # Describe is not Alter: the leader refuses to resign for alice.
            status, _, err = await quorum(cluster, "resign", user="alice")
            assert status == 1
            assert "refused Resign: User:alice is not allowed ALTER on CLUSTER" in err

    run(go())
