"""Reading run folders into Spark: histories, their per-line problems, node exports.

``docs/history-format.md`` is the contract.  A history line becomes one row
with the columns of its "Parquet" section (``index``, ``time``, ``type``,
``process``, ``f``, ``key``, ``value``, ``error``, ``node``, ``offset``,
``epoch``) plus ``run`` (the run's name), ``line`` (the raw JSON text, to
quote in problems) and ``file_line`` (the 1-based line number in the file).

Lines are parsed in the JVM, never by a Python UDF (a run of ten million
lines must not cross into Python): ``from_json`` with the history's schema,
in which ``value`` is a Spark 4 VARIANT rendered back with ``to_json``.
Spark's JSON reader with a string type for ``value`` would drop the quotes
of a string value (``"v0-1"`` read as ``v0-1``); the variant keeps the
value's JSON text, so ``"v0-1"`` and ``["v0-1","v2-1"]`` come out as JSON,
and a JSON ``null`` as SQL NULL.  The text is the variant's rendering:
compact, and an object's keys in sorted order (a variant stores them
sorted), so equal values have equal text.

Loading is lenient where checking is not: an integer field of the wrong
type loads as NULL, a string field holding another JSON type loads as its
text, and :func:`history_problems` reports both, strictly
(``schema_of_variant``: ``variant_get`` alone would cast the string ``"5"``
or the decimal ``5.0`` to 5, where the reference reader,
``history.files.read_history``, refuses both).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark_verify.jepsen import EdnHistory, EdnHistoryError, read_edn_history
from spark_verify.ops import JEPSEN_MODELS, KNOWN_MODELS

__all__ = [
    "CHANGES_COLUMNS",
    "GROUP_FIELDS",
    "HISTORY_COLUMNS",
    "KNOWN_MODELS",
    "LOG_COLUMNS",
    "PROBLEM_COLUMNS",
    "RunInput",
    "HistoryReadError",
    "RunInputError",
    "Unreadable",
    "find_runs",
    "history_problems",
    "load_history",
    "load_node_exports",
    "op_line",
    "spark_path",
]


GROUP_FIELDS: Final = ("assigned", "revoked")
"""Optional fields of a ``queue`` poll's ``ok`` line (``history.ops.GROUP_FIELDS``),
kept in the raw ``line`` only (Parquet histories do not carry them)."""

HISTORY_COLUMNS: Final = (
    ("index", "bigint"),
    ("time", "bigint"),
    ("type", "string"),
    ("process", "string"),
    ("f", "string"),
    ("key", "string"),
    ("value", "string"),
    ("error", "string"),
    ("node", "bigint"),
    ("offset", "bigint"),
    ("epoch", "bigint"),
)
"""The history's Parquet columns and Spark types, in order."""

LOG_COLUMNS: Final = (
    ("node", "bigint"),
    ("offset", "bigint"),
    ("epoch", "bigint"),
    ("kind", "string"),
    ("hash", "string"),
)
CHANGES_COLUMNS: Final = (
    ("node", "bigint"),
    ("time", "bigint"),
    ("epoch", "bigint"),
    ("leader", "bigint"),
    ("role", "string"),
)
PROBLEM_COLUMNS: Final = ("run", "index", "kind", "message", "line")

_OP_TYPES: Final = ("invoke", "ok", "fail", "info")
_REQUIRED: Final = ("index", "time", "type", "process", "f")
_COUNTS: Final = ("index", "time", "node", "offset", "epoch")
_STRINGS: Final = ("type", "f", "key", "error")
_PER_NODE_FAULTS: Final = ("kill", "start", "pause", "resume")
_NEMESIS: Final = "nemesis"
_HISTORY_FILES: Final = ("history.parquet", "history.jsonl", "history.edn")
# Hadoop expands these in a path given to a reader; a backslash escapes them.
_GLOB = re.compile(r"([\\{}\[\]*?])")


class RunInputError(ValueError):
    """A path that is not a readable run, runs folder or history file."""


