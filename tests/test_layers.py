"""kq's layers, read from the imports (docs/architecture.md is the map).

Every module of kq's packages is parsed with ``ast`` and each of its imports
(at any depth of the file: a function-level import counts too) is checked
against :data:`ALLOWED`, the one list of the edges between layers.  A
module may import its own unit freely; anything else must be listed.  The
import graph between modules must have no cycle, and argparse appears only
in the commands' home and the tools' own entry points.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Every library under the tools: what chaos and bench build on.
LIBRARIES = (
    "bugs",
    "kqproto",
    "history",
    "partition_log",
    "quorum",
    "kvstore",
    "metadata",
    "broker",
    "server",
)

PACKAGES = (*LIBRARIES, "chaos", "spark_verify", "kq", "bench", "tools")
"""Every top-level package (or folder of scripts) of kq."""

UNITS = (
    *PACKAGES,
    "quorum.sim",
    "quorum.driver",
    "kq.commands",
    "broker.sim",
    "broker.grpc_client",
)
"""A module belongs to the longest of these that prefixes its name."""

# What the metadata layer (and later the brokers) may see of the quorum: its
# pure types, the state-machine seam, the RaftClient seam and the plug-in
# seam of the node, and the client library that talks to a quorum over gRPC.
QUORUM_SEAMS = (
    "quorum.types",
    "quorum.listener",
    "quorum.shared_log",
    "quorum.driver.raft_client",
    "quorum.driver.plugin",
    "quorum.driver.client",
)

BOTTOM: tuple[str, ...] = ()

# The deliberate bugs' switch (off unless a process's environment turns it
# on): below every layer of kq, so that each rule's own line can be broken.
BUGS = ("bugs",)


ALLOWED: Mapping[str, tuple[str, ...]] = {
    # The bottom: libraries that import nothing else of kq but the
    # generated protobuf modules.
    "bugs": BOTTOM,
    "kqproto": BOTTOM,
    "history": BOTTOM,
    "partition_log": ("kqproto", *BUGS),
    "quorum": BUGS,
    # The simulator records what it runs in the history format.
    "quorum.sim": ("quorum", "history", *BUGS),
    # The quorum node: the pure core under asyncio, gRPC and RocksDB.
    "quorum.driver": ("quorum", "kqproto", *BUGS),
    # The node's plug-ins: only through the quorum's seams.
    "kvstore": ("kqproto", *QUORUM_SEAMS, *BUGS),
    "metadata": ("kqproto", *QUORUM_SEAMS, *BUGS),
    # Brokers read the metadata image and delta, never the controller.
    "broker": (
        *BUGS,
        "kqproto",
        "partition_log",
        *QUORUM_SEAMS,
        "metadata.records",
        "metadata.image",
        "metadata.delta",
        "metadata.errors",
        "metadata.state_machine",
        "metadata.client",
        # The config definitions (names, Kafka's defaults, validation): a
        # broker builds each log's LogConfig from the image's configs.
        "metadata.configs",
        # The ACL decision (Kafka's StandardAuthorizer, pure) over the
        # image's bindings: the broker's service authorizes every request
        # as the controllers do.
        "metadata.acls",
        "metadata.authorizer",
    ),
    # The broker simulator: brokers and a controller stub in one process,
    # recording histories as the quorum's simulator does.
    "broker.sim": (
        *BUGS,
        "broker",
        "partition_log",
        "metadata.records",
        "metadata.image",
        "history",
    ),
    # The gRPC clients: drivers of the clients' pure core (broker.client),
    # over the broker service's protobufs, with the quorum's channel pool
    # and TLS files for mutual TLS.
    "broker.grpc_client": (
        *BUGS,
        "broker",
        "kqproto",
        "partition_log",
        *QUORUM_SEAMS,
        "quorum.driver.tls",
    ),
    # Process assembly: builds processes out of everything below it.
    "server": (*BUGS, "kqproto", "quorum", "kvstore", "metadata", "broker", "partition_log"),
    # The tools on top; spark_verify stands apart from all of kq.
    "chaos": LIBRARIES,
    "spark_verify": BOTTOM,
    "bench": (*LIBRARIES, "spark_verify", "kq"),  # kq: its version, for the reports
    "tools": BOTTOM,
    # The command line adapts every library (the dispatcher imports its own
    # commands lazily, by name).
    "kq": ("kq.commands",),
    "kq.commands": (*LIBRARIES, "chaos", "spark_verify", "kq"),
}

ARGPARSE_ALLOWED = (
    "kq",  # the commands' home: kq.cli and kq.commands
    "bench",  # benchmark scripts, each its own entry point
    "tools",  # build scripts
    # The tools' own entry points, which run without kq's command line:
    "spark_verify.submit",  # spark-submit's
    "spark_verify.convert",  # python -m spark_verify.convert (Parquet)
    "spark_verify.package",  # python -m spark_verify.package (--py-files)
    "chaos.nfqueue",  # the packet delayer process, standard library only
)


# -- reading the imports --------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def kq_sources() -> dict[str, str]:
    """Module name to source of every module of kq's packages (not the
    generated protobuf code, which imports only google.protobuf and grpc)."""
    sources: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) or ".gen" in path.parts:
                continue
            sources[module_name(path)] = path.read_text()
    return sources


def imports_of(name: str, source: str, known: Iterable[str]) -> set[str]:
    """The kq modules ``name`` imports: ``from a.b import c`` names ``a.b.c``
    when that is a module, else ``a.b``."""
    modules = set(known)
    is_package = any(m.startswith(name + ".") for m in modules)
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                child = f"{base}.{alias.name}"
                targets.append(child if child in modules else base)
        found |= {t for t in targets if t.split(".")[0] in PACKAGES}
    return found


def unit_of(module: str) -> str:
    matches = [u for u in UNITS if module == u or module.startswith(u + ".")]
    return max(matches, key=len)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_violations(sources: Mapping[str, str]) -> list[str]:
    """Every import that crosses the layers against :data:`ALLOWED`."""
    found = []
    for name, source in sorted(sources.items()):
        unit = unit_of(name)
        for target in sorted(imports_of(name, source, sources)):
            if _within(target, unit):
                continue
            if not any(_within(target, allowed) for allowed in ALLOWED[unit]):
                found.append(f"{name} ({unit}) imports {target} ({unit_of(target)})")
    return found


def import_cycles(sources: Mapping[str, str]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a
    module importing itself) of the import graph (Tarjan)."""
    graph = {
        name: imports_of(name, source, sources) & set(sources) for name, source in sources.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def argparse_users(sources: Mapping[str, str]) -> list[str]:
    return sorted(
        name
        for name, source in sources.items()
        if "argparse" in imports_of_any(name, source)
        and not any(_within(name, allowed) for allowed in ARGPARSE_ALLOWED)
    )


def imports_of_any(name: str, source: str) -> set[str]:
    """Top-level names of every module ``source`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


# -- the rules --------------------------------------------------------------------------


def test_every_unit_has_its_edges_listed() -> None:
    assert set(ALLOWED) == set(UNITS)
    sources = kq_sources()
    assert {unit_of(name) for name in sources} <= set(UNITS)


def test_no_module_imports_up_or_across_the_layers() -> None:
    assert layer_violations(kq_sources()) == []


def test_there_is_no_import_cycle() -> None:
    assert import_cycles(kq_sources()) == []


def test_argparse_lives_in_the_commands_home() -> None:
    assert argparse_users(kq_sources()) == []


def test_the_seams_are_where_the_layers_say() -> None:
    sources = kq_sources()
    for seam in ("quorum.driver.raft_client", "quorum.driver.plugin", "quorum.listener"):
        assert seam in sources, seam
    # Nothing of the quorum imports metadata, chaos, brokers or verification
    # (the deliberate bugs' switch, which imports nothing, it may).
    for name, source in sources.items():
        if unit_of(name).startswith("quorum"):
            for target in imports_of(name, source, sources):
                top = target.split(".")[0]
                assert top in ("quorum", "kqproto", "history", "bugs"), (name, target)


# -- the checks fire ----------------------------------------------------------------------


def test_an_upward_import_is_caught() -> None:
    sources = {
        "quorum.core": "from metadata.records import Record\n",
        "metadata.records": "X = 1\n",
    }
    assert layer_violations(sources) == ["quorum.core (quorum) imports metadata.records (metadata)"]


def test_a_reach_past_the_seam_is_caught_even_inside_a_function() -> None:
    sources = {
        "metadata.active": "def f():\n    from quorum.driver.node import QuorumNode\n",
        "quorum.driver.node": "X = 1\n",
    }
    assert layer_violations(sources) == [
        "metadata.active (metadata) imports quorum.driver.node (quorum.driver)"
    ]


def test_a_sideways_import_between_tools_is_caught() -> None:
    sources = {"spark_verify.job": "import chaos.runner\n", "chaos.runner": "X = 1\n"}
    assert layer_violations(sources) == [
        "spark_verify.job (spark_verify) imports chaos.runner (chaos)"
    ]


def test_a_cycle_through_a_lazy_import_is_caught() -> None:
    sources = {
        "kq.commands.a": "from kq.commands.b import x\n",
        "kq.commands.b": "def x():\n    from kq.commands import a\n",
        "kq.commands": "",
        "kq.commands.c": "from kq.commands.a import y\n",
    }
    assert import_cycles(sources) == [["kq.commands.a", "kq.commands.b"]]


def test_argparse_outside_the_commands_is_caught() -> None:
    sources = {"server.config": "import argparse\n", "kq.commands.x": "import argparse\n"}
    assert argparse_users(sources) == ["server.config"]
