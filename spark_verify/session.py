"""The Spark session of a verification, on ``local[*]`` or a real cluster.

Under ``spark-submit`` the session (and its master) already exists and is
used as it is.  Run directly, ``spark_session()`` starts one on the given
master (``local[*]`` by default) with settings for a verification job: no web
UI, quiet logs, and Python workers that run this interpreter (so they import
the same ``spark_verify`` and the same pandas and pyarrow as the driver).

PySpark 4 needs a Java 17 or newer runtime; ``java_problem()`` says what is
missing before Spark fails with a JVM stack trace.

``remote_session("sc://host:port")`` is a Spark Connect client of a server
that is already running (``docs/verification.md`` shows how to start one
here): the server keeps its JVM and its Python workers between commands, so
repeated verifications run warm; the client needs no Java.  The server reads
the histories from its own file system (a local server: the same paths).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_MASTER",
    "RETAINED_EXECUTIONS",
    "ConnectError",
    "JavaMissingError",
    "is_remote",
    "java_problem",
    "master_of",
    "parallelism",
    "remote_session",
    "spark_session",
]

DEFAULT_MASTER = "local[*]"
MIN_JAVA = 17
RETAINED_EXECUTIONS = 50
"""How many finished SQL queries the session's listener keeps (the UI's
``spark.sql.ui.retainedExecutions``): a few verifications' worth."""


class JavaMissingError(RuntimeError):
    """No usable Java runtime for Spark."""


class ConnectError(RuntimeError):
    """A Spark Connect server that cannot be used: a bad address, the
    client's packages missing, or no server answering there."""


# What pyspark's Connect client imports beyond the classic one (pyspark[connect]).
_CONNECT_MODULES = ("grpc", "grpc_status", "google.rpc", "pyarrow", "pandas", "zstandard")


def remote_session(url: str, *, app_name: str = "kq-verify") -> SparkSession:
    """A Spark Connect session of the server at ``url`` (``sc://HOST:PORT``).

    Raises :class:`ConnectError` naming what is wrong: the address, the
    client's missing packages, or a server that does not answer.
    """
    import importlib.util

    if not re.match(r"^sc://[^/:]+(:\d+)?(/.*)?$", url):
        raise ConnectError(f"--remote takes sc://HOST:PORT (Spark Connect), got {url!r}")
    missing = []
    for name in _CONNECT_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise ConnectError(
            f"Spark Connect needs {', '.join(missing)}: install kq with its verify extra "
            "(pip install 'kq[verify]')"
        )
    try:
        spark = SparkSession.builder.remote(url).appName(app_name).getOrCreate()
        # The first call that reaches the server: fails here if none answers.
        spark.conf.get("spark.app.name")
    except Exception as exc:  # the client's errors are many (gRPC, Spark's)
        raise ConnectError(f"no Spark Connect server answers at {url}: {exc}") from None
    return spark


def is_remote(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client (no SparkContext here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def master_of(spark: SparkSession) -> str:
    """The session's master; for a Connect session, the server's master."""
    if is_remote(spark):
        return str(spark.conf.get("spark.master", "unknown"))
    return str(spark.sparkContext.master)


def parallelism(spark: SparkSession) -> int:
    """How many tasks the session runs at once (a Connect server's cores: its
    ``spark.default.parallelism`` or, for a local master, its ``local[N]``)."""
    if not is_remote(spark):
        return int(spark.sparkContext.defaultParallelism)
    conf = spark.conf.get("spark.default.parallelism", None)
    if conf:
        return int(conf)
    m = re.match(r"^local\[(\d+)", master_of(spark))
    return int(m.group(1)) if m else os.cpu_count() or 1


def _java_command() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        return candidate if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def java_problem() -> str | None:
    """What keeps Spark from starting here, or None if a Java 17+ runtime is found."""
    java = _java_command()
    if java is None:
        where = (
            f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
            if os.environ.get("JAVA_HOME")
            else "no java on PATH and JAVA_HOME is not set"
        )
        return (
            f"Spark needs a Java {MIN_JAVA}+ runtime: {where}; install one "
            "(Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"Spark needs a Java {MIN_JAVA}+ runtime: running {java} -version failed: {e}"
    text = out.stderr + out.stdout
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if m is None:
        return f"Spark needs a Java {MIN_JAVA}+ runtime: cannot read the version of {java}"
    major = int(m.group(1))
    if major == 1 and m.group(2):  # "1.8.0_392" is Java 8
        major = int(m.group(2))
    if major < MIN_JAVA:
        return f"Spark needs a Java {MIN_JAVA}+ runtime: {java} is Java {major}"
    return None


def spark_session(
    master: str | None = None,
    *,
    app_name: str = "kq-verify",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The active session (``spark-submit``), or a new one on ``master``.

    Raises ``JavaMissingError`` naming what is missing when no Java 17+
    runtime is found.
    """
    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    # spark-submit starts this interpreter with a gateway to its JVM, whose
    # configuration (the master above all) is the one to use.
    submitted = master is None and "PYSPARK_GATEWAY_PORT" in os.environ
    problem = java_problem()
    if problem is not None:
        raise JavaMissingError(problem)
    # Workers of a local master are forked from this machine's python3
    # unless told otherwise, which may lack pyarrow or spark_verify itself.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    chosen = ""
    if not submitted:
        chosen = master or DEFAULT_MASTER
        builder = builder.master(chosen)
    settings: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Keys are grouped by a shuffle; adaptive execution coalesces the
        # default 200 partitions down to what the data needs.
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        # Arrow batches carry whole keys to the checkers in executors.
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Spark's SQL listener keeps every finished query's plan graph and
        # metrics for the UI (spark.sql.ui.retainedExecutions, 1,000 by
        # default), UI or not: a verification runs dozens of queries, so a
        # session kept warm across runs (kq chaos catalogue) would hold
        # gigabytes of them for nothing to read.
        "spark.sql.ui.retainedExecutions": str(RETAINED_EXECUTIONS),
    }
    if chosen.startswith("local"):
        # A local job serves nothing to other hosts: keep the driver's
        # ports (block manager, RPC) on loopback, not on the first interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.host"] = "127.0.0.1"
        # The job sets the shuffle's width from its input's size
        # (spark_verify.job.shuffle_partitions); this is the floor.
        settings["spark.sql.shuffle.partitions"] = str(max(2, 4 * (os.cpu_count() or 1)))
        # Local executors live in the driver's JVM: give it a third of the
        # machine's memory (4 to 16 GiB) unless told otherwise.
        settings["spark.driver.memory"] = os.environ.get(
            "KQ_SPARK_DRIVER_MEMORY", f"{_local_memory_gib()}g"
        )
    settings.update(conf or {})
    if submitted:
        # spark-submit's own --conf settings win over these defaults.
        settings = {k: v for k, v in settings.items() if k not in _submitted_conf()}
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _submitted_conf() -> set[str]:
    """The settings spark-submit gave its JVM (``--conf``, ``--driver-memory``, ...)."""
    from pyspark import SparkConf

    return {k for k, _ in SparkConf().getAll()}


def _local_memory_gib() -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4
    return max(4, min(16, total // (3 * 2**30)))
