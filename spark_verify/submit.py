"""The ``spark-submit`` entry point of the verification job.

    spark-submit --master spark://HOST:7077 --py-files kq-verify.zip \\
        spark_verify/submit.py RUN_DIR... [--model NAME] [--json]

It takes the arguments of ``kq verify`` (but ``--master``, which
``spark-submit`` owns) and uses the session ``spark-submit`` made.  The
executors need ``spark_verify`` (``--py-files``: ``python -m
spark_verify.package kq-verify.zip`` makes the archive), pandas and pyarrow.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from spark_verify.cli import main

    sys.exit(main(sys.argv[1:]))
