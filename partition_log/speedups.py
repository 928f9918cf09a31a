"""The compiled versions of the leader append's hot path, when present.

``partition_log/_speedups.c`` is an optional C extension (``setup.py``
builds it when a compiler is there; an install without one goes on).  It
holds :func:`records_fit`, the record walk of
:func:`partition_log.records.check_records_section`, which stays the
reference: the Python code runs whenever the extension is absent, and the
tests run both on the same sections and compare their verdicts.

``KQ_PURE_PYTHON=1`` in the environment forces the Python code (the
extension reads it once at import, so this module stays free of ``os``).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["COMPILED", "compiled_records_fit", "records_fit"]

#: ``records_fit(data, count, last_offset_delta)``: whether the records
#: section ``data`` decodes (see ``records.check_records_section``).
RecordsFit = Callable[[bytes | bytearray | memoryview, int, int], bool]

try:
    import partition_log._speedups as _speedups
except ImportError:  # no compiler at install time: the Python reference runs
    compiled_records_fit: RecordsFit | None = None
else:
    compiled_records_fit = _speedups.records_fit

#: The function the package uses: the compiled one unless it is missing or
#: KQ_PURE_PYTHON asked for the reference (then None, and records.py walks).
records_fit: RecordsFit | None = (
    None
    if compiled_records_fit is None or _speedups.pure_python_requested
    else compiled_records_fit
)

#: Whether the compiled check is in use.
COMPILED = records_fit is not None