class HistoryReadError(RunInputError):
    """A history file that is there but cannot be read (``history.edn`` that
    is not EDN, an op map without its ``:type``, ...): "cannot verify"."""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A run whose history could not be read: its verdict is "cannot verify"."""

    name: str
    path: Path
    message: str


@dataclass(frozen=True, slots=True)
class RunInput:
    """One history to verify, and what came with it.

    ``name`` is the run folder's name (a bare file's stem): the ``run``
    column.  ``config`` is ``config.json`` (None for a bare file or a folder
    without one); ``nodes`` maps each node id to its ``nodes/<id>/`` folder.
    """

    name: str
    path: Path
    history: Path
    fmt: str
    config: dict[str, Any] | None
    model: str
    nodes: Mapping[int, Path]
    edn: EdnHistory | None = None
    """A Jepsen ``history.edn``, read (``fmt`` ``edn``)."""


def find_runs(
    paths: Sequence[str | Path],
    *,
    model: str | None = None,
    known_models: Sequence[str] = KNOWN_MODELS,
    unreadable: list[Unreadable] | None = None,
) -> list[RunInput]:
    """The runs under ``paths``: run folders, folders of run folders, or bare
    history files (``.jsonl``, or ``.parquet`` as a file or a Spark output
    folder).  ``model`` supplies or overrides every run's model.

    Raises :class:`RunInputError` naming the path for anything that cannot be
    read as a run, and for two runs with the same name (the ``run`` column
    would mix them).  With ``unreadable``, a history that is there but
    cannot be read (:class:`HistoryReadError`) is added to it instead, so
    that the other runs are still verified.
    """
    if model is not None:
        # Jepsen's (Knossos') names of kq's models: cas-register is register.
        model = JEPSEN_MODELS.get(model, model)
    if model is not None and model not in known_models:
        raise RunInputError(_unknown_model(model, "--model", known_models))
    if not paths:
        raise RunInputError("no run given: pass run folders, runs folders or history files")
    runs: list[RunInput] = []

    def take(path: Path, read: Any) -> None:
        try:
            runs.append(read(path, model, known_models))
        except HistoryReadError as exc:
            if unreadable is None:
                raise
            unreadable.append(
                Unreadable(path.stem if path.is_file() else path.name, path, str(exc))
            )

    for given in paths:
        path = Path(given)
        if not path.exists():
            raise RunInputError(f"{path}: no such file or folder")
        if _is_bare_history(path):
            take(path, _bare_run)
        elif path.is_dir() and _looks_like_run(path):
            take(path, _folder_run)
        elif path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_dir() and _looks_like_run(p))
            # A Jepsen store's "latest" is a link to one of the others.
            real = {p.resolve() for p in found if not p.is_symlink()}
            found = [p for p in found if not (p.is_symlink() and p.resolve() in real)]
            if not found:
                raise RunInputError(
                    f"{path}: neither a run folder (config.json and history.jsonl or "
                    "history.parquet) nor a folder of run folders"
                )
            for p in found:
                take(p, _folder_run)
        else:
            raise RunInputError(
                f"{path}: not a history file (.jsonl, .edn or .parquet) nor a run folder"
            )
    seen: dict[str, Path] = {}
    for run in runs:
        if run.name in seen:
            raise RunInputError(
                f"two runs named {run.name!r}: {seen[run.name]} and {run.path}; "
                "rename one (the run column tells runs apart by name)"
            )
        seen[run.name] = run.path
    return runs


def _is_bare_history(path: Path) -> bool:
    if path.suffix == ".parquet":
        return True
    return path.is_file() and path.suffix in (".jsonl", ".edn")


def _looks_like_run(path: Path) -> bool:
    return any((path / name).exists() for name in (*_HISTORY_FILES, "config.json"))


def _unknown_model(model: object, where: str, known: Sequence[str]) -> str:
    return f"{where}: unknown model {model!r}; known models: {', '.join(known)}"


def _edn_run(
    name: str, path: Path, history: Path, config: dict[str, Any] | None, model: str | None
) -> RunInput:
    """A Jepsen history: read now (it is converted in the driver), its model
    given, or else the one its ``:f`` values suggest (``kv`` with a delete,
    get, put or append; else ``register``)."""
    try:
        edn = read_edn_history(history)
    except EdnHistoryError as exc:
        raise HistoryReadError(str(exc)) from None
    return RunInput(name, path, history, "edn", config, model or edn.model, {}, edn)


def _bare_run(path: Path, model: str | None, known: Sequence[str]) -> RunInput:
    if path.suffix == ".edn":
        return _edn_run(path.stem, path, path, None, model)
    if model is None:
        raise RunInputError(
            f"{path}: a bare history file has no config.json naming its model; pass --model "
            f"({', '.join(known)})"
        )
    fmt = "parquet" if path.suffix == ".parquet" else "jsonl"
    return RunInput(path.stem, path, path, fmt, None, model, {})


def _folder_run(path: Path, model: str | None, known: Sequence[str]) -> RunInput:
    history = next((path / n for n in _HISTORY_FILES if (path / n).exists()), None)
    if history is None:
        raise RunInputError(f"{path}: no history.jsonl or history.parquet")
    config = _read_config(path / "config.json")
    chosen = model
    if chosen is None and config is not None:
        chosen = config.get("model")
        if chosen is not None and (not isinstance(chosen, str) or chosen not in known):
            raise RunInputError(_unknown_model(chosen, str(path / "config.json"), known))
    if history.suffix == ".edn":
        return _edn_run(path.name, path, history, config, chosen)
    if chosen is None:
        raise RunInputError(
            f"{path}: no model in config.json (or no config.json); pass --model "
            f"({', '.join(known)})"
        )
    nodes: dict[int, Path] = {}
    if (path / "nodes").is_dir():
        for sub in sorted((path / "nodes").iterdir()):
            if sub.is_dir() and sub.name.isdigit():
                nodes[int(sub.name)] = sub
    fmt = "parquet" if history.suffix == ".parquet" else "jsonl"
    return RunInput(path.name, path, history, fmt, config, chosen, dict(sorted(nodes.items())))


def _read_config(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise RunInputError(f"{path}: not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise RunInputError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def spark_path(path: Path) -> str:
    """``path`` as a reader takes it: Hadoop would expand ``*``, ``?``,
    ``[...]`` and ``{...}`` in it as a glob."""
    return _GLOB.sub(r"\\\1", str(path.resolve()))


# -- histories -------------------------------------------------------------------


def _ddl(columns: Sequence[tuple[str, str]], value: str = "variant") -> str:
    return ", ".join(f"`{n}` {value if n == 'value' else t}" for n, t in columns)


def _parse_lines(
    df: DataFrame, keep: Sequence[str], columns: Sequence[tuple[str, str]] = HISTORY_COLUMNS
) -> DataFrame:
    """``keep`` and the typed columns parsed from ``df.line`` (NULL where
    absent).

    ``from_json`` (Jackson, in the JVM) is about three times faster here
    than extracting each field from a variant.  Its integers are strict (a
    string "5", a decimal 5.0, a boolean or an overflowing number is NULL);
    its strings are lenient (the number 3 reads as "3"), so
    :func:`history_problems` checks every type again on the variant.
    ``value`` is read as a VARIANT and rendered back with ``to_json``.

    The parsed struct is its own projection: used inline, the optimizer
    would give each field its own ``from_json``, parsing the line once per
    field.
    """
    parsed = df.select(*keep, F.from_json(F.col("line"), _ddl(columns)).alias("_j"))
    out: list[Column] = []
    for name, _ in columns:
        col = F.col("_j").getField(name)
        if name == "value":
            col = F.when(~F.is_variant_null(col), F.to_json(col))
        elif name == "process":
            # The decimal text of a process number, or "nemesis"; anything
            # else (a negative or fractional number, an object) is NULL.
            col = F.when(col.rlike("^(0|[1-9][0-9]*)$") | (col == _NEMESIS), col)
        out.append(col.alias(name))
    return parsed.select(*keep, *out)


def _read_jsonl(spark: SparkSession, run: RunInput) -> DataFrame:
    return spark.read.text(spark_path(run.history)).select(
        F.lit(run.name).alias("run"), F.col("value").alias("line")
    )


# Characters a path may hold for Spark's ``_metadata.file_path`` ("file:"
# and the path, as Hadoop's Path URI renders it) to be the path itself.
_PLAIN_PATH: Final = re.compile(r"^/[A-Za-z0-9_.~/-]*$")
_NO_RUN: Final = "kq verify: read a history file no run names: "


def _read_jsonl_together(spark: SparkSession, runs: Sequence[RunInput]) -> DataFrame:
    """The JSON Lines histories of ``runs`` as one text scan (one job's
    tasks over all files, not a scan per file), each line's run found from
    its file (``_metadata.file_path``).  Only for plainly named local files
    (:data:`_PLAIN_PATH`): others are read one scan each."""
    return _read_files_together(spark, {str(r.history.resolve()): r.name for r in runs})


def _read_files_together(spark: SparkSession, files: Mapping[str, str]) -> DataFrame:
    """One text scan of ``files`` (absolute paths), each line with its file's run."""
    names = {f"file:{path}": name for path, name in files.items()}
    mapping = F.create_map(*[F.lit(x) for pair in names.items() for x in pair])
    df = spark.read.text(list(files))
    path = F.col("_metadata.file_path")
    # A file whose path Spark renders otherwise must fail loudly: its lines
    # dropped would verify an empty history.
    run = F.when(mapping[path].isNull(), F.raise_error(F.concat(F.lit(_NO_RUN), path)))
    return df.select(run.otherwise(mapping[path]).alias("run"), F.col("value").alias("line"))


