"""The ``spark-submit`` entry point of the verification job.

    spark-submit --master spark://HOST:7077 --py-files kq-verify.zip \\
        spark_verify/submit.py RUN_DIR... [--model NAME] [--json]

Its arguments are ``kq verify``'s (:func:`add_arguments` defines them for both:
this entry point may use argparse, as the commands do, and spark_verify stays
independent of the rest of kq) (but ``--master``, which
``spark-submit`` owns) and uses the session ``spark-submit`` made.  The
executors need ``spark_verify`` (``--py-files``: ``python -m
spark_verify.package kq-verify.zip`` makes the archive), pandas and pyarrow.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__":
    # Run as a script (spark-submit .../submit.py), Python puts this folder
    # first on sys.path, where spark_verify/queue.py would stand for the
    # standard library's queue (which py4j imports): take it off.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

from spark_verify.ops import JEPSEN_MODELS, KNOWN_MODELS
from spark_verify.run import CannotVerify, exit_status, run_verification, summary_text

__all__ = ["add_arguments", "build_parser", "main", "run"]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders, folders of run folders (a runs dir), Jepsen store folders "
        "(history.edn), or history files (.jsonl, .edn or .parquet) from other tools",
    )
    parser.add_argument(
        "--master",
        help="the Spark master: local[*] (default), local[N], spark://HOST:PORT, ... "
        "(under spark-submit, the session's own)",
    )
    parser.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="verify through a running Spark Connect server (warm: it keeps its JVM and "
        "Python workers between commands; docs/verification.md shows how to start one); "
        "not with --master",
    )
    parser.add_argument(
        "--model",
        choices=(*KNOWN_MODELS, *JEPSEN_MODELS),
        help="the model of histories whose run folder does not name one "
        "(a history from another tool); Jepsen's cas-register is register",
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
        "--key-memory",
        type=_positive_int,
        default=1024,
        metavar="MIB",
        help="memory each key's linearizability search may use for its cache of seen "
        "configurations before the key is 'unknown' (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where verdict.json and report.html go (default: RUN_DIR/verify for one "
        "run folder, else runs/verify-<time>)",
    )
    parser.add_argument("--no-report", action="store_true", help="skip the HTML report")
    parser.add_argument(
        "--json", action="store_true", help="print the verdict as JSON instead of a summary"
    )


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``spark-submit .../submit.py`` (the same arguments)."""
    parser = argparse.ArgumentParser(
        prog="spark_verify", description="Verify kq run folders with Spark."
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    quiet = args.json

    def say(message: str) -> None:
        if not quiet:
            print(f"verify: {message}", file=sys.stderr, flush=True)

    try:
        result = run_verification(
            args.paths,
            master=args.master,
            remote=getattr(args, "remote", None),
            progress=say,
            model=args.model,
            key_budget_s=args.key_budget,
            key_memory_mib=args.key_memory,
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
    return exit_status(verdict)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
