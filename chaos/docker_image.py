"""The Docker daemon and the kq image of the ``docker`` chaos backend
(:mod:`chaos.docker`).

:func:`ensure_daemon` finds a Docker daemon that answers: the one the
environment names (``DOCKER_HOST``, or the default socket), else kq's own
(socket ``/run/kq-docker/docker.sock``, data in ``/var/lib/kq-docker``),
which it starts in the background if ``dockerd`` is installed and we are
root.  A daemon started so keeps running (its image cache with it) until
:func:`stop_daemon`.  Starting dockerd sets the policy of the iptables
FORWARD chain to DROP.

:func:`ensure_image` makes the image every node runs, ``kq-chaos:<hash>``,
where the hash covers the Dockerfile, the base image and the content of the
wheels installed in it (kq's own, built from the source tree, and its
dependencies from ``pyproject.toml``, fetched by ``pip download`` on this
host); an image with that tag is used as it is.  Two bases
(``base=`` or ``KQ_DOCKER_BASE``):

- ``debian`` (the default; needs no registry): ``kq-base:bookworm-<hash>``,
  a Debian bookworm minbase root file system with python3, iproute2,
  iptables and procps made by ``debootstrap`` from the host's own Debian
  mirror and imported with ``docker import``; the wheels are installed
  offline (``docker build --network none``) with the pip of the pip wheel;
- ``python``: ``FROM python:3.11-slim``, for hosts that can pull from a
  registry.

Missing tools (``apt-get install docker.io debootstrap``; ``scripts/bootstrap``
installs them) are named in the :class:`DockerError` raised.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BASES",
    "Docker",
    "DockerError",
    "ImageResult",
    "base_image",
    "debian_mirror",
    "ensure_daemon",
    "ensure_image",
    "missing_packages",
    "stop_daemon",
]

INSTALL_HINT = (
    "install Docker with `apt-get install docker.io` (and debootstrap, for the default "
    "base image: `apt-get install debootstrap`); scripts/bootstrap does both"
)
BASES = ("debian", "python")
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "iproute2", "iptables", "procps")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
OWN_ROOT = Path("/var/lib/kq-docker")
OWN_RUN = Path("/run/kq-docker")
OWN_SOCKET = OWN_RUN / "docker.sock"
_REPO = Path(__file__).resolve().parents[1]


class DockerError(RuntimeError):
    """Docker is missing, or a docker command failed."""


@dataclass
class Docker:
    """The ``docker`` command talking to one daemon (``host``: its
    ``DOCKER_HOST``, None for the environment's); ``started_pid``: the
    dockerd :func:`ensure_daemon` started, if it did."""

    host: str | None = None
    started_pid: int | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.host is not None:
            env["DOCKER_HOST"] = self.host
        return env

    def run(
        self, *args: str, check: bool = True, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """``docker ARGS``; :class:`DockerError` with its stderr if it fails
        and ``check``."""
        try:
            done = subprocess.run(
                ["docker", *args],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=self.env(),
                check=False,
            )
        except FileNotFoundError:
            raise DockerError(f"no docker command: {INSTALL_HINT}") from None
        except subprocess.TimeoutExpired:
            raise DockerError(f"docker {' '.join(args)}: no answer in {timeout_s:g} s") from None
        if check and done.returncode != 0:
            raise DockerError(f"docker {' '.join(args)}: {done.stderr.strip()}")
        return done

    def answers(self) -> bool:
        try:
            return self.run("info", "--format", "{{.ServerVersion}}", timeout_s=10).returncode == 0
        except DockerError:
            return False

    def image_exists(self, tag: str) -> bool:
        return self.run("image", "inspect", tag, check=False).returncode == 0


def _find_program(name: str) -> str | None:
    """``name`` on the PATH or in the sbin folders (root's PATH has them,
    other users' often do not)."""
    found = shutil.which(name)
    if found is not None:
        return found
    for folder in ("/usr/sbin", "/sbin", "/usr/bin"):
        if Path(folder, name).exists():
            return str(Path(folder, name))
    return None


def missing_packages() -> list[str]:
    """The Debian packages the docker backend needs and this host lacks.

    A ``docker`` client is not a daemon: hosts ship the client alone.  The
    backend needs the client and either a daemon that answers already or a
    ``dockerd`` to start (both come with ``docker.io``), and ``debootstrap``
    for the default base image."""
    missing = []
    if shutil.which("docker") is None or (
        _find_program("dockerd") is None and not Docker().answers()
    ):
        missing.append("docker.io")
    if _find_program("debootstrap") is None:
        missing.append("debootstrap")
    return missing


def ensure_daemon(timeout_s: float = 60.0) -> Docker:
    """A :class:`Docker` whose daemon answers, starting kq's own dockerd if
    none does (see the module's doc)."""
    if shutil.which("docker") is None:
        raise DockerError(f"no docker command: {INSTALL_HINT}")
    default = Docker()
    if default.answers():
        return default
    own = Docker(f"unix://{OWN_SOCKET}")
    if OWN_SOCKET.exists() and own.answers():
        return own
    dockerd = _find_program("dockerd")
    if dockerd is None:
        raise DockerError(f"no Docker daemon answers and there is no dockerd: {INSTALL_HINT}")
    if os.geteuid() != 0:
        raise DockerError("no Docker daemon answers; starting one (dockerd) needs root")
    OWN_ROOT.mkdir(parents=True, exist_ok=True)
    (OWN_RUN / "exec").mkdir(parents=True, exist_ok=True)
    log_path = OWN_ROOT / "dockerd.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                dockerd,
                "--data-root",
                str(OWN_ROOT / "data"),
                "--exec-root",
                str(OWN_RUN / "exec"),
                "--pidfile",
                str(OWN_RUN / "dockerd.pid"),
                "-H",
                own.host or "",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    own.started_pid = proc.pid
    deadline = time.monotonic() + timeout_s
    while not own.answers():
        if proc.poll() is not None or time.monotonic() >= deadline:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-10:])
            stop_daemon(own)
            raise DockerError(f"dockerd did not come up (log {log_path}):\n{tail}")
        time.sleep(0.2)
    return own