def _plain(run: RunInput) -> bool:
    path = str(run.history.resolve())
    return run.history.is_file() and _PLAIN_PATH.match(path) is not None


def _with_file_lines(raw: DataFrame, keys: Sequence[str] = ("run",)) -> DataFrame:
    """Number each line within its file (1-based), without a sort of the data.

    ``keys`` name the file (each value of them is one file).  Assumption:
    a text scan's partitions hold a file's byte ranges in ascending order
    (Spark splits a file into equal ranges and a shorter last one, and
    orders them by length, a stable sort, so the order holds), a partition
    reads each of its ranges whole and in turn (so one file's lines in it
    are contiguous, when small files share a partition), and ``union``
    concatenates the scans' partitions.  Then ``monotonically_increasing_id``
    (partition << 33 | position in the partition) ascends along each file,
    and a line's number is the count of the file's lines in earlier
    partitions plus its position after the file's first line in its
    partition.  The counts per partition are a small table (one row per
    partition), joined back by broadcast; computing them reads the text once
    more (about a second per million lines on two cores), not parsed.
    """
    ided = raw.withColumn("_id", F.monotonically_increasing_id()).select(
        "*",
        F.shiftright("_id", 33).alias("_part"),
        (F.col("_id").bitwiseAND(F.lit((1 << 33) - 1))).alias("_pos"),
    )
    counts = ided.groupBy(*keys, "_part").agg(
        F.count(F.lit(1)).alias("_n"), F.min("_pos").alias("_first")
    )
    before = Window.partitionBy(*keys).orderBy("_part").rowsBetween(Window.unboundedPreceding, -1)
    starts = counts.select(
        *keys,
        "_part",
        (F.coalesce(F.sum("_n").over(before), F.lit(0)) - F.col("_first")).alias("_start"),
    )
    return (
        ided.join(F.broadcast(starts), [*keys, "_part"])
        .withColumn("file_line", F.col("_start") + F.col("_pos") + 1)
        .drop("_id", "_part", "_pos", "_start")
    )


