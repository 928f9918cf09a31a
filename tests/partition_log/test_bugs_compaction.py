"""B16 of the catalogue: compaction renumbers the records it keeps (a record
read at one offset before a cleaning is read at another after it: Jepsen's
inconsistent-offsets, and a consumer that goes on from its position skips
or rereads records). With the bug off every kept record keeps its offset."""

from __future__ import annotations

import bugs
from bugs import Bug
from partition_log.cleaner import LogCleaner
from tests.partition_log.test_cleaner import fill, open_log, put, records


def _cleaned(
    bug: bool,
) -> tuple[
    list[tuple[int, bytes | None, bytes | None]], list[tuple[int, bytes | None, bytes | None]]
]:
    log = open_log()
    # A batch whose first record a later batch makes obsolete: the cleaning
    # keeps its second record alone.
    put(log, [(b"x", b"x0"), (b"y", b"y0")])
    put(log, [(b"x", b"x1")])
    fill(log, 10)  # enough batches for the first segments to be cleanable
    before = records(log)
    cleaner = LogCleaner({"p": log})
    if bug:
        with bugs.injected(Bug.COMPACTION_RENUMBERS):
            assert cleaner.maybe_clean(100)
    else:
        assert cleaner.maybe_clean(100)
    return before, records(log)


def test_a_cleaning_keeps_the_offsets_of_the_records_it_keeps() -> None:
    before, after = _cleaned(bug=False)
    assert (1, b"y", b"y0") in before and (1, b"y", b"y0") in after
    assert set(after) <= set(before)


def test_b16_a_cleaning_renumbers_the_records_it_keeps() -> None:
    before, after = _cleaned(bug=True)
    assert (1, b"y", b"y0") in before
    # y0 was at offset 1; it is read at 0 now, where x0 was.
    assert (0, b"y", b"y0") in after and (1, b"y", b"y0") not in after
    assert not set(after) <= set(before)
