"""What the docker backend needs from the host: a docker client is not a
daemon (machines ship the client alone), so docker.io is missing unless a
daemon answers or a dockerd can be started."""

from __future__ import annotations

import pytest

from chaos import docker_image
from chaos.docker_image import Docker, missing_packages


def _host(monkeypatch: pytest.MonkeyPatch, programs: dict[str, str], answers: bool) -> None:
    monkeypatch.setattr(docker_image, "_find_program", lambda name: programs.get(name))
    monkeypatch.setattr(docker_image.shutil, "which", lambda name: programs.get(name))
    monkeypatch.setattr(Docker, "answers", lambda self: answers)


def test_a_client_without_a_daemon_needs_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    _host(monkeypatch, {"docker": "/usr/local/bin/docker", "debootstrap": "/usr/sbin/x"}, False)
    assert missing_packages() == ["docker.io"]


def test_a_daemon_that_answers_or_a_dockerd_to_start_is_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _host(monkeypatch, {"docker": "/usr/bin/docker", "debootstrap": "/usr/sbin/x"}, True)
    assert missing_packages() == []
    _host(
        monkeypatch,
        {"docker": "/usr/bin/docker", "dockerd": "/usr/sbin/dockerd", "debootstrap": "/x"},
        False,
    )
    assert missing_packages() == []


def test_nothing_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    _host(monkeypatch, {}, False)
    assert missing_packages() == ["docker.io", "debootstrap"]