def _read_parquet_history(spark: SparkSession, run: RunInput) -> DataFrame:
    df = spark.read.parquet(spark_path(run.history))
    present = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    missing = [name for name, _ in HISTORY_COLUMNS if name not in present]
    if missing:
        raise RunInputError(f"{run.history}: no column(s) {', '.join(missing)}")
    unknown = sorted(set(present) - {name for name, _ in HISTORY_COLUMNS} - {"run"})
    if unknown:
        raise RunInputError(f"{run.history}: unknown column(s) {', '.join(unknown)}")
    wrong = [
        f"{name} is {present[name]}"
        for name, kind in HISTORY_COLUMNS
        if present[name] != kind and not (kind == "bigint" and present[name] in ("int", "smallint"))
    ]
    if wrong:
        raise RunInputError(
            f"{run.history}: wrong column type(s): {', '.join(wrong)} "
            "(docs/history-format.md, Parquet: integers int64, the rest strings)"
        )
    # A table of many runs has its own run column (docs: Parquet).
    run_col = F.col("run").cast("string") if "run" in present else F.lit(run.name)
    return df.select(
        run_col.alias("run"),
        *[F.col(name).cast(kind).alias(name) for name, kind in HISTORY_COLUMNS],
        F.lit(None).cast("string").alias("line"),
        F.lit(None).cast("bigint").alias("file_line"),
    )


