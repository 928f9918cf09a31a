"""Build hook: generate kq's protobuf modules whenever the package is built.

All project metadata lives in pyproject.toml.  This file only replaces the
``build_py`` command so that ``pip install .`` and ``pip install -e .`` both
regenerate ``kqproto/*_pb2*.py(i)`` and ``kqproto/_proto_digest.py`` from ``proto/``
with tools/gen_proto.py; generated code is never committed, so it cannot be
stale.  The modules are generated into the source tree (where an editable
install imports them from) and then packaged from there like any module.

It also declares ``partition_log._speedups``, the C version of the leader
append's record check (``partition_log/records.py`` is its reference).  It is
optional: without a C compiler the install goes on and the Python code runs.
So is ``spark_verify._wgl``, the compiled loop of the per-key linearizability
search (Cython; ``spark_verify/wgl.py`` is its reference).
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _gen_proto() -> ModuleType:
    path = os.path.join(HERE, "tools", "gen_proto.py")
    spec = importlib.util.spec_from_file_location("_kq_gen_proto", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithProto(build_py):
    """``build_py`` that generates the protobuf modules first."""

    def run(self) -> None:
        written = _gen_proto().generate()
        self.announce(f"generated {', '.join(str(p) for p in written)}", level=2)
        super().run()


SPEEDUPS = Extension(
    "partition_log._speedups",
    ["partition_log/_speedups.c"],
    # A failed build only warns: partition_log/speedups.py falls back to Python.
    optional=True,
)

WGL = Extension(
    "spark_verify._wgl",
    ["spark_verify/_wgl.pyx"],
    # Cython (a build requirement) turns it into C; a failed build only
    # warns: spark_verify/wgl.py then runs its Python loop.
    optional=True,
)

setup(cmdclass={"build_py": BuildPyWithProto}, ext_modules=[SPEEDUPS, WGL])
