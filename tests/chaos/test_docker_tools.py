"""What the docker backend needs from the host: a docker client is not a
daemon (machines ship the client alone), so docker.io is missing unless a
daemon answers or a dockerd can be started."""

from __future__ import annotations

import zipfile
from pathlib import Path

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


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_the_image_tag_ignores_what_a_rebuild_changes_and_sees_what_a_source_change_does(
    tmp_path: Path,
) -> None:
    # Two builds of the same source: the compiled extension (and the RECORD
    # listing its hash) differ, the Python does not.
    name = "kq-0.1-cp311-cp311-linux_x86_64.whl"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    base = {"pkg/mod.py": b"x = 1\n", "kq-0.1.dist-info/METADATA": b"Name: kq\n"}
    first = _wheel(
        tmp_path / "a" / name,
        {**base, "pkg/_ext.so": b"build one", "kq-0.1.dist-info/RECORD": b"one"},
    )
    second = _wheel(
        tmp_path / "b" / name,
        {**base, "pkg/_ext.so": b"build two", "kq-0.1.dist-info/RECORD": b"two"},
    )
    changed = _wheel(
        tmp_path / "c" / name,
        {**base, "pkg/mod.py": b"x = 2\n", "pkg/_ext.so": b"build one"},
    )
    assert docker_image._wheel_digest(first) == docker_image._wheel_digest(second)
    assert docker_image._wheel_digest(first) != docker_image._wheel_digest(changed)
    # The C sources count instead.
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "_ext.c").write_text("int f(void) { return 1; }\n")
    before = docker_image._extension_sources(source)
    (source / "pkg" / "_ext.c").write_text("int f(void) { return 2; }\n")
    assert docker_image._extension_sources(source) != before
    # A Cython source counts; the C that Cython made of it, only in a built
    # tree, does not.
    (source / "pkg" / "_loop.pyx").write_text("def g(): return 1\n")
    cython = docker_image._extension_sources(source)
    (source / "pkg" / "_loop.c").write_text("/* generated */\n")
    assert docker_image._extension_sources(source) == cython
    (source / "pkg" / "_loop.pyx").write_text("def g(): return 2\n")
    assert docker_image._extension_sources(source) != cython
