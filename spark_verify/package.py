"""Pack ``spark_verify`` into a zip for ``spark-submit --py-files``.

    python -m spark_verify.package kq-verify.zip

Executors of a real cluster import the per-key checkers from it; they need
pandas and pyarrow installed themselves (PySpark's pandas UDF requirement).
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "package"]


def package(out: Path) -> list[str]:
    """Write the zip; returns the archived names."""
    root = Path(__file__).resolve().parent
    names = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            name = f"spark_verify/{path.relative_to(root).as_posix()}"
            z.write(path, name)
            names.append(name)
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_verify.package",
        description="Pack spark_verify for spark-submit --py-files.",
    )
    parser.add_argument("out", type=Path, help="the zip file to write")
    args = parser.parse_args(argv)
    if args.out.exists() and args.out.is_dir():
        parser.error(f"{args.out} is a directory; name a .zip file")
    names = package(args.out)
    print(f"{args.out}: {len(names)} modules of spark_verify")
    return 0


if __name__ == "__main__":
    sys.exit(main())
