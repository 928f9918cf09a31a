"""Run the verification job on run folders and say what it found: the
library behind ``kq verify`` (:mod:`kq.commands.verify`), ``kq chaos run
--verify`` and ``spark-submit`` (:mod:`spark_verify.submit`).

Exit statuses (:func:`exit_status`, :class:`CannotVerify`): 0 every check
passed (``valid`` true); 1 a check found an anomaly (``valid`` false); 3 no
anomaly, but some check could not decide (``valid`` ``unknown``: a key's
search ran out of its budget, say); 2 bad usage or input (no run under a
path, an unknown model, a history with no model); 4 Spark could not run (no
Java 17+, say).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from spark_verify.job import Verification

__all__ = [
    "EXIT_INVALID",
    "EXIT_SPARK",
    "EXIT_UNKNOWN",
    "CannotVerify",
    "exit_status",
    "run_verification",
    "summary_text",
]

EXIT_VALID: Final = 0
EXIT_INVALID: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNKNOWN: Final = 3
EXIT_SPARK: Final = 4


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
