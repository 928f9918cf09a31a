"""A child process that writes through a store in its power-loss test mode
(or the normal one, to compare), then says ``ready`` and waits: killed with
SIGKILL by its pid once it wrote, as a power cut stops a process, so that
the test can read back what the store kept (``test_power_loss_rocks``,
``test_power_loss_files``, ``test_torn_tails``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository, for the child's ``sys.path``."""


def kill_when_ready(code: str, path: Path) -> list[str]:
    """Run the Python ``code`` with ``path`` as its one argument, read its
    output up to its ``ready`` line, SIGKILL it and see it die of that:
    the lines it printed before ``ready``."""
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        lines = []
        while (line := child.stdout.readline()) and line.strip() != "ready":
            lines.append(line.strip())
        assert line.strip() == "ready", f"the child ended before it was ready: {lines}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    return lines