def load_history(spark: SparkSession, runs: Sequence[RunInput]) -> DataFrame:
    """Every line of every run's history, one row each:
    ``run``, the Parquet columns, ``line`` (the raw text; NULL for Parquet
    input) and ``file_line`` (1-based line number in the file; NULL for
    Parquet input).  Lazy: nothing is read until an action runs."""
    if not runs:
        raise RunInputError("no runs to load")
    parts: list[DataFrame] = []
    jsonl = [r for r in runs if r.fmt == "jsonl"]
    if jsonl:
        # Many small histories cost one scan, not one each (a scan is a
        # stage's worth of tasks and planning).
        plain = [r for r in jsonl if _plain(r)]
        scans = [_read_jsonl(spark, r) for r in jsonl if not _plain(r)]
        if plain:
            scans.insert(0, _read_jsonl_together(spark, plain))
        raw = reduce(DataFrame.union, scans)
        numbered = _with_file_lines(raw)
        parts.append(
            _parse_lines(numbered, ["run", "line", "file_line"]).select(
                "run", *[n for n, _ in HISTORY_COLUMNS], "line", "file_line"
            )
        )
    parts.extend(_read_parquet_history(spark, r) for r in runs if r.fmt == "parquet")
    edn = [r for r in runs if r.edn is not None]
    if edn:
        # Read and checked in the driver (spark_verify.jepsen): its lines are
        # kq's, renumbered, and its errors named the EDN file's lines, so
        # file_line is NULL here (no "line i holds index i - 1" rule).
        rows = [(r.name, line) for r in edn if r.edn is not None for line in r.edn.lines]
        lines = spark.createDataFrame(rows, "run string, line string").withColumn(
            "file_line", F.lit(None).cast("bigint")
        )
        parts.append(
            _parse_lines(lines, ["run", "line", "file_line"]).select(
                "run", *[n for n, _ in HISTORY_COLUMNS], "line", "file_line"
            )
        )
    return reduce(DataFrame.unionByName, parts)


def op_line(df: DataFrame) -> Column:
    """The op's line as JSON text: the raw ``line`` when there is one, else
    rebuilt from the columns (Parquet input), fields in the order a writer
    puts them."""
    value = F.try_parse_json(F.coalesce(F.col("value"), F.lit("null")))
    rebuilt = F.to_json(
        F.struct(
            *[F.col(n).alias(n) for n, _ in HISTORY_COLUMNS[:6]],
            value.alias("value"),
            *[F.col(n).alias(n) for n, _ in HISTORY_COLUMNS[7:]],
        )
    )
    return F.coalesce(df["line"], rebuilt) if "line" in df.columns else rebuilt


