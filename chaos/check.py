"""Check run folders: ``python -m chaos.check PATH...``.

Each PATH is a run folder (it holds ``history.jsonl``) or a folder of run
folders (such as ``runs/``).  Prints one line per run, then every problem;
exits 1 if any run has one, 2 if a PATH holds no run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from history.runs import check_run, find_runs

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.check", description="Check that run folders are well formed."
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    args = parser.parse_args(argv)
    bad = 0
    for path in args.paths:
        runs = find_runs(path)
        if not runs:
            print(f"{path}: no run folder here", file=sys.stderr)
            return 2
        for run in runs:
            problems = check_run(run)
            if problems:
                bad += 1
                print(f"{run}: {len(problems)} problem(s)")
                for p in problems:
                    print(f"  {p}")
            else:
                print(f"{run}: well formed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
