#!/usr/bin/env python3
"""Generate kq's protobuf and gRPC modules from the ``.proto`` files in ``proto/``.

This is the one place that knows how the generated code is made.  It is used by
``setup.py`` (at every ``pip install``, editable or not) and by
``scripts/bootstrap``.  It is equivalent to running, from the repository root::

    python -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. \\
        --pyi_out=. --mypy_grpc_out=. proto/kqproto/raft.proto

(``--mypy_grpc_out`` is mypy-protobuf's plugin; it writes typed stubs for the
gRPC module, ``*_pb2_grpc.pyi``), and then writing ``kqproto/_proto_digest.py``,
(the package ``kqproto``), which holds the sha256 of all the ``.proto`` files the code was generated
from, so a test can tell when the generated code is stale.

Usage::

    python tools/gen_proto.py             # generate
    python tools/gen_proto.py --if-stale  # generate only if the digest differs
    python tools/gen_proto.py --check     # exit 1 if the generated code is stale

Generation needs ``grpcio-tools`` and ``mypy-protobuf``; ``--check`` and
``proto_digest`` need only the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
DIGEST_MODULE = Path("kqproto") / "_proto_digest.py"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi")

_DIGEST_RE = re.compile(r'^PROTO_DIGEST\s*=\s*"([0-9a-f]{64})"\s*$', re.MULTILINE)


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Every ``.proto`` file under ``proto_root``, in a stable order."""
    return sorted(proto_root.rglob("*.proto"), key=lambda p: p.relative_to(proto_root).as_posix())


def proto_digest(proto_root: Path = PROTO_ROOT) -> str:
    """sha256 over the relative path and contents of every ``.proto`` file."""
    h = hashlib.sha256()
    for path in proto_files(proto_root):
        data = path.read_bytes()
        h.update(path.relative_to(proto_root).as_posix().encode() + b"\0")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def expected_outputs(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """The generated files, relative to the output root."""
    out: list[Path] = []
    for path in proto_files(proto_root):
        stem = path.relative_to(proto_root).with_suffix("")
        out.extend(stem.parent / (stem.name + suffix) for suffix in GENERATED_SUFFIXES)
    return out


def recorded_digest(out_root: Path = ROOT) -> str | None:
    """The digest written by the last generation into ``out_root``, if any."""
    try:
        text = (out_root / DIGEST_MODULE).read_text()
    except FileNotFoundError:
        return None
    match = _DIGEST_RE.search(text)
    return match.group(1) if match else None


def is_stale(out_root: Path = ROOT, proto_root: Path = PROTO_ROOT) -> bool:
    """True if the generated code in ``out_root`` is missing or out of date."""
    if recorded_digest(out_root) != proto_digest(proto_root):
        return True
    return not all((out_root / rel).is_file() for rel in expected_outputs(proto_root))


def generate(out_root: Path = ROOT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Generate every module into ``out_root`` and record the digest.

    Generation goes to a temporary directory first and the digest module is
    written last, so an interrupted run never leaves code that looks current.
    Generated files whose ``.proto`` is gone are removed.  Returns the paths
    written, relative to ``out_root``.
    """
    import grpc_tools
    from grpc_tools import protoc

    files = proto_files(proto_root)
    if not files:
        raise RuntimeError(f"no .proto files under {proto_root}")
    digest = proto_digest(proto_root)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    outputs = expected_outputs(proto_root)

    with tempfile.TemporaryDirectory(prefix="kq-gen-proto-") as tmp:
        out_dir = Path(tmp) / "out"
        out_dir.mkdir()
        args = [
            "grpc_tools.protoc",
            f"--proto_path={proto_root}",
            f"--proto_path={well_known}",
            f"--plugin=protoc-gen-mypy_grpc={_mypy_grpc_plugin(Path(tmp))}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--mypy_grpc_out={out_dir}",
            *(str(f) for f in files),
        ]
        status = protoc.main(args)
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status}: {' '.join(args[1:])}")
        # Whatever is already there is replaced; the digest goes last.
        (out_root / DIGEST_MODULE).unlink(missing_ok=True)
        for rel in outputs:
            src = out_dir / rel
            if not src.is_file():
                raise RuntimeError(f"protoc did not produce {rel}")
            dst = out_root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)

    _remove_orphans(out_root, outputs)
    _write_digest(out_root, digest)
    return [*outputs, DIGEST_MODULE]


def _mypy_grpc_plugin(directory: Path) -> Path:
    """An executable running mypy-protobuf's gRPC stub plugin with this Python.

    Its console script need not be on PATH (in a build environment it is not
    always), so protoc is pointed at this wrapper instead.
    """
    if importlib.util.find_spec("mypy_protobuf") is None:
        raise RuntimeError("mypy-protobuf is not installed (it makes the gRPC stubs)")
    path = directory / "protoc-gen-mypy_grpc"
    path.write_text(f"#!{sys.executable}\nfrom mypy_protobuf.main import grpc\n\ngrpc()\n")
    path.chmod(0o755)
    return path


def _remove_orphans(out_root: Path, outputs: list[Path]) -> None:
    keep = {out_root / rel for rel in outputs}
    for directory in {(out_root / rel).parent for rel in outputs}:
        for path in directory.iterdir():
            if path.name.endswith(GENERATED_SUFFIXES) and path not in keep:
                path.unlink()


def _write_digest(out_root: Path, digest: str) -> None:
    path = out_root / DIGEST_MODULE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        '"""sha256 of the .proto files the generated modules of this package were made\n'
        'from.  Written by tools/gen_proto.py at install time; do not edit."""\n'
        "\n"
        f'PROTO_DIGEST = "{digest}"\n'
    )
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gen_proto.py", description="Generate kq's protobuf and gRPC modules."
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if the generated code is stale")
    mode.add_argument(
        "--if-stale", action="store_true", help="generate only if the generated code is stale"
    )
    args = parser.parse_args(argv)

    if args.check:
        if is_stale():
            print("gen_proto: generated code is stale", file=sys.stderr)
            return 1
        return 0
    if args.if_stale and not is_stale():
        return 0
    written = generate()
    print(f"gen_proto: generated {', '.join(p.as_posix() for p in written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
