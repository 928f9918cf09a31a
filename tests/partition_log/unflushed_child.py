"""The process that test_bugs_unflushed.py kills with SIGKILL: it turns on
the bugs its environment names (as a broker does at its start), opens a
partition log on real files, appends COUNT one-record batches as leader,
writing ``acked <offset>`` to stdout once each append has returned (when a
broker would answer the produce), then ``done`` and waits to be killed.

Usage: unflushed_child.py DIRECTORY COUNT
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bugs
from partition_log.batch import build_batch
from partition_log.log import LogConfig, PartitionLog
from partition_log.os_files import OsDirectory
from partition_log.records import Record


def main(argv: list[str]) -> None:
    path, count = argv[0], int(argv[1])
    bugs.install(bugs.from_environment(os.environ))
    log = PartitionLog.open(OsDirectory(path), LogConfig(), now_ms=0)
    out = sys.stdout
    for i in range(count):
        data = build_batch([Record(0, 1000, b"k", b"value %d" % i)])
        info = log.append_as_leader(data, 0, now_ms=1000)
        out.write(f"acked {info.first_offset}\n")
        out.flush()
    out.write("done\n")
    out.flush()
    time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1:])
