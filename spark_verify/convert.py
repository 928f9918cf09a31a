"""Converting run folders' JSON Lines files to Parquet, for faster verification.

``python -m spark_verify.convert PATH...`` converts each history (a run
folder, a folder of run folders, or a bare ``.jsonl`` history) and each
node's exports:

- ``history.jsonl`` -> ``history.parquet`` beside it (a bare ``x.jsonl`` ->
  ``x.parquet``), with exactly the columns of ``docs/history-format.md``'s
  "Parquet" section: ``index``, ``time``, ``type``, ``process``, ``f``,
  ``key``, ``value``, ``error``, ``node``, ``offset``, ``epoch``;
- ``nodes/<id>/log.jsonl`` -> ``log.parquet`` and ``changes.jsonl`` ->
  ``changes.parquet``: the file's fields, then ``seq`` (the 0-based line of
  the JSON Lines file, the order in which the node committed or observed:
  Parquet part files keep no row order).

Each output is a Spark output *folder* (part files and a ``_SUCCESS``
marker), which Spark, pyarrow and pandas read as one table; it is written
by the executors in parallel, so a history of any size converts without
passing through the driver.  Values are parsed by :mod:`spark_verify.load`
(the value's JSON text keeps its quotes).  An existing output is never
overwritten.

A history with malformed lines is refused (exit status 2) unless
``--no-check``: a line that is not JSON, or a field of the wrong type, would
become a row of NULLs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from pyspark.sql import DataFrame, SparkSession

from spark_verify.load import (
    CHANGES_COLUMNS,
    HISTORY_COLUMNS,
    LOG_COLUMNS,
    RunInput,
    RunInputError,
    history_problems,
    load_history,
    load_node_exports,
)

__all__ = [
    "ConvertError",
    "history_to_parquet",
    "main",
    "node_exports_to_parquet",
]

_SHOWN_PROBLEMS: Final = 10


class ConvertError(ValueError):
    """An input that cannot be converted; the message names it."""


def _history_input(path: Path) -> tuple[RunInput, Path]:
    """The history of a run folder or a bare ``.jsonl`` file, and where its
    Parquet goes."""
    if not path.exists():
        raise ConvertError(f"{path}: no such file or folder")
    if path.is_dir():
        history = path / "history.jsonl"
        if not history.is_file():
            raise ConvertError(f"{path}: no history.jsonl (not a run folder)")
        out = path / "history.parquet"
        name = path.name
    elif path.suffix == ".jsonl":
        history, out, name = path, path.with_suffix(".parquet"), path.stem
    else:
        raise ConvertError(f"{path}: not a run folder nor a .jsonl history")
    # The model plays no part in the conversion.
    return RunInput(name, path, history, "jsonl", None, "", {}), out


def _write(df: DataFrame, out: Path) -> None:
    if out.exists():
        raise ConvertError(f"{out} already exists; remove it to convert again")
    df.write.mode("errorifexists").parquet(str(out))


def history_to_parquet(
    spark: SparkSession,
    run_dir_or_file: str | Path,
    out: str | Path | None = None,
    *,
    check: bool = True,
) -> Path:
    """Convert one history to a Parquet folder (default: ``history.parquet``
    beside ``history.jsonl``, or ``x.parquet`` beside a bare ``x.jsonl``)
    and return its path.  With ``check``, refuse a history that has
    malformed lines (:func:`spark_verify.load.history_problems`), naming
    the first few."""
    run, default = _history_input(Path(run_dir_or_file))
    target = Path(out) if out is not None else default
    if target.exists():
        raise ConvertError(f"{target} already exists; remove it to convert again")
    df = load_history(spark, [run])
    if check:
        bad = (
            history_problems(df)
            .where("kind in ('not-json', 'invalid-op')")
            .orderBy("index")
            .limit(_SHOWN_PROBLEMS)
            .collect()
        )
        if bad:
            shown = "\n".join(f"  {r['kind']}: {r['message']}: {r['line']}" for r in bad)
            raise ConvertError(f"{run.history}: malformed lines (first {len(bad)}):\n{shown}")
    _write(df.select(*[name for name, _ in HISTORY_COLUMNS]), target)
    return target


def node_exports_to_parquet(spark: SparkSession, run_dir: str | Path) -> list[Path]:
    """Convert every ``nodes/<id>/log.jsonl`` and ``changes.jsonl`` of a run
    folder to ``log.parquet`` and ``changes.parquet`` beside them (the
    file's fields, then ``seq``); returns the folders written."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ConvertError(f"{path}: not a run folder")
    written: list[Path] = []
    nodes_dir = path / "nodes"
    if not nodes_dir.is_dir():
        return written
    for sub in sorted(nodes_dir.iterdir(), key=lambda p: p.name):
        if not (sub.is_dir() and sub.name.isdigit()):
            continue
        node = int(sub.name)
        run = RunInput(path.name, path, path / "history.jsonl", "jsonl", None, "", {node: sub})
        log, changes = load_node_exports(spark, [run])
        for stem, df, columns in (("log", log, LOG_COLUMNS), ("changes", changes, CHANGES_COLUMNS)):
            if (sub / f"{stem}.jsonl").is_file():
                target = sub / f"{stem}.parquet"
                _write(df.select(*[n for n, _ in columns], "seq"), target)
                written.append(target)
    return written


def _run_folders(path: Path) -> list[Path]:
    """A run folder itself, or each run folder in a folder of runs."""
    if (path / "history.jsonl").is_file():
        return [path]
    found = sorted(p for p in path.iterdir() if p.is_dir() and (p / "history.jsonl").is_file())
    if not found:
        raise ConvertError(f"{path}: no history.jsonl in it or in any folder under it")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_verify.convert",
        description="Convert run folders' history.jsonl and node exports to Parquet folders "
        "beside them (docs/history-format.md, Parquet).",
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="a run folder, a folder of runs, or a .jsonl"
    )
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")
    parser.add_argument(
        "--no-check", action="store_true", help="convert even if some lines are malformed"
    )
    args = parser.parse_args(argv)
    inputs: list[Path] = []
    try:
        for given in args.paths:
            path = Path(given)
            if not path.exists():
                raise ConvertError(f"{path}: no such file or folder")
            inputs.extend([path] if path.is_file() else _run_folders(path))
    except ConvertError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from spark_verify.session import spark_session

    spark = spark_session(args.master, app_name="kq-convert")
    status = 0
    for path in inputs:
        try:
            out = history_to_parquet(spark, path, check=not args.no_check)
            print(out)
            if path.is_dir():
                for written in node_exports_to_parquet(spark, path):
                    print(written)
        except (ConvertError, RunInputError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
