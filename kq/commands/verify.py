"""``kq verify``: check run folders and Jepsen histories with Spark, one verdict per run.

    kq verify PATH... [--master local[*]|spark://HOST:PORT | --remote sc://HOST:PORT] [--model NAME]
              [--key-budget SECONDS] [--out DIR] [--no-report] [--json]

Exit status over the runs: 0 all valid; 1 an anomaly was found; 3 unknown (a
check could not decide); 5 a history could not be read (cannot verify); 2 bad
usage; 4 Spark could not run (:mod:`spark_verify.run`).
The arguments are those of the ``spark-submit`` entry point
(:mod:`spark_verify.submit`), which runs the same job.
"""

from __future__ import annotations

from kq.commands.common import Subparsers
from spark_verify.submit import add_arguments, run

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check run folders and Jepsen histories with Spark: linearizability, lost "
        "commits, elections",
        description="Verify exported histories and node exports with PySpark: linearizability "
        "per key, aborted and stale reads, version forks, one leader per epoch, agreeing "
        "committed logs, no lost or phantom writes (docs/verification.md).",
        epilog="Exit status over the runs: 0 all valid; 1 an anomaly was found; 3 unknown (a "
        "check could not decide); 5 a history could not be read (cannot verify); 2 bad usage; "
        "4 Spark could not run.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