def stop_daemon(docker: Docker, timeout_s: float = 30.0) -> None:
    """Stop the dockerd :func:`ensure_daemon` started (nothing otherwise)."""
    pid = docker.started_pid
    if pid is None:
        return
    docker.started_pid = None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid if not Path(f"/proc/{pid}").exists() else 0
        if done == pid:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


# -- the base image -------------------------------------------------------------------


def debian_mirror() -> str:
    """The Debian mirror this host's apt uses for its own release (from
    ``/etc/apt/sources.list`` and ``sources.list.d``); Debian's default
    mirror if none is found."""
    files = [Path("/etc/apt/sources.list")]
    with contextlib.suppress(OSError):
        files += sorted(Path("/etc/apt/sources.list.d").iterdir())
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    key, _, value = line.partition(":")
                    if value and not line.startswith(("#", " ", "\t")):
                        fields[key.strip().lower()] = value.strip()
                suites = fields.get("suites", "").split()
                for uri in fields.get("uris", "").split():
                    if SUITE in suites and uri.rstrip("/").endswith("/debian"):
                        return uri.rstrip("/")
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line).split()
                if (
                    len(words) >= 3
                    and words[0] == "deb"
                    and words[2] == SUITE
                    and words[1].rstrip("/").endswith("/debian")
                ):
                    return words[1].rstrip("/")
    return DEFAULT_MIRROR


def _short_hash(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()[:16]


def base_image(docker: Docker, mirror: str | None = None) -> str:
    """The tag of the Debian base image, made with debootstrap if missing."""
    mirror = mirror or debian_mirror()
    tag = f"kq-base:{SUITE}-{_short_hash(mirror, ' '.join(BASE_PACKAGES))}"
    if docker.image_exists(tag):
        return tag
    debootstrap = _find_program("debootstrap")
    if debootstrap is None:
        raise DockerError(
            f"the base image {tag} is missing and there is no debootstrap to make it: "
            f"{INSTALL_HINT} (or use base 'python' with a registry: KQ_DOCKER_BASE=python)"
        )
    with tempfile.TemporaryDirectory(prefix="kq-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        done = subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE,
                str(rootfs),
                mirror,
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-10:])
            raise DockerError(f"debootstrap from {mirror} failed:\n{tail}")
        for junk in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                     "usr/share/locale", "usr/share/info"):  # fmt: skip
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "-c", 'CMD ["/bin/bash"]', "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            env=docker.env(),
            timeout=600,
            check=False,
        )
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise DockerError(f"docker import of {tag} failed: {imported.stderr.strip()}")
    return tag


# -- the kq image -----------------------------------------------------------------------

DEBIAN_DOCKERFILE = """\
FROM {base}
COPY wheels /wheels
RUN python3 "$(ls /wheels/pip-*.whl)/pip" install --no-index --find-links /wheels \\
        --break-system-packages --no-cache-dir --root-user-action=ignore kq \\
    && rm -rf /wheels
WORKDIR /kq
"""

PYTHON_DOCKERFILE = """\
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends iproute2 \\
    && rm -rf /var/lib/apt/lists/*
COPY wheels /wheels
RUN pip install --no-index --find-links /wheels --no-cache-dir --root-user-action=ignore kq \\
    && rm -rf /wheels
WORKDIR /kq
"""


@dataclass(frozen=True)
class ImageResult:
    tag: str
    built: bool
    seconds: float