def history_problems(df: DataFrame) -> DataFrame:
    """Per-line problems of a :func:`load_history` frame, found in Spark:
    ``run``, ``index`` (NULL when the line has none), ``kind``, ``message``,
    ``line``.

    Kinds (``docs/history-format.md``, well-formedness): ``not-json`` (a
    blank line, not JSON, or not a JSON object); ``invalid-op`` (unknown or
    missing fields, wrong types, a bad ``type``, ``error`` missing on
    info or present on invoke/ok, a version on an invoke, a nemesis op
    with a key or version or a non-object value, or without ``value.nodes``
    where it needs them; every message of a line in one row, joined by
    "; "); ``index`` (a JSONL line whose ``index`` is not its line number
    minus one).  Parquet input has no raw text: its column types are
    already checked, and ``line`` quotes the row rebuilt as JSON.
    """
    # Fast path: a line that is exactly what a writer makes of its parsed
    # fields (history.files's field order, compact, no escapes) is well typed
    # and has no unknown or missing field: parsing its fields back gave
    # those very strings and integers.  Only the other lines (none, in a
    # well-formed kq history) are parsed again as a variant and checked
    # field by field.  The parse is its own projection so that it runs once
    # per line, not once per check.
    staged = (
        df.select("*", F.col("line").isNotNull().alias("_text"))
        .select(
            "*",
            (F.col("_text") & ~F.coalesce(F.col("line") == _canonical_line(), F.lit(False))).alias(
                "_slow"
            ),
        )
        .select("*", F.when(F.col("_slow"), F.try_parse_json(F.col("line"))).alias("_v"))
    )
    has_text = F.col("_slow")
    v = F.col("_v")
    where = F.concat(F.lit("line "), F.coalesce(F.col("file_line").cast("string"), F.lit("?")))
    not_json = (
        F.when(has_text & (F.trim(F.col("line")) == ""), F.concat(where, F.lit(": blank line")))
        .when(has_text & v.isNull(), F.concat(where, F.lit(": not JSON")))
        .when(
            has_text & ~F.startswith(F.schema_of_variant(v), F.lit("OBJECT")),
            F.concat(where, F.lit(": not a JSON object")),
        )
    )
    # A queue poll's consumer-group fields (docs/history-format.md, `queue`),
    # read from the line by spark_verify.groups, not columns of their own.
    known = F.array(*[F.lit(n) for n, _ in HISTORY_COLUMNS], *[F.lit(n) for n in GROUP_FIELDS])
    keys = F.map_keys(F.try_variant_get(v, "$", "map<string,variant>"))
    unknown = F.array_except(keys, known)
    messages: list[Column] = [
        F.when(
            has_text & (F.size(unknown) > 0),
            F.concat(F.lit("unknown field(s) "), F.array_join(F.array_sort(unknown), ", ")),
        )
    ]
    missing = F.array_compact(
        F.array(*[F.when(~F.array_contains(keys, n), F.lit(n)) for n in _REQUIRED])
    )
    messages.append(
        F.when(
            has_text & (F.size(missing) > 0),
            F.concat(F.lit("missing field(s) "), F.array_join(missing, ", ")),
        )
    )
    for name, _ in HISTORY_COLUMNS:
        messages.append(
            F.when(has_text, _type_message(name, F.variant_get(v, f"$.{name}", "variant")))
        )
    messages.extend(_column_messages(~F.col("_slow")))
    all_messages = F.array_compact(F.array(*messages))
    invalid = F.when(
        not_json.isNull() & (F.size(all_messages) > 0), F.array_join(all_messages, "; ")
    )
    index_due = F.when(
        not_json.isNull()
        & F.col("file_line").isNotNull()
        & F.col("index").isNotNull()
        & (F.col("index") != F.col("file_line") - 1),
        F.concat(
            where,
            F.lit(" has index "),
            F.col("index").cast("string"),
            F.lit(" where "),
            (F.col("file_line") - 1).cast("string"),
            F.lit(" was due (line i holds index i - 1, counting lines from 1)"),
        ),
    )
    found = F.array_compact(
        F.array(
            F.when(
                not_json.isNotNull(), F.struct(F.lit("not-json").alias("k"), not_json.alias("m"))
            ),
            F.when(
                invalid.isNotNull(), F.struct(F.lit("invalid-op").alias("k"), invalid.alias("m"))
            ),
            F.when(
                index_due.isNotNull(), F.struct(F.lit("index").alias("k"), index_due.alias("m"))
            ),
        )
    )
    return staged.select(
        "run", "index", op_line(df).alias("line"), F.explode(found).alias("p")
    ).select(
        "run",
        F.when(F.col("p.k") != "not-json", F.col("index")).alias("index"),
        F.col("p.k").alias("kind"),
        F.col("p.m").alias("message"),
        "line",
    )


def _type_message(name: str, x: Column) -> Column:
    """What is wrong with field ``name`` of a line, ``x`` its variant (SQL
    NULL when absent): the reference reader's rules (``history.ops.op_problems``),
    strict about JSON types.  A JSON null is allowed where the field is
    optional and is a wrong type where it is required."""
    kind = F.schema_of_variant(x)
    shown = F.to_json(x)
    present = x.isNotNull() if name in _REQUIRED else x.isNotNull() & ~F.is_variant_null(x)
    if name in _COUNTS:
        bad = (kind != "BIGINT") | (F.try_variant_get(x, "$", "bigint") < 0)
        text = f"{name} must be an integer >= 0, got "
    elif name in ("f", "error"):
        bad = (kind != "STRING") | (F.try_variant_get(x, "$", "string") == "")
        text = f"{name} must be a non-empty string, got "
    elif name == "key":
        bad = kind != "STRING"
        text = "key must be a string, got "
    elif name == "type":
        bad = (kind != "STRING") | ~F.try_variant_get(x, "$", "string").isin(*_OP_TYPES)
        text = f"type must be one of {', '.join(_OP_TYPES)}, got "
    elif name == "process":
        bad = ~(
            ((kind == "BIGINT") & (F.try_variant_get(x, "$", "bigint") >= 0))
            | ((kind == "STRING") & (F.try_variant_get(x, "$", "string") == _NEMESIS))
        )
        text = "process must be an integer >= 0 or 'nemesis', got "
    else:  # value: any JSON
        return F.lit(None).cast("string")
    return F.when(present & bad, F.concat(F.lit(text), shown))


