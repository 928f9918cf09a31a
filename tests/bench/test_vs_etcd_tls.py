"""The TLS mode of the kq-versus-etcd benchmark (bench/vs_etcd.py) at tiny
sizes, so that it keeps running: kq's cluster over mutual TLS with the
benchmark's client (and etcd's when the etcd binary is installed; the
bootstrap does not install it, so etcd's command line and certificates are
also checked as pure functions).  Real handshakes with certificates from
server.certs; nothing here checks a speed."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from bench import cluster_etcd, cluster_kq, harness, vs_etcd
from bench.harness import Params, Security, Target
from kvstore.client import KvClient

TINY = Params(
    value_size=16,
    request_timeout_s=5.0,
    max_errors=10,
    seq_writes=20,
    seq_max_s=10.0,
    conc_writers=4,
    conc_warmup_s=0.1,
    conc_duration_s=0.5,
    batch_records=20,
    batch_producers=2,
    batch_warmup_s=0.1,
    batch_duration_s=0.5,
    failover_trials=1,
    failover_load_writers=2,
    failover_settle_s=0.2,
    failover_max_wait_s=15.0,
    failover_max_total_s=60.0,
)

ETCD_MISSING = "etcd is not installed (Debian's etcd-server; scripts/bootstrap does not install it)"


# -- modes and rounds


def test_security_modes_parse_in_order_and_reject_bad_input() -> None:
    assert harness.parse_securities("plaintext,tls") == [Security.PLAINTEXT, Security.TLS]
    assert harness.parse_securities(" tls ") == [Security.TLS]
    with pytest.raises(ValueError, match="unknown security mode 'ssl'"):
        harness.parse_securities("plaintext,ssl")
    with pytest.raises(ValueError, match="given twice"):
        harness.parse_securities("tls,tls")
    with pytest.raises(ValueError, match="no security mode"):
        harness.parse_securities(",")
    assert vs_etcd.main(["--systems", "kq", "--security", "ssl"]) == 2
    assert vs_etcd.main(["--systems", "kq", "--repeat", "0"]) == 2


def test_rounds_alternate_the_order_of_the_modes() -> None:
    both = [Security.PLAINTEXT, Security.TLS]
    assert vs_etcd.round_order(both, 0) == both
    assert vs_etcd.round_order(both, 1) == both[::-1]
    assert vs_etcd.round_order(both, 2) == both


def _figures(commits: float, p50: float) -> dict[str, Any]:
    return {"sequential": {"commits_per_s": commits, "p50_ms": p50}}


def test_ratios_per_round_and_their_ranges() -> None:
    rounds: list[harness.Round] = [
        {
            "kq": {"plaintext": _figures(400, 2.0), "tls": _figures(300, 3.0)},
            "etcd": {"plaintext": _figures(2000, 0.5), "tls": _figures(1000, 1.0)},
        },
        {
            "kq": {"plaintext": _figures(400, 2.0), "tls": _figures(200, 4.0)},
            "etcd": {"plaintext": _figures(2000, 0.5), "tls": _figures(1500, 0.5)},
        },
    ]
    first = harness.round_ratios(rounds[0])
    assert first["tls_over_plaintext"]["kq"]["sequential commits/s"] == pytest.approx(0.75)
    assert first["tls_over_plaintext"]["etcd"]["sequential p50 ms"] == pytest.approx(2.0)
    assert first["kq_over_etcd"]["plaintext"]["sequential commits/s"] == pytest.approx(0.2)
    assert first["kq_over_etcd"]["tls"]["sequential commits/s"] == pytest.approx(0.3)
    doc = harness.result_document(rounds, TINY, "test", [Security.PLAINTEXT, Security.TLS])
    assert doc["securities"] == ["plaintext", "tls"]
    assert [r["round"] for r in doc["rounds"]] == [1, 2]
    assert doc["rounds"][1]["ratios_tls_over_plaintext"]["kq"]["sequential commits/s"] == 0.5
    kq_cost = doc["ratio_ranges"]["tls_over_plaintext"]["kq"]["sequential commits/s"]
    assert kq_cost == {"median": 0.625, "min": 0.5, "max": 0.75, "rounds": 2}
    missing = doc["ratio_ranges"]["tls_over_plaintext"]["kq"]["batched records/s"]
    assert missing == {"median": None, "min": None, "max": None, "rounds": 0}
    shown = harness.format_ranges(doc["ratio_ranges"])
    assert "kq: TLS/plaintext, median [min..max] over 2 rounds" in shown
    assert "0.62 [0.50..0.75]" in shown
    # One mode only: no TLS/plaintext; one system only: no kq/etcd.
    plain = harness.round_ratios({"kq": {"plaintext": _figures(1, 1)}})
    assert plain == {}


# -- etcd's command line and certificates (pure; no etcd needed)


def test_etcd_member_command_plaintext_uses_http_and_no_tls_flags(tmp_path: Path) -> None:
    command = cluster_etcd.member_command(
        "etcd", "m1", tmp_path / "m1", (2379, 2380), [("m0", 2381), ("m1", 2380)], "tok"
    )
    assert "--listen-client-urls=http://127.0.0.1:2379" in command
    assert "--initial-advertise-peer-urls=http://127.0.0.1:2380" in command
    assert "--initial-cluster=m0=http://127.0.0.1:2381,m1=http://127.0.0.1:2380" in command
    assert not any("https" in arg or "cert" in arg for arg in command)


def test_etcd_member_command_tls_uses_https_and_mutual_tls_for_clients_and_peers(
    tmp_path: Path,
) -> None:
    certs = cluster_etcd.make_certs(tmp_path, size=2)
    tls = certs.members[1]
    command = cluster_etcd.member_command(
        "etcd", "m1", tmp_path / "m1", (2379, 2380), [("m0", 2381), ("m1", 2380)], "tok", tls
    )
    urls = [arg for arg in command if "://" in arg]
    assert len(urls) == 5 and all("http://" not in arg for arg in urls)
    assert "--advertise-client-urls=https://127.0.0.1:2379" in command
    assert "--listen-peer-urls=https://127.0.0.1:2380" in command
    assert "--initial-cluster=m0=https://127.0.0.1:2381,m1=https://127.0.0.1:2380" in command
    for flag, path in (
        ("--cert-file", tls.cert),
        ("--key-file", tls.key),
        ("--trusted-ca-file", tls.ca),
        ("--peer-cert-file", tls.cert),
        ("--peer-key-file", tls.key),
        ("--peer-trusted-ca-file", tls.ca),
    ):
        assert f"{flag}={path}" in command
    assert "--client-cert-auth" in command and "--peer-client-cert-auth" in command


def test_etcd_certificates_name_the_members_hosts_and_chain_to_one_ca(tmp_path: Path) -> None:
    certs = cluster_etcd.make_certs(tmp_path, size=3)
    ca = x509.load_pem_x509_certificate(certs.client.ca.read_bytes())
    assert len({m.cert for m in certs.members}) == 3
    for files in (*certs.members, certs.client):
        assert files.ca == certs.client.ca
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        cert.verify_directly_issued_by(ca)
        key = cert.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    for member in certs.members:
        cert = x509.load_pem_x509_certificate(member.cert.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        assert san.get_values_for_type(x509.DNSName) == ["localhost"]
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        # A member serves clients and peers and dials its peers.
        assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


# -- the systems in both modes, tiny


async def _plaintext_put_fails(addresses: list[str]) -> bool:
    async with KvClient(addresses, timeout_s=2.0) as client:
        try:
            await client.put("bench/plaintext-probe", b"x")
        except Exception:
            return True
    return False


def test_kq_runs_every_workload_in_both_modes_and_tls_refuses_plaintext(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused: dict[Security, bool] = {}

    @asynccontextmanager
    async def checked(workdir: Path, security: Security) -> AsyncIterator[Target]:
        async with cluster_kq.open_target(workdir, security) as target:
            # The figures are labelled TLS only if a plaintext client is
            # refused while the benchmark's own client writes.
            refused[security] = await _plaintext_put_fails(list(target.addresses.values()))
            yield target

    both = [Security.PLAINTEXT, Security.TLS]
    results = vs_etcd.run_round({"kq": checked}, both, TINY, 0, print)
    assert refused == {Security.PLAINTEXT: False, Security.TLS: True}
    for mode in ("plaintext", "tls"):
        result = results["kq"][mode]
        assert result["security"] == mode
        assert result["system"]["security"] == mode
        assert result["sequential"]["writes"] == TINY.seq_writes
        assert result["concurrent"]["writes"] > 0 and result["batched"]["records"] > 0
        assert result["failover"]["recovered"] == 1
    assert "== kq, tls" in capsys.readouterr().out
    cost = harness.round_ratios(results)["tls_over_plaintext"]["kq"]
    assert cost["sequential commits/s"] is not None and cost["sequential commits/s"] > 0


def test_kq_target_refuses_a_cluster_of_the_wrong_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if `kq cluster up` made a plaintext cluster when asked for TLS: the
    # benchmark must not label a plaintext cluster's figures TLS.
    flags = cluster_kq.MODE_FLAGS
    wrong = {**flags, Security.TLS: flags[Security.PLAINTEXT]}
    monkeypatch.setattr(cluster_kq, "MODE_FLAGS", wrong)

    async def open_it() -> None:
        async with cluster_kq.open_target(tmp_path, Security.TLS):
            pass

    with pytest.raises(RuntimeError, match="made a plaintext cluster, not tls"):
        asyncio.run(open_it())


@pytest.mark.skipif(shutil.which("etcd") is None, reason=ETCD_MISSING)
def test_etcd_runs_every_workload_over_mutual_tls(tmp_path: Path) -> None:
    refused: list[bool] = []

    @asynccontextmanager
    async def checked(workdir: Path, security: Security) -> AsyncIterator[Target]:
        opened: AbstractAsyncContextManager[cluster_etcd.EtcdTarget] = cluster_etcd.open_target(
            workdir, security
        )
        async with opened as target:
            pb2, pb2_grpc = target.pb2, target.pb2_grpc
            for endpoint in target.cluster.endpoints:
                async with grpc.aio.insecure_channel(endpoint) as channel:
                    try:
                        await pb2_grpc.KVStub(channel).Put(
                            pb2.PutRequest(key=b"bench/plaintext-probe", value=b"x"), timeout=2.0
                        )
                    except grpc.aio.AioRpcError:
                        refused.append(True)
                    else:
                        refused.append(False)
            yield target

    p = dataclasses.replace(TINY, failover_max_wait_s=20.0)
    results = vs_etcd.run_round({"etcd": checked}, [Security.TLS], p, 0, None)
    assert refused == [True, True, True]
    result = results["etcd"]["tls"]
    assert result["system"]["security"] == "tls"
    assert result["sequential"]["writes"] == p.seq_writes
    assert result["batched"]["records"] > 0
    assert result["failover"]["recovered"] == 1
