"""Run the verification job on run folders and say what it found: the
library behind ``kq verify`` (:mod:`kq.commands.verify`), ``kq chaos run
--verify`` and ``spark-submit`` (:mod:`spark_verify.submit`).

Exit statuses (:func:`exit_status`, :class:`CannotVerify`), over the runs
verified together: 0 every run valid (every check passed); 1 a check found
an anomaly in some run; 3 no anomaly, but some check could not decide for
some run (a key's search ran out of its budget, say); 5 some run's history
could not be read (not EDN or JSON, a field of the wrong type, an invoke
never completed: "cannot verify", never a verdict on a misread history; it
wins over 1 and 3, as the command's answer is then incomplete); 2 bad usage
(no run under a path, an unknown model, a history with no model); 4 Spark
could not run (no Java 17+, say).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from spark_verify.job import Verification

__all__ = [
    "EXIT_CANNOT_VERIFY",
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
EXIT_CANNOT_VERIFY: Final = 5

_STATUS: Final = {
    "valid": EXIT_VALID,
    "invalid": EXIT_INVALID,
    "unknown": EXIT_UNKNOWN,
    "cannot-verify": EXIT_CANNOT_VERIFY,
}


class CannotVerify(Exception):
    """The verification did not run: ``code`` is the exit status that says why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def run_verification(
    paths: Sequence[str | Path],
    *,
    master: str | None = None,
    remote: str | None = None,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> Verification:
    """Verify ``paths`` on a session of ``master`` (the active one if there is
    one; a session started here is stopped at the end), or through the Spark
    Connect server at ``remote`` (``sc://HOST:PORT``; the server stays).  ``options`` are
    :class:`spark_verify.job.VerifyOptions` fields.  Raises
    :class:`CannotVerify`: Spark's packages or Java missing (``EXIT_SPARK``),
    no Spark Connect server at ``remote`` (``EXIT_SPARK``), no run or a
    bad model under ``paths`` (``EXIT_USAGE``)."""
    # Spark is imported only here: `kq --help` must not start a JVM, and a kq
    # installed without the verify extra must say what is missing.
    needed = ("pyspark", "pyarrow", "pandas", "edn_format")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise CannotVerify(
            EXIT_SPARK,
            f"verification needs {', '.join(missing)}: install kq with its verify extra "
            "(pip install 'kq[verify]')",
        )
    from pyspark.sql import SparkSession

    from spark_verify.job import VerifyOptions, verify
    from spark_verify.load import HistoryReadError, RunInputError
    from spark_verify.session import (
        ConnectError,
        JavaMissingError,
        remote_session,
        spark_session,
    )

    if remote is not None and master is not None:
        raise CannotVerify(
            EXIT_USAGE, "--master and --remote are exclusive: the server has its own master"
        )
    ours = remote is not None or SparkSession.getActiveSession() is None
    try:
        spark = remote_session(remote) if remote is not None else spark_session(master)
    except (JavaMissingError, ConnectError) as exc:
        raise CannotVerify(EXIT_SPARK, str(exc)) from None
    try:
        return verify(spark, paths, VerifyOptions(**options), progress=progress)
    except HistoryReadError as exc:
        raise CannotVerify(EXIT_CANNOT_VERIFY, str(exc)) from None
    except (RunInputError, ValueError) as exc:
        raise CannotVerify(EXIT_USAGE, str(exc)) from None
    finally:
        if ours:  # a session someone else started stays theirs
            spark.stop()


def exit_status(verdict: Mapping[str, Any] | object) -> int:
    """``kq verify``'s exit status for a verdict (its runs' ``verdict``), or
    for a ``valid`` alone (true, false or unknown)."""
    if isinstance(verdict, Mapping):
        if verdict.get("verdict") in _STATUS:
            return _STATUS[verdict["verdict"]]
        verdict = verdict.get("valid")
    valid = verdict
    if valid is True:
        return EXIT_VALID
    if valid is False:
        return EXIT_INVALID
    return EXIT_UNKNOWN


_VERDICT_WORDS: Final = {
    "valid": "valid",
    "invalid": "INVALID",
    "unknown": "unknown",
    "cannot-verify": "CANNOT VERIFY",
}


def run_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per run (run, model, operations, keys, verdict, time), then
    the reason of each run that is not valid."""
    header = ("run", "model", "operations", "keys", "verdict", "time")
    rows = [
        (
            str(r.get("name", "?")),
            str(r.get("model") or "-"),
            f"{int(r.get('ops', 0)):,}",
            f"{int(r.get('keys', 0)):,}",
            _VERDICT_WORDS.get(str(r.get("verdict")), "?"),
            f"{float(r.get('search_s', 0.0)):.2f} s",
        )
        for r in runs
    ]
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
    right = (False, False, True, True, False, True)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ).rstrip()

    out = ["runs:", "  " + line(header)]
    out.extend("  " + line(row) for row in rows)
    for r in runs:
        if r.get("verdict") not in (None, "valid") and r.get("reason"):
            out.append(f"  {r.get('name')}: {r.get('reason')}")
    return out


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
            where = " ".join(f"{k} {a[k]}" for k in ("run", "key", "node") if a.get(k) is not None)
            lines.append(f"  {name}/{a.get('kind')}: {a.get('message')} [{where}]")
            shown += 1
    lines.extend(run_table(runs))
    overall = verdict.get("verdict")
    word = _VERDICT_WORDS.get(str(overall), _word(verdict.get("valid")))
    lines.append(f"verdict: {word}")
    if verdict_path is not None:
        lines.append(f"verdict file: {verdict_path}")
    if report is not None:
        lines.append(f"report: {report}")
    return "\n".join(lines)