def cache_dir() -> Path:
    """Where fetched wheels are kept: ``KQ_DOCKER_CACHE``, else
    ``$XDG_CACHE_HOME/kq/docker`` (``~/.cache/kq/docker``)."""
    if os.environ.get("KQ_DOCKER_CACHE"):
        return Path(os.environ["KQ_DOCKER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kq" / "docker"


def _dependencies(source: Path) -> list[str]:
    with (source / "pyproject.toml").open("rb") as fh:
        deps: list[str] = tomllib.load(fh)["project"]["dependencies"]
    return deps


def _pip(*args: str, timeout_s: float = 600) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise DockerError(f"pip {' '.join(args[:2])} failed:\n{tail}")


def dependency_wheels(source: Path) -> Path:
    """A folder of the wheels (CPython 3.11, manylinux x86_64) of kq's
    dependencies and pip, fetched once per dependency list."""
    deps = _dependencies(source)
    folder = cache_dir() / f"wheels-{_short_hash(*deps)}"
    if (folder / ".complete").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    _pip(
        "download", "-q", "-d", str(folder), "--only-binary=:all:",
        "--python-version", "3.11", "--platform", "manylinux2014_x86_64",
        "--implementation", "cp", "pip", *deps,
    )  # fmt: skip
    (folder / ".complete").write_text("")
    return folder


def copy_source(source: Path, dest: Path) -> None:
    """Copy the source tree ``source`` to ``dest`` (created): in a git work
    tree, the files git knows (tracked, or untracked and not ignored);
    elsewhere, all but caches, builds and virtual environments."""
    listed = subprocess.run(
        ["git", "-C", str(source), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0 or not (source / ".git").exists():
        shutil.copytree(
            source,
            dest,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
            ),
        )
        return
    dest.mkdir(parents=True, exist_ok=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = source / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def kq_wheel(source: Path, out: Path) -> Path:
    """Build kq's wheel from a copy of the source tree ``source`` into ``out``."""
    with tempfile.TemporaryDirectory(prefix="kq-src-") as tmp:
        copy = Path(tmp) / "src"
        copy_source(source, copy)
        _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(copy))
    (wheel,) = out.glob("kq-*.whl")
    return wheel


# Compiled extension modules differ from one build to the next (the build
# directory, a temporary copy, is written into them), and so does the RECORD
# that lists their hashes: the image's tag counts their C sources instead.
_BUILT_SUFFIXES = (".so", ".pyd")


def _wheel_digest(path: Path) -> str:
    """A wheel's name and its members' contents (not its zip timestamps, nor
    its compiled extensions and their RECORD: see _extension_sources)."""
    h = hashlib.sha256(path.name.encode())
    with zipfile.ZipFile(path) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            name = info.filename
            if name.endswith(_BUILT_SUFFIXES) or name.endswith(".dist-info/RECORD"):
                continue
            h.update(name.encode() + b"\0" + zf.read(info) + b"\0")
    return h.hexdigest()


def _extension_sources(source: Path) -> str:
    """The sources of the packages' compiled extensions (a package's
    top-level ``*.c`` and Cython ``*.pyx`` files), which the wheel digest
    leaves out. A ``.c`` beside a ``.pyx`` of the same name is Cython's
    output, present only where the tree was built: the ``.pyx`` counts."""
    h = hashlib.sha256()
    paths = [
        path
        for path in (*source.glob("*/*.c"), *source.glob("*/*.pyx"))
        if not (path.suffix == ".c" and path.with_suffix(".pyx").exists())
    ]
    for path in sorted(paths):
        h.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def ensure_image(
    docker: Docker, source: Path | None = None, base: str | None = None
) -> ImageResult:
    """The tag of the image with kq (from the source tree ``source``, this
    repository by default) installed; built unless an image with the same
    content hash exists."""
    started = time.monotonic()
    source = source or _REPO
    base = base or os.environ.get("KQ_DOCKER_BASE") or "debian"
    if base not in BASES:
        raise DockerError(f"unknown base {base!r}; known: {', '.join(BASES)}")
    if base == "debian":
        base_tag = base_image(docker)
        base_id = docker.run("image", "inspect", "-f", "{{.Id}}", base_tag).stdout.strip()
        dockerfile = DEBIAN_DOCKERFILE.format(base=base_tag)
    else:
        base_id = "python:3.11-slim"
        dockerfile = PYTHON_DOCKERFILE
    deps = dependency_wheels(source)
    with tempfile.TemporaryDirectory(prefix="kq-image-") as tmp:
        context = Path(tmp)
        wheels = context / "wheels"
        wheels.mkdir()
        kq_wheel(source, wheels)
        for wheel in deps.glob("*.whl"):
            shutil.copy2(wheel, wheels / wheel.name)
        digests = [_wheel_digest(w) for w in sorted(wheels.glob("*.whl"))]
        digests.append(_extension_sources(source))
        tag = f"kq-chaos:{_short_hash(dockerfile, base_id, *digests)}"
        if docker.image_exists(tag):
            return ImageResult(tag, False, time.monotonic() - started)
        (context / "Dockerfile").write_text(dockerfile)
        network = ["--network", "none"] if base == "debian" else []
        docker.run("build", "-q", *network, "-t", tag, str(context), timeout_s=900)
    return ImageResult(tag, True, time.monotonic() - started)
