"""Fixtures of the docker backend's tests (test_docker, test_runner): a
Docker daemon and the kq image, made once per session.

Needs root.  Missing tools (docker.io, debootstrap) are installed with
apt-get, and a Docker daemon is started when none answers (and stopped
again at the end if these tests started it).  The kq image these tests
build is removed at the end; the Debian base image is kept as the cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.docker_image import (
    Docker,
    DockerError,
    copy_source,
    ensure_daemon,
    ensure_image,
    missing_packages,
    stop_daemon,
)


def _install_missing_tools() -> None:
    missing = missing_packages()
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail(f"the docker tests need {' '.join(missing)} (run scripts/bootstrap as root)")
    print(f"installing {' '.join(missing)} for the docker tests (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for args in (["update", "-qq"], ["install", "-y", "-qq", *missing]):
        subprocess.run(["apt-get", *args], env=env, check=True, capture_output=True, timeout=600)


@pytest.fixture(scope="session")
def docker() -> Iterator[Docker]:
    _install_missing_tools()
    try:
        daemon = ensure_daemon()
    except DockerError as exc:
        pytest.fail(str(exc))
    try:
        yield daemon
    finally:
        stop_daemon(daemon)  # only if these tests started it


@pytest.fixture(scope="session")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the source tree, still while the tests build from it."""
    copy = tmp_path_factory.mktemp("source") / "kq"
    copy_source(Path(__file__).resolve().parents[2], copy)
    return copy


@pytest.fixture(scope="session")
def image(docker: Docker, source: Path) -> Iterator[str]:
    """The kq image, removed at the end if these tests built it (the base
    image stays: it is the slow part, made once per host)."""
    made = ensure_image(docker, source)
    try:
        yield made.tag
    finally:
        if made.built:
            docker.run("rmi", made.tag, check=False)