def _canonical_line() -> Column:
    """The line a writer makes of the typed columns (``Op.to_line``), or
    NULL when a required field is NULL."""
    c = F.col

    def quoted(name: str) -> Column:
        return F.concat(F.lit('"'), c(name), F.lit('"'))

    def optional(name: str, text: Column) -> Column:
        return F.when(c(name).isNull(), F.lit("")).otherwise(F.concat(F.lit(f',"{name}":'), text))

    process = F.when(c("process") == _NEMESIS, F.lit(f'"{_NEMESIS}"')).otherwise(c("process"))
    return F.concat(
        F.lit('{"index":'),
        c("index").cast("string"),
        F.lit(',"time":'),
        c("time").cast("string"),
        F.lit(',"type":'),
        quoted("type"),
        F.lit(',"process":'),
        process,
        F.lit(',"f":'),
        quoted("f"),
        optional("key", quoted("key")),
        F.lit(',"value":'),
        F.coalesce(c("value"), F.lit("null")),
        optional("error", quoted("error")),
        *[optional(n, c(n).cast("string")) for n in ("node", "offset", "epoch")],
        F.lit("}"),
    )


def _column_messages(typed: Column) -> list[Column]:
    """Rules on the typed columns, for JSONL and Parquet input alike.
    ``typed`` marks the rows whose field types were not checked on the
    text: Parquet rows and the lines of the fast path, whose ranges and
    ``type`` values are checked here."""
    has_text = ~typed
    c = F.col
    nemesis = c("process") == _NEMESIS
    out = [
        # Parquet input has no text to say a field is missing.
        F.when(
            ~has_text,
            F.when(
                F.size(
                    F.array_compact(F.array(*[F.when(c(n).isNull(), F.lit(n)) for n in _REQUIRED]))
                )
                > 0,
                F.concat(
                    F.lit("missing field(s) "),
                    F.array_join(
                        F.array_compact(
                            F.array(*[F.when(c(n).isNull(), F.lit(n)) for n in _REQUIRED])
                        ),
                        ", ",
                    ),
                ),
            ),
        ),
        F.when(
            ~has_text & (c("type").isNotNull() & ~c("type").isin(*_OP_TYPES)),
            F.concat(F.lit(f"type must be one of {', '.join(_OP_TYPES)}, got "), c("type")),
        ),
        F.when(
            ~has_text & c("process").isNotNull() & ~(c("process").rlike("^[0-9]+$") | nemesis),
            F.concat(F.lit("process must be an integer >= 0 or 'nemesis', got "), c("process")),
        ),
        *[
            F.when(
                ~has_text & (c(n) < 0),
                F.concat(F.lit(f"{n} must be an integer >= 0, got "), c(n).cast("string")),
            )
            for n in _COUNTS
        ],
        F.when(
            c("type").isin("invoke", "ok") & c("error").isNotNull(),
            F.concat(F.lit("an "), c("type"), F.lit(" carries no error, got "), c("error")),
        ),
        # A fail needs no error: Jepsen's clients often leave it out, and a
        # fail is a definite outcome without it (the op did not happen).
        F.when(
            (c("type") == "info") & c("error").isNull(),
            F.lit("an info needs an error saying why"),
        ),
        F.when(
            (c("type") == "invoke") & (c("offset").isNotNull() | c("epoch").isNotNull()),
            F.lit("an invoke carries no offset or epoch (versions come with completions)"),
        ),
        F.when(
            nemesis & (c("key").isNotNull() | c("offset").isNotNull() | c("epoch").isNotNull()),
            F.lit("a nemesis op carries no key, offset or epoch"),
        ),
    ]
    value = F.try_parse_json(c("value"))
    is_object = F.startswith(F.schema_of_variant(value), F.lit("OBJECT"))
    nodes = F.variant_get(value, "$.nodes", "variant")
    nodes_type = F.schema_of_variant(nodes)
    node_list = F.when(
        nodes_type == "ARRAY<BIGINT>",
        F.forall(F.variant_get(nodes, "$", "array<bigint>"), lambda n: n >= 0),
    ).otherwise(nodes_type == "ARRAY<VOID>")  # [] is a list of node ids too
    out.append(
        F.when(
            nemesis,
            F.when(
                c("value").isNull() | ~is_object,
                F.concat(
                    F.lit("a nemesis op's value must be an object, got "),
                    F.coalesce(c("value"), F.lit("null")),
                ),
            ).when(
                c("f").isin(*_PER_NODE_FAULTS) & ~F.coalesce(node_list, F.lit(False)),
                F.concat(
                    F.lit("a nemesis "), c("f"), F.lit(" needs value.nodes, a list of node ids")
                ),
            ),
        )
    )
    return out


