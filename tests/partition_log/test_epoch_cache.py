"""The leader-epoch cache: Kafka's answers (LeaderEpochFileCache), its
truncations, its checkpoint file, and that it always equals the cache
derived from the batches of the log."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from partition_log.epoch_cache import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEndOffset,
    EpochEntry,
    LeaderEpochCache,
    decode_checkpoint,
    derive,
    encode_checkpoint,
)
from partition_log.errors import Errors, PartitionLogError

UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def cache_of(*pairs: tuple[int, int]) -> LeaderEpochCache:
    return LeaderEpochCache(tuple(EpochEntry(epoch, start) for epoch, start in pairs))


# -- end_offset_for_epoch: the five answers of LeaderEpochFileCache.endOffsetFor --

CACHE = cache_of((2, 6), (4, 11), (7, 15))
LEO = 20


def test_undefined_requested_epoch_is_undefined() -> None:
    assert CACHE.end_offset_for_epoch(UNDEFINED_EPOCH, LEO) == UNDEFINED


def test_current_epoch_ends_at_the_log_end_offset() -> None:
    assert CACHE.end_offset_for_epoch(7, LEO) == EpochEndOffset(7, LEO)


def test_older_known_epoch_ends_where_the_next_starts() -> None:
    assert CACHE.end_offset_for_epoch(2, LEO) == EpochEndOffset(2, 11)
    assert CACHE.end_offset_for_epoch(4, LEO) == EpochEndOffset(4, 15)


def test_unknown_epoch_between_known_ones_answers_the_floor_epoch() -> None:
    # The largest epoch <= 3 is 2; it ends where 4 starts.
    assert CACHE.end_offset_for_epoch(3, LEO) == EpochEndOffset(2, 11)
    assert CACHE.end_offset_for_epoch(6, LEO) == EpochEndOffset(4, 15)


def test_unknown_lower_epoch_answers_itself_with_the_first_start() -> None:
    # "the data has already been removed": the requested epoch, ending where
    # the first known epoch starts.
    assert CACHE.end_offset_for_epoch(1, LEO) == EpochEndOffset(1, 6)
    assert CACHE.end_offset_for_epoch(0, LEO) == EpochEndOffset(0, 6)


def test_unknown_higher_epoch_is_undefined() -> None:
    assert CACHE.end_offset_for_epoch(8, LEO) == UNDEFINED


def test_an_empty_cache_answers_undefined() -> None:
    assert LeaderEpochCache().end_offset_for_epoch(0, 5) == UNDEFINED
    assert LeaderEpochCache().latest_epoch == UNDEFINED_EPOCH


def test_epoch_for_offset() -> None:
    assert CACHE.epoch_for_offset(5) == UNDEFINED_EPOCH
    assert CACHE.epoch_for_offset(6) == 2
    assert CACHE.epoch_for_offset(10) == 2
    assert CACHE.epoch_for_offset(11) == 4
    assert CACHE.epoch_for_offset(100) == 7


# -- assign --


def test_assign_appends_a_new_epoch() -> None:
    assert LeaderEpochCache().assign(0, 0).assign(1, 5) == cache_of((0, 0), (1, 5))


def test_assign_of_the_latest_epoch_at_a_later_offset_changes_nothing() -> None:
    cache = cache_of((0, 0), (1, 5))
    assert cache.assign(1, 9) is cache


def test_assign_of_the_latest_epoch_at_a_lower_start_moves_it() -> None:
    assert cache_of((0, 0), (1, 5)).assign(1, 3) == cache_of((0, 0), (1, 3))


def test_assign_of_an_older_epoch_drops_the_later_entries() -> None:
    # maybeTruncateNonMonotonicEntries: every entry with epoch >= 2 or start >= 12.
    cache = cache_of((0, 0), (2, 5), (3, 10))
    assert cache.assign(1, 12) == cache_of((0, 0), (1, 12))


def test_assign_at_a_lower_start_drops_the_entries_starting_at_or_after_it() -> None:
    cache = cache_of((0, 0), (2, 5), (3, 10))
    assert cache.assign(4, 5) == cache_of((0, 0), (4, 5))
    assert cache.assign(4, 0) == cache_of((4, 0))


def test_invalid_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="epoch -1 at offset 0"):
        LeaderEpochCache().assign(-1, 0)
    with pytest.raises(ValueError, match="epoch 0 at offset -3"):
        LeaderEpochCache().assign(0, -3)
    with pytest.raises(ValueError, match="must increase"):
        cache_of((1, 0), (1, 5))
    with pytest.raises(ValueError, match="must increase"):
        cache_of((1, 5), (2, 5))


# -- truncations --


def test_truncate_from_end_drops_entries_starting_at_or_after_the_end() -> None:
    cache = cache_of((0, 0), (2, 5), (3, 10))
    assert cache.truncate_from_end(10) == cache_of((0, 0), (2, 5))
    assert cache.truncate_from_end(6) == cache_of((0, 0), (2, 5))
    assert cache.truncate_from_end(5) == cache_of((0, 0))
    assert cache.truncate_from_end(0) == LeaderEpochCache()
    assert cache.truncate_from_end(11) is cache


def test_truncate_from_end_removes_a_new_leaders_entry_without_batches() -> None:
    # A leader assigns (epoch, LEO) at once (KIP-279); a truncation to the
    # LEO, which removes no batch, still removes that entry.
    cache = cache_of((0, 0)).assign(3, 8)
    assert cache.truncate_from_end(8) == cache_of((0, 0))


def test_truncate_from_start_keeps_the_covering_entry_moved_to_the_start() -> None:
    cache = cache_of((0, 0), (2, 5), (3, 10))
    assert cache.truncate_from_start(7) == cache_of((2, 7), (3, 10))
    assert cache.truncate_from_start(10) == cache_of((3, 10))
    assert cache.truncate_from_start(12) == cache_of((3, 12))
    assert cache_of((2, 5)).truncate_from_start(3) == cache_of((2, 5))


# -- the checkpoint file --


def test_checkpoint_is_kafkas_format() -> None:
    data = encode_checkpoint(cache_of((0, 0), (2, 5), (13, 1024)).entries)
    assert data == b"0\n3\n0 0\n2 5\n13 1024\n"
    assert encode_checkpoint(()) == b"0\n0\n"


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10**12)), max_size=20).map(
        lambda pairs: LeaderEpochCache.from_entries(EpochEntry(e, o) for e, o in pairs)
    )
)
def test_checkpoint_round_trip(cache: LeaderEpochCache) -> None:
    assert decode_checkpoint(encode_checkpoint(cache.entries)) == cache.entries


def test_checkpoint_without_a_final_newline_is_read() -> None:
    assert decode_checkpoint(b"0\n1\n4 7") == (EpochEntry(4, 7),)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "line 1: the file is empty"),
        (b"1\n0\n", "line 1: unknown version 1"),
        (b"x\n0\n", "line 1: version 'x' is not a decimal integer"),
        (b"0\n", "line 2: missing"),
        (b"0\n-1\n", "line 2: entry count -1 is negative"),
        (b"0\ntwo\n", "line 2: entry count 'two' is not a decimal integer"),
        (b"0\n2\n1 0\n", "line 4: the count on line 2 is 2 entries but the file has 1"),
        (b"0\n1\n1 0\n2 5\n", "line 4: the count on line 2 is 1 entries but the file has 2"),
        (b"0\n1\n1 0 3\n", "line 3: '1 0 3' is not 'epoch start_offset'"),
        (b"0\n1\n1\t0\n", r"line 3: '1\\t0' is not 'epoch start_offset'"),
        (b"0\n1\n1 +0\n", "line 3: start offset '\\+0' is not a decimal integer"),
        (b"0\n1\n-1 0\n", "line 3: epoch -1 at offset 0 is negative"),
        (b"0\n2\n1 0\n1 5\n", "line 4: epoch 1 at offset 5 does not follow epoch 1"),
        (b"0\n2\n1 5\n2 5\n", "line 4: epoch 2 at offset 5 does not follow epoch 1"),
        (b"0\n1\n\xff 0\n", "byte 4 is not ASCII"),
    ],
)
def test_malformed_checkpoint_names_the_line(data: bytes, message: str) -> None:
    with pytest.raises(PartitionLogError, match=message) as caught:
        decode_checkpoint(data)
    assert caught.value.code is Errors.KAFKA_STORAGE_ERROR
    assert "leader-epoch-checkpoint" in str(caught.value)


# -- derive, and the property: the cache always equals the derived one --


def test_derive_assigns_every_batch_in_order() -> None:
    batches = [(0, 0), (3, 0), (5, 2), (9, 2), (12, 5)]
    assert derive(batches) == cache_of((0, 0), (2, 5), (5, 12))
    assert derive(batches, log_start_offset=4) == cache_of((0, 4), (2, 5), (5, 12))
    # A batch without a leader epoch (-1) is not assigned.
    assert derive([(0, -1), (2, 1)]) == cache_of((1, 2))


@dataclass
class Log:
    """A log as the cache sees it: its batches (base offset, last offset,
    epoch), its start and end, and the cache kept up to date the way the
    log keeps it."""

    batches: list[tuple[int, int, int]] = field(default_factory=list)
    log_start: int = 0
    log_end: int = 0
    cache: LeaderEpochCache = field(default_factory=LeaderEpochCache)

    def append(self, records: int, epoch: int) -> None:
        base = self.log_end
        self.batches.append((base, base + records - 1, epoch))
        self.log_end = base + records
        self.cache = self.cache.assign(epoch, base)

    def become_leader(self, epoch: int) -> None:
        # KIP-279: a new leader assigns its epoch at its log end offset at once.
        self.cache = self.cache.assign(epoch, self.log_end)

    def truncate_to(self, offset: int) -> None:
        # UnifiedLog.truncateTo: at or past the end nothing is removed, but the
        # cache is still truncated to the end (a new leader's entry without a
        # batch goes); otherwise the log cuts at the first batch holding an
        # offset >= ``offset``, and the new end is where that batch began.
        if offset >= self.log_end:
            self.cache = self.cache.truncate_from_end(self.log_end)
            return
        kept = [batch for batch in self.batches if batch[1] < max(offset, self.log_start)]
        self.log_end = kept[-1][1] + 1 if kept else self.log_start
        self.batches = kept
        self.cache = self.cache.truncate_from_end(self.log_end)

    def delete_before(self, offset: int) -> None:
        # Retention and DeleteRecords: the log start moves to ``offset`` (at
        # most the end); whole batches below it go.
        offset = min(max(offset, self.log_start), self.log_end)
        self.batches = [batch for batch in self.batches if batch[1] >= offset]
        self.log_start = offset
        self.cache = self.cache.truncate_from_start(offset)

    def derived(self) -> LeaderEpochCache:
        return derive(((base, epoch) for base, _, epoch in self.batches), self.log_start)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 5), st.integers(0, 2)),
        st.tuples(st.just("lead"), st.integers(1, 3), st.just(0)),
        st.tuples(st.just("truncate"), st.integers(0, 60), st.just(0)),
        st.tuples(st.just("delete"), st.integers(0, 60), st.just(0)),
    ),
    max_size=40,
)


def check_against_derived(ops: list[tuple[str, int, int]]) -> None:
    log = Log()
    epoch = 0
    for op, amount, bump in ops:
        if op == "append":
            # Appended batches never go below the epochs in the log: a leader
            # stamps its current epoch, a follower copies a leader's log after
            # truncating what diverged.
            epoch = max(epoch, log.cache.latest_epoch) + bump
            log.append(amount, epoch)
        elif op == "lead":
            epoch = max(epoch, log.cache.latest_epoch) + amount
            log.become_leader(epoch)
        elif op == "truncate":
            log.truncate_to(amount)
        else:
            log.delete_before(amount)
        pending = log.cache.latest_entry
        if pending is not None and pending.start_offset == log.log_end:
            # A new leader's entry has no batch yet: the derived cache lacks it.
            assert log.cache.truncate_from_end(log.log_end) == log.derived()
        else:
            assert log.cache == log.derived()
    assert decode_checkpoint(encode_checkpoint(log.cache.entries)) == log.cache.entries


@settings(max_examples=300, deadline=None)
@given(operations)
def test_cache_always_equals_the_one_derived_from_the_batches(
    ops: list[tuple[str, int, int]],
) -> None:
    check_against_derived(ops)


def drops_the_covering_entry(self: LeaderEpochCache, start_offset: int) -> LeaderEpochCache:
    return LeaderEpochCache(tuple(e for e in self.entries if e.start_offset > start_offset))


def keeps_an_entry_at_the_end(self: LeaderEpochCache, end_offset: int) -> LeaderEpochCache:
    return LeaderEpochCache(tuple(e for e in self.entries if e.start_offset <= end_offset))


@pytest.mark.parametrize(
    ("method", "broken"),
    [
        ("truncate_from_start", drops_the_covering_entry),
        ("truncate_from_end", keeps_an_entry_at_the_end),
    ],
)
def test_the_property_catches_a_broken_rule(
    monkeypatch: pytest.MonkeyPatch, method: str, broken: object
) -> None:
    # Without Kafka's rules (the entry covering the new start stays, moved to
    # it; an entry starting at the new end goes), some history leaves a
    # cache that differs from the derived one.
    monkeypatch.setattr(LeaderEpochCache, method, broken)

    def fails(ops: list[tuple[str, int, int]]) -> bool:
        try:
            check_against_derived(ops)
        except AssertionError:
            return True
        return False

    find(operations, fails, settings=settings(max_examples=2000, database=None, deadline=None))
