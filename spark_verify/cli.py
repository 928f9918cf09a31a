"""``kq verify``: check run folders with Spark and say whether they were valid.

    kq verify RUN_DIR... [--master local[*]|spark://HOST:PORT] [--model NAME]
              [--key-budget SECONDS] [--out DIR] [--no-report] [--json]

Exit status: 0 every check passed (``valid`` true); 1 a check found an anomaly
(``valid`` false); 3 no anomaly, but some check could not decide (``valid``
``unknown``: a key's search ran out of its budget, say); 2 bad usage or input
(no run under a path, an unknown model, a history with no model); 4 Spark could
not run (no Java 17+, say).  The same :func:`main` runs under ``spark-submit``
(:mod:`spark_verify.submit`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from spark_verify.ops import KNOWN_MODELS

if TYPE_CHECKING:
    from spark_verify.job import Verification

__all__ = [
    "EXIT_INVALID",
    "EXIT_SPARK",
    "EXIT_UNKNOWN",
    "CannotVerify",
    "build_parser",
    "exit_status",
    "main",
    "register",
    "run_verification",
    "summary_text",
]

EXIT_VALID: Final = 0
EXIT_INVALID: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNKNOWN: Final = 3
EXIT_SPARK: Final = 4



def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders, folders of run folders (a runs dir), or history files "
        "(.jsonl or .parquet) from other tools",
    )
    parser.add_argument(
        "--master",
        help="the Spark master: local[*] (default), local[N], spark://HOST:PORT, ... "
        "(under spark-submit, the session's own)",
    )
    parser.add_argument(
        "--model",
        choices=KNOWN_MODELS,
        help="the model of histories whose run folder does not name one "
        "(a history from another tool)",
    )
    parser.add_argument(
        "--key-budget",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="time each key's linearizability search may take before the key is "
        "'unknown' (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where verdict.json and report.html go (default: RUN_DIR/verify for one "
        "run folder, else verify-<time> here)",
    )
    parser.add_argument("--no-report", action="store_true", help="skip the HTML report")
    parser.add_argument(
        "--json", action="store_true", help="print the verdict as JSON instead of a summary"
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check run folders with Spark: linearizability, lost commits, elections",
        description="Verify exported histories and node exports with PySpark: linearizability "
        "per key, aborted and stale reads, version forks, one leader per epoch, agreeing "
        "committed logs, no lost or phantom writes (docs/verification.md).",
        epilog="Exit status: 0 valid; 1 an anomaly was found; 3 unknown (a check could not "
        "decide); 2 bad usage or input; 4 Spark could not run.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``spark-submit .../submit.py`` (the same arguments)."""
    parser = argparse.ArgumentParser(
        prog="spark_verify", description="Verify kq run folders with Spark."
    )
    _add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)


class CannotVerify(Exception):
    """The verification did not run: ``code`` is the exit status that says why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def run_verification(
    paths: Sequence[str | Path],
    *,
    master: str | None = None,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> Verification:
    """Verify ``paths`` on a session of ``master`` (the active one if there is
    one; a session started here is stopped at the end).  ``options`` are
    :class:`spark_verify.job.VerifyOptions` fields.  Raises
    :class:`CannotVerify`: Spark's packages or Java missing (``EXIT_SPARK``),
    no run or a bad model under ``paths`` (``EXIT_USAGE``)."""
    # Spark is imported only here: `kq --help` must not start a JVM, and a kq
    # installed without the verify extra must say what is missing.
    missing = [m for m in ("pyspark", "pyarrow", "pandas") if importlib.util.find_spec(m) is None]
    if missing:
        raise CannotVerify(
            EXIT_SPARK,
            f"verification needs {', '.join(missing)}: install kq with its verify extra "
            "(pip install 'kq[verify]')",
        )
    from pyspark.sql import SparkSession

    from spark_verify.job import VerifyOptions, verify
    from spark_verify.load import RunInputError
    from spark_verify.session import JavaMissingError, spark_session

    ours = SparkSession.getActiveSession() is None
    try:
        spark = spark_session(master)
    except JavaMissingError as exc:
        raise CannotVerify(EXIT_SPARK, str(exc)) from None
    try:
        return verify(spark, paths, VerifyOptions(**options), progress=progress)
    except (RunInputError, ValueError) as exc:
        raise CannotVerify(EXIT_USAGE, str(exc)) from None
    finally:
        if ours:  # a session someone else started stays theirs
            spark.stop()


def exit_status(valid: object) -> int:
    """``kq verify``'s exit status for a verdict's ``valid``."""
    if valid is True:
        return EXIT_VALID
    if valid is False:
        return EXIT_INVALID
    return EXIT_UNKNOWN


def run(args: argparse.Namespace) -> int:
    quiet = args.json

    def say(message: str) -> None:
        if not quiet:
            print(f"verify: {message}", file=sys.stderr, flush=True)

    try:
        result = run_verification(
            args.paths,
            master=args.master,
            progress=say,
            model=args.model,
            key_budget_s=args.key_budget,
            out=args.out,
            report=not args.no_report,
        )
    except CannotVerify as exc:
        print(f"kq verify: {exc}", file=sys.stderr)
        return exc.code
    verdict = result.verdict
    if args.json:
        print(json.dumps(verdict, indent=2, default=str))
    else:
        print(summary_text(verdict, result.verdict_path, result.report_path))
    return exit_status(verdict["valid"])


def _word(valid: object) -> str:
    return {True: "valid", False: "INVALID"}.get(valid, "unknown")  # type: ignore[call-overload]


def summary_text(
    verdict: Mapping[str, Any], verdict_path: Path | None = None, report: Path | None = None
) -> str:
    """The verdict for people: one line per check, then the first anomalies."""
    lines = []
    runs = verdict.get("runs", [])
    ops = sum(int(r.get("ops", 0)) for r in runs)
    lines.append(
        f"{len(runs)} run(s), {ops:,} client operations, verified in "
        f"{verdict.get('elapsed_s', 0):.1f} s on {verdict.get('master', '?')}"
    )
    checks: Mapping[str, Mapping[str, Any]] = verdict.get("checks", {})
    width = max((len(n) for n in checks), default=10)
    for name, check in checks.items():
        detail = check.get("detail") or {}
        if detail.get("applicable") is False:
            lines.append(f"  {name:<{width}}  n/a")
            continue
        count = check.get("count", 0)
        note = f"  {count:,} anomal{'y' if count == 1 else 'ies'}" if count else ""
        if name == "linearizable" and "keys" in detail:
            note += f"  ({detail['keys']:,} keys, {detail.get('unknown', 0):,} unknown)"
        lines.append(f"  {name:<{width}}  {_word(check.get('valid'))}{note}")
    shown = 0
    for name, check in checks.items():
        for a in check.get("anomalies", [])[:3]:
            if shown == 0:
                lines.append("first anomalies:")
            where = " ".join(
                f"{k} {a[k]}" for k in ("run", "key", "node") if a.get(k) is not None
            )
            lines.append(f"  {name}/{a.get('kind')}: {a.get('message')} [{where}]")
            shown += 1
    lines.append(f"verdict: {_word(verdict.get('valid'))}")
    if verdict_path is not None:
        lines.append(f"verdict file: {verdict_path}")
    if report is not None:
        lines.append(f"report: {report}")
    return "\n".join(lines)