# -- node exports ----------------------------------------------------------------


def _export_parquet(
    run: RunInput, node: int, path: Path, df: DataFrame, columns: Sequence[tuple[str, str]]
) -> DataFrame:
    present = {f.name for f in df.schema.fields}
    missing = [n for n, _ in columns if n not in present]
    if "seq" not in present:
        missing.append("seq")
    if missing:
        raise RunInputError(f"{path}: no column(s) {', '.join(missing)}")
    return df.select(
        F.lit(run.name).alias("run"),
        F.col("node").cast("bigint").alias("node"),
        F.col("seq").cast("bigint").alias("seq"),
        *[F.col(n).cast(t).alias(n) for n, t in columns if n != "node"],
    )


def _load_exports(
    spark: SparkSession, runs: Sequence[RunInput], stem: str, columns: Sequence[tuple[str, str]]
) -> DataFrame:
    parts: list[DataFrame] = []
    texts: list[DataFrame] = []
    for run in runs:
        for node, folder in run.nodes.items():
            parquet, jsonl = folder / f"{stem}.parquet", folder / f"{stem}.jsonl"
            if parquet.exists():
                df = spark.read.parquet(spark_path(parquet))
                parts.append(_export_parquet(run, node, parquet, df, columns))
            elif jsonl.exists():
                texts.append(
                    spark.read.text(spark_path(jsonl)).select(
                        F.lit(run.name).alias("run"),
                        F.lit(node).alias("_file"),
                        F.col("value").alias("line"),
                    )
                )
    if texts:
        numbered = _with_file_lines(reduce(DataFrame.union, texts), ("run", "_file"))
        parsed = _parse_lines(
            numbered.withColumn("seq", F.col("file_line") - 1), ["run", "seq"], columns
        )
        parts.append(parsed.select("run", "node", "seq", *[n for n, _ in columns if n != "node"]))
    return _union_or_empty(spark, parts, columns)


def load_node_exports(spark: SparkSession, runs: Sequence[RunInput]) -> tuple[DataFrame, DataFrame]:
    """Every node's ``log`` and ``changes`` exports as two frames, with the
    LOG and CHANGES columns: ``run``, ``node``, ``seq`` (the 0-based line of
    the node's file: the order the node committed or observed), then the
    file's fields (``node`` is the line's own field).  ``log.parquet`` and
    ``changes.parquet`` (with a ``seq`` column, as :mod:`spark_verify.convert`
    writes them) are read in place of the JSON Lines files when present.  A
    field absent or of the wrong type is NULL (``kq chaos check`` reports
    malformed export lines).  Runs without exports give no rows."""
    return (
        _load_exports(spark, runs, "log", LOG_COLUMNS),
        _load_exports(spark, runs, "changes", CHANGES_COLUMNS),
    )


def _union_or_empty(
    spark: SparkSession, parts: list[DataFrame], columns: Sequence[tuple[str, str]]
) -> DataFrame:
    names = ["run", "node", "seq", *[n for n, _ in columns if n != "node"]]
    if parts:
        return reduce(DataFrame.unionByName, parts).select(*names)
    types = dict(columns)
    ddl = ", ".join(f"`{n}` {types.get(n, 'string' if n == 'run' else 'bigint')}" for n in names)
    return spark.createDataFrame([], ddl)
