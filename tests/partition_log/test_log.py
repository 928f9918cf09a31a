"""The partition log over its segments: appends as leader and follower, reads
across rolls, producer duplicates and sequence errors, truncation, flushing,
clean and unclean reopening, and refusals that leave the files unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from partition_log.batch import BatchHeader, build_batch, decode_records, split_batches
from partition_log.epoch_cache import CHECKPOINT_FILE_NAME, EpochEntry, derive
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, MemoryDirectory
from partition_log.log import (
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_FILE,
    CleanupPolicy,
    LogConfig,
    PartitionLog,
)
from partition_log.os_files import OsDirectory
from partition_log.producer_state import ProducerStateManager
from partition_log.records import Record
from partition_log.segment import file_name

SMALL = LogConfig(segment_bytes=400, index_interval_bytes=100)


def batch(
    count: int = 1,
    *,
    value: bytes = b"v",
    base: int = 0,
    epoch: int = -1,
    producer: int = -1,
    producer_epoch: int = -1,
    sequence: int = -1,
    timestamp: int = 1000,
) -> bytes:
    records = [Record(base + i, timestamp, b"k%d" % i, value) for i in range(count)]
    return build_batch(
        records,
        base_offset=base,
        partition_leader_epoch=epoch,
        producer_id=producer,
        producer_epoch=producer_epoch,
        base_sequence=sequence,
    )


def snapshot(directory: MemoryDirectory) -> dict[str, bytes]:
    """Every file's bytes as the process sees them."""
    files = {}
    for name in directory.list():
        handle = directory.open(name)
        files[name] = handle.read(0, handle.size)
        handle.close()
    return files


def all_batches(log: PartitionLog) -> list[BatchHeader]:
    headers = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        found = [BatchHeader.parse(view) for view in split_batches(data)]
        headers.extend(found)
        offset = found[-1].next_offset
    return headers


def derived_cache(log: PartitionLog) -> tuple[EpochEntry, ...]:
    return derive((h.base_offset, h.partition_leader_epoch) for h in all_batches(log)).entries


def derived_producers(log: PartitionLog) -> ProducerStateManager:
    from partition_log.log import _producer_batch

    return ProducerStateManager.rebuild(None, (_producer_batch(h) for h in all_batches(log)))


@pytest.fixture(params=["memory", "os"])
def directory(request: pytest.FixtureRequest, tmp_path: Path) -> FileDirectory:
    if request.param == "memory":
        return MemoryDirectory()
    (tmp_path / "p-0").mkdir()
    return OsDirectory(tmp_path / "p-0")


def test_leader_appends_get_offsets_and_epochs_and_roll(directory: FileDirectory) -> None:
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    infos = [log.append_as_leader(batch(3, base=77), 5, now_ms=i) for i in range(10)]
    assert [(i.first_offset, i.last_offset) for i in infos] == [
        (3 * n, 3 * n + 2) for n in range(10)
    ]
    assert log.log_end_offset == 30
    assert len(log.segment_base_offsets) > 2  # rolled by size
    headers = all_batches(log)
    assert [h.base_offset for h in headers] == list(range(0, 30, 3))
    assert {h.partition_leader_epoch for h in headers} == {5}
    assert log.epoch_cache.entries == (EpochEntry(5, 0),)
    # Each roll took a producer snapshot at the new base.
    names = directory.list()
    for base in log.segment_base_offsets[1:]:
        assert file_name(base, ".snapshot") in names
    log.close()


def test_reads_cross_segments_at_least_one_batch_and_stop_at_max_offset(
    directory: FileDirectory,
) -> None:
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    for _ in range(12):
        log.append_as_leader(batch(2), 1, now_ms=0)
    ends = [0, *log.segment_base_offsets[1:]]
    # At a segment's end the read continues in the next one.
    second = log.segment_base_offsets[1]
    data = log.read(second, 1 << 20)
    assert BatchHeader.parse(data).base_offset == second
    # max_bytes 1 still gives one whole batch.
    one = log.read(4, 1)
    assert [BatchHeader.parse(v).base_offset for v in split_batches(one)] == [4]
    # Never a batch reaching max_offset (the high watermark).
    assert log.read(0, 1 << 20, max_offset=1) == b""
    upto = log.read(0, 1 << 20, max_offset=4)
    assert [BatchHeader.parse(v).base_offset for v in split_batches(upto)] == [0, 2]
    assert log.read(24, 100) == b""
    assert ends[0] == 0


def test_offset_out_of_range_names_offset_and_range() -> None:
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    log.append_as_leader(batch(2), 0, now_ms=0)
    with pytest.raises(PartitionLogError) as error:
        log.read(3, 100)
    assert error.value.code is Errors.OFFSET_OUT_OF_RANGE
    assert "offset 3" in str(error.value) and "[0, 2]" in str(error.value)
    with pytest.raises(PartitionLogError) as error:
        log.read(-1, 100)
    assert error.value.code is Errors.OFFSET_OUT_OF_RANGE


def test_high_watermark_kept_below_the_end() -> None:
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    log.append_as_leader(batch(4), 0, now_ms=0)
    assert log.maybe_increment_high_watermark(2)
    assert not log.maybe_increment_high_watermark(1)
    assert log.high_watermark == 2
    with pytest.raises(PartitionLogError) as error:
        log.maybe_increment_high_watermark(5)
    assert error.value.code is Errors.OFFSET_OUT_OF_RANGE
    log.maybe_increment_high_watermark(4)
    log.truncate_to(0)
    assert log.high_watermark == 0


def test_duplicate_returns_original_offsets_and_appends_nothing() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    log.append_as_leader(batch(1), 0, now_ms=0)
    first = log.append_as_leader(batch(3, producer=7, producer_epoch=0, sequence=0), 0, now_ms=0)
    assert (first.first_offset, first.last_offset, first.duplicate) == (1, 3, False)
    before = snapshot(directory)
    again = log.append_as_leader(batch(3, producer=7, producer_epoch=0, sequence=0), 0, now_ms=0)
    assert (again.first_offset, again.last_offset, again.duplicate) == (1, 3, True)
    assert snapshot(directory) == before
    assert log.log_end_offset == 4


@pytest.mark.parametrize(
    ("producer_epoch", "sequence", "code"),
    [
        (0, 5, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER),  # a gap
        (1, 3, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER),  # new epoch not at 0
        (0, -1, Errors.INVALID_RECORD),  # a producer without a sequence
    ],
)
def test_sequence_errors_through_the_log(producer_epoch: int, sequence: int, code: Errors) -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    log.append_as_leader(batch(2, producer=7, producer_epoch=0, sequence=0), 0, now_ms=0)
    before = snapshot(directory)
    with pytest.raises(PartitionLogError) as error:
        log.append_as_leader(
            batch(1, producer=7, producer_epoch=producer_epoch, sequence=sequence), 0, now_ms=0
        )
    assert error.value.code is code
    assert snapshot(directory) == before and log.log_end_offset == 2


def test_fenced_producer_epoch() -> None:
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    log.append_as_leader(batch(1, producer=7, producer_epoch=2, sequence=0), 0, now_ms=0)
    with pytest.raises(PartitionLogError) as error:
        log.append_as_leader(batch(1, producer=7, producer_epoch=1, sequence=0), 0, now_ms=0)
    assert error.value.code is Errors.INVALID_PRODUCER_EPOCH


def test_leader_epoch_going_back_is_refused() -> None:
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    log.append_as_leader(batch(1), 3, now_ms=0)
    with pytest.raises(PartitionLogError) as error:
        log.append_as_leader(batch(1), 2, now_ms=0)
    assert error.value.code is Errors.INVALID_RECORD and "epoch 2" in str(error.value)
    with pytest.raises(PartitionLogError) as error:
        log.append_as_leader(batch(1), -1, now_ms=0)
    assert error.value.code is Errors.INVALID_RECORD and "epoch -1" in str(error.value)
    assert log.epoch_cache.entries == (EpochEntry(3, 0),)


def test_follower_keeps_the_leaders_offsets_and_epochs() -> None:
    leader = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    for epoch in (1, 1, 2, 4, 4, 4):
        leader.append_as_leader(batch(2, producer=9, producer_epoch=0, sequence=0), epoch, 0)
        leader.producer_state.producers.clear()  # each batch a fresh producer state
    follower = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    offset = 0
    while offset < leader.log_end_offset:
        data = leader.read(offset, 150)
        follower.append_as_follower(data)
        offset = follower.log_end_offset
    assert all_batches(follower) == all_batches(leader)
    assert follower.epoch_cache.entries == (EpochEntry(1, 0), EpochEntry(2, 4), EpochEntry(4, 6))
    assert follower.epoch_cache.entries == derived_cache(follower)
    assert follower.producer_state.producers == derived_producers(follower).producers


def test_follower_refuses_a_batch_below_the_end_naming_offsets() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    log.append_as_follower(batch(2, base=0, epoch=1))
    before = snapshot(directory)
    for bad, words in (
        (batch(1, base=1, epoch=1), ["base offset 1", "below the log end offset 2"]),
        (
            batch(2, base=2, epoch=1) + batch(1, base=3, epoch=1),
            ["base offset 3", "below the end 4 of the previous batch"],
        ),
    ):
        with pytest.raises(PartitionLogError) as error:
            log.append_as_follower(bad)
        assert all(word in str(error.value) for word in words), str(error.value)
        assert snapshot(directory) == before and log.log_end_offset == 2


def test_follower_takes_batches_past_a_gap_a_compacted_leader_left() -> None:
    """The cleaner removes whole batches: the leader's next batch after a
    follower's log end may start later (UnifiedLog refuses only a first
    offset below the log end)."""
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    log.append_as_follower(batch(2, base=0, epoch=1))
    info = log.append_as_follower(batch(1, base=5, epoch=1) + batch(1, base=9, epoch=1))
    assert (info.first_offset, info.last_offset, log.log_end_offset) == (5, 9, 10)
    assert [b.base_offset for b in all_batches(log)] == [0, 5, 9]
    assert log.read(2, 1000).startswith(log.read(5, 1000)[:61])


def test_follower_refuses_malformed_and_corrupt_batches() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    log.append_as_follower(batch(1, base=0, epoch=1))
    before = snapshot(directory)
    good = bytearray(batch(1, base=1, epoch=1))
    flipped = bytearray(good)
    flipped[-1] ^= 1
    for bad in (bytes(good[:-3]), bytes(flipped), b"", b"\0" * 70):
        with pytest.raises(PartitionLogError) as error:
            log.append_as_follower(bad)
        assert error.value.code is Errors.CORRUPT_MESSAGE
        assert snapshot(directory) == before and log.log_end_offset == 1
    assert "CRC" in _message(lambda: log.append_as_follower(bytes(flipped)))


def _message(call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except PartitionLogError as error:
        return str(error)
    raise AssertionError("no error")


def test_leader_refuses_a_wrong_crc_and_too_large_batch() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(max_batch_bytes=200), now_ms=0)
    before = snapshot(directory)
    flipped = bytearray(batch(1))
    flipped[-1] ^= 1
    with pytest.raises(PartitionLogError) as error:
        log.append_as_leader(bytes(flipped), 0, now_ms=0)
    assert error.value.code is Errors.CORRUPT_MESSAGE and "CRC" in str(error.value)
    with pytest.raises(PartitionLogError) as error:
        log.append_as_leader(batch(1, value=b"x" * 300), 0, now_ms=0)
    assert error.value.code is Errors.MESSAGE_TOO_LARGE
    assert snapshot(directory) == before and log.log_end_offset == 0


def test_truncate_in_the_middle_of_a_segment_and_across_segments(
    directory: FileDirectory,
) -> None:
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    for n in range(15):
        epoch = n // 4
        log.append_as_leader(batch(2, producer=3, producer_epoch=0, sequence=2 * n), epoch, 0)
    bases = log.segment_base_offsets
    assert len(bases) >= 3
    # Inside a batch: the batch holding the offset goes whole.
    end = log.truncate_to(27)
    assert end == 26 and log.log_end_offset == 26
    assert log.epoch_cache.entries == derived_cache(log)
    assert log.producer_state.producers == derived_producers(log).producers
    # Across segments, to inside the first one.
    end = log.truncate_to(bases[1] - 2)
    assert log.segment_base_offsets == [0]
    assert log.epoch_cache.entries == derived_cache(log)
    assert log.producer_state.producers == derived_producers(log).producers
    names = directory.list()
    assert not any(n.startswith(file_name(b, "")) for b in bases[1:] for n in names)
    # The log goes on: sequences continue from the state kept.
    state = log.producer_state.entry(3)
    assert state is not None
    log.append_as_leader(
        batch(1, producer=3, producer_epoch=0, sequence=state.last_seq + 1), 9, now_ms=0
    )
    log.close()
    reopened = PartitionLog.open(directory, SMALL, now_ms=0)
    assert reopened.recovery.clean
    assert reopened.epoch_cache.entries == derived_cache(reopened)
    assert reopened.producer_state.producers == derived_producers(reopened).producers


def test_truncate_at_the_end_still_truncates_the_epoch_cache() -> None:
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    log.append_as_leader(batch(2), 1, now_ms=0)
    # A new leader's entry at its log end, with no batch yet (KIP-279).
    log._set_epoch_cache(log.epoch_cache.assign(2, 2))
    assert log.truncate_to(5) == 2
    assert log.epoch_cache.entries == (EpochEntry(1, 0),)
    with pytest.raises(PartitionLogError) as error:
        log.truncate_to(-1)
    assert error.value.code is Errors.OFFSET_OUT_OF_RANGE


def test_flush_messages_one_syncs_before_the_append_returns() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(flush_messages=1), now_ms=0)
    for _ in range(5):
        log.append_as_leader(batch(1), 0, now_ms=0)
    directory.crash()
    reopened = PartitionLog.open(directory, LogConfig(flush_messages=1), now_ms=0)
    assert not reopened.recovery.clean
    assert reopened.log_end_offset == 5


def test_without_flush_a_power_loss_loses_the_unsynced_tail() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    for _ in range(5):
        log.append_as_leader(batch(1), 0, now_ms=0)
    directory.crash()
    reopened = PartitionLog.open(directory, LogConfig(), now_ms=0)
    assert reopened.log_end_offset == 0 and reopened.epoch_cache.entries == ()


def test_flush_ms_syncs_by_time() -> None:
    directory = MemoryDirectory()
    config = LogConfig(flush_ms=100)
    log = PartitionLog.open(directory, config, now_ms=0)
    log.append_as_leader(batch(1), 0, now_ms=50)
    assert log.recovery_point == 0
    log.append_as_leader(batch(1), 0, now_ms=100)
    assert log.recovery_point == 2
    log.append_as_leader(batch(1), 0, now_ms=120)
    assert not log.maybe_flush(150)
    assert log.maybe_flush(200) and log.recovery_point == 3
    directory.crash()
    assert PartitionLog.open(directory, config, now_ms=0).log_end_offset == 3


def test_clean_reopen_rescans_nothing_and_removes_the_marker() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    for _ in range(10):
        log.append_as_leader(batch(2, producer=1, producer_epoch=0, sequence=0), 0, now_ms=0)
        log.producer_state.producers.clear()
    log.close()
    assert CLEAN_SHUTDOWN_FILE in directory.list()
    reopened = PartitionLog.open(directory, SMALL, now_ms=0)
    assert reopened.recovery.clean and reopened.recovery.truncated_bytes == 0
    assert CLEAN_SHUTDOWN_FILE not in directory.list()
    assert reopened.log_end_offset == 20
    assert reopened.producer_state.snapshot() == log.producer_state.snapshot()


def test_unclean_reopen_cuts_a_torn_tail_and_says_where(directory: FileDirectory) -> None:
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    log.append_as_leader(batch(1), 0, now_ms=0)
    log.flush(0)
    log.append_as_leader(batch(1), 1, now_ms=0)
    active = directory.open(file_name(0, ".log"))
    size = active.size
    active.truncate(size - 5)  # a torn write of the second batch
    active.close()
    reopened = PartitionLog.open(directory, LogConfig(), now_ms=0)
    recovery = reopened.recovery
    assert not recovery.clean and recovery.cut_segment == file_name(0, ".log")
    assert recovery.truncated_bytes == size - 5 - recovery.cut_position  # type: ignore[operator]
    assert recovery.reason is not None and "partial batch" in recovery.reason
    assert reopened.log_end_offset == 1
    assert reopened.epoch_cache.entries == (EpochEntry(0, 0),)


def test_unclean_reopen_drops_later_segments_after_a_cut() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    for _ in range(10):
        log.append_as_leader(batch(3), 0, now_ms=0)
    bases = log.segment_base_offsets
    # Damage the last segment but one past its start (recovery point
    # is below it only if written so: lower the checkpoint as a crash might).
    log._write_recovery_point(bases[-2])
    handle = directory.open(file_name(bases[-2], ".log"))
    data = bytearray(handle.read(0, handle.size))
    handle.close()
    middle = len(split_batches(data)[0])
    data[middle + 30] ^= 0xFF
    handle = directory.open(file_name(bases[-2], ".log"))
    handle.truncate(0)
    handle.append(bytes(data))
    handle.close()
    reopened = PartitionLog.open(directory, SMALL, now_ms=0)
    assert reopened.recovery.cut_segment == file_name(bases[-2], ".log")
    assert reopened.recovery.dropped_segments == (file_name(bases[-1], ".log"),)
    assert reopened.log_end_offset == bases[-2] + 3
    assert file_name(bases[-1], ".log") not in directory.list()


def test_corruption_below_the_recovery_point_refuses_to_open() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    for _ in range(4):
        log.append_as_leader(batch(1), 0, now_ms=0)
    log.close()
    directory.delete(CLEAN_SHUTDOWN_FILE)
    handle = directory.open(file_name(0, ".log"))
    data = bytearray(handle.read(0, handle.size))
    data[len(data) // 2 + 40] ^= 0xFF
    handle.truncate(0)
    handle.append(bytes(data))
    handle.close()
    before = snapshot(directory)
    with pytest.raises(PartitionLogError) as error:
        PartitionLog.open(directory, LogConfig(), now_ms=0)
    message = str(error.value)
    assert error.value.code is Errors.CORRUPT_MESSAGE
    assert file_name(0, ".log") in message and "offset 2" in message
    assert "recovery point 4" in message
    assert snapshot(directory) == before


@pytest.mark.parametrize(
    "name", ["notes.txt", "123.log", "00000000000000000000.logx", "leader-epoch-checkpointz"]
)
def test_a_directory_that_is_not_a_log_is_refused_naming_the_file(name: str) -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    log.append_as_leader(batch(1), 0, now_ms=0)
    log.close()
    directory.create(name).close()
    before = snapshot(directory)
    with pytest.raises(PartitionLogError) as error:
        PartitionLog.open(directory, LogConfig(), now_ms=0)
    assert error.value.code is Errors.KAFKA_STORAGE_ERROR and repr(name) in str(error.value)
    assert snapshot(directory) == before


def test_a_bad_recovery_point_file_is_refused() -> None:
    directory = MemoryDirectory()
    handle = directory.create(RECOVERY_POINT_FILE)
    handle.append(b"zero\n")
    handle.close()
    with pytest.raises(PartitionLogError) as error:
        PartitionLog.open(directory, LogConfig(), now_ms=0)
    assert RECOVERY_POINT_FILE in str(error.value)


def test_a_damaged_epoch_checkpoint_is_derived_again() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    for epoch in (1, 2, 2, 5):
        log.append_as_leader(batch(2), epoch, now_ms=0)
    log.close()
    handle = directory.open(CHECKPOINT_FILE_NAME)
    handle.truncate(3)
    handle.close()
    reopened = PartitionLog.open(directory, SMALL, now_ms=0)
    assert reopened.epoch_cache.entries == (
        EpochEntry(1, 0),
        EpochEntry(2, 2),
        EpochEntry(5, 6),
    )


def test_segment_age_rolls_with_jitter() -> None:
    config = LogConfig(segment_ms=1000, segment_jitter_ms=200)
    log = PartitionLog.open(MemoryDirectory(), config, now_ms=0)
    log.append_as_leader(batch(1, timestamp=0), 0, now_ms=0)
    log.append_as_leader(batch(1, timestamp=800), 0, now_ms=800)
    assert log.segment_base_offsets == [0]
    log.append_as_leader(batch(1, timestamp=801), 0, now_ms=801)
    assert log.segment_base_offsets == [0, 2]


def test_older_segments_are_not_all_held_open() -> None:
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    for _ in range(40):
        log.append_as_leader(batch(2), 0, now_ms=0)
    assert len(log.segment_base_offsets) > 8
    assert len(all_batches(log)) == 40
    assert len(log._open_old) <= 2


def test_config_out_of_range() -> None:
    with pytest.raises(ValueError, match="flush_messages"):
        LogConfig(flush_messages=0)
    with pytest.raises(ValueError, match="segment_jitter_ms"):
        LogConfig(segment_ms=10, segment_jitter_ms=10)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("retention_ms", -2),
        ("retention_bytes", -2),
        ("cleanup_policy", CleanupPolicy(0)),
        ("file_delete_delay_ms", -1),
        ("delete_retention_ms", -1),
        ("min_cleanable_dirty_ratio", 1.5),
        ("min_cleanable_dirty_ratio", -0.1),
        ("min_compaction_lag_ms", -1),
        ("max_compaction_lag_ms", 0),
    ],
)
def test_retention_and_cleanup_configs_out_of_range(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        LogConfig(**{field: value})  # type: ignore[arg-type]


def test_retention_and_cleanup_defaults_are_kafkas() -> None:
    config = LogConfig()
    assert config.retention_ms == 604800000
    assert config.retention_bytes == -1
    assert config.cleanup_policy is CleanupPolicy.DELETE
    assert config.deletes and not config.compacts
    assert config.file_delete_delay_ms == 60000
    assert config.delete_retention_ms == 86400000
    assert config.min_cleanable_dirty_ratio == 0.5
    assert config.min_compaction_lag_ms == 0
    assert config.max_compaction_lag_ms == 2**63 - 1
    both = LogConfig(cleanup_policy=CleanupPolicy.DELETE | CleanupPolicy.COMPACT)
    assert both.deletes and both.compacts
    assert LogConfig(retention_ms=-1, retention_bytes=-1).retention_ms == -1


@pytest.mark.parametrize(
    "policy", [CleanupPolicy.COMPACT, CleanupPolicy.COMPACT | CleanupPolicy.DELETE]
)
def test_a_compacted_log_refuses_a_record_without_a_key(policy: CleanupPolicy) -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(cleanup_policy=policy), now_ms=0)
    log.append_as_leader(batch(2), 0, 0)
    before = snapshot(directory)
    keyless = build_batch([Record(0, 1000, b"k", b"v"), Record(1, 1000, None, b"v")])
    with pytest.raises(PartitionLogError) as raised:
        log.append_as_leader(keyless, 0, 0)
    assert raised.value.code is Errors.INVALID_RECORD
    assert "Compacted topic cannot accept message without key" in str(raised.value)
    assert "offset delta 1" in str(raised.value)
    assert snapshot(directory) == before
    assert log.log_end_offset == 2


def test_a_delete_only_log_takes_records_without_a_key() -> None:
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    info = log.append_as_leader(build_batch([Record(0, 1000, None, b"v")]), 0, 0)
    assert info.last_offset == 0


def test_a_damaged_segment_after_a_clean_shutdown_refuses_with_the_files_unchanged() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    for _ in range(3):
        log.append_as_leader(batch(1), 0, now_ms=0)
    log.close()
    handle = directory.open(file_name(0, ".log"))
    handle.append(b"\0" * 20)  # bytes past the last batch
    handle.close()
    before = snapshot(directory)
    with pytest.raises(PartitionLogError) as error:
        PartitionLog.open(directory, LogConfig(), now_ms=0)
    assert error.value.code is Errors.CORRUPT_MESSAGE
    assert file_name(0, ".log") in str(error.value)
    assert snapshot(directory) == before
    assert CLEAN_SHUTDOWN_FILE in directory.list()


def test_leftover_temporary_and_orphan_index_files_are_removed_on_open() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    log.append_as_leader(batch(1), 0, now_ms=0)
    log.close()
    end = log.log_end_offset
    for name in (
        RECOVERY_POINT_FILE + ".tmp",
        file_name(1, ".snapshot.tmp"),
        file_name(end, ".index"),  # where the next roll puts its segment
        file_name(end, ".timeindex"),
    ):
        directory.create(name).close()
    reopened = PartitionLog.open(directory, SMALL, now_ms=0)
    assert [n for n in directory.list() if n.endswith(".tmp")] == []
    assert file_name(end, ".index") not in directory.list()
    for _ in range(10):  # rolls go on, at the end offset among others
        reopened.append_as_leader(batch(3), 0, now_ms=0)
    assert len(reopened.segment_base_offsets) > 1


def test_segment_recovery_refuses_a_cut_below_the_durable_offset() -> None:
    from partition_log.segment import Segment

    directory = MemoryDirectory()
    segment = Segment.create(directory, 0, now_ms=0)
    segment.append(batch(2, base=0))
    segment.append(batch(2, base=2))
    segment.close()
    handle = directory.open(file_name(0, ".log"))
    size = handle.size
    handle.truncate(size - 1)
    handle.close()
    with pytest.raises(PartitionLogError) as error:
        Segment.open(directory, file_name(0, ".log"), now_ms=0, recover=True, durable_offset=4)
    assert "damage at offset 2" in str(error.value) and "recovery point 4" in str(error.value)
    handle = directory.open(file_name(0, ".log"))
    assert handle.size == size - 1  # nothing cut
    handle.close()
    # At or below the kept end, the torn batch is cut as before.
    segment, result = Segment.open(
        directory, file_name(0, ".log"), now_ms=0, recover=True, durable_offset=2
    )
    assert result is not None and result.next_offset == 2 and result.truncated_bytes > 0


def test_log_append_time_is_stamped_by_the_leader() -> None:
    from partition_log.batch import TimestampType, decode_records, verify

    config = LogConfig(timestamp_type=TimestampType.LOG_APPEND_TIME)
    log = PartitionLog.open(MemoryDirectory(), config, now_ms=0)
    info = log.append_as_leader(batch(3, timestamp=5), 2, now_ms=9000)
    assert info.log_append_time == 9000
    stored = log.read(0, 1 << 20)
    header = verify(stored)  # the CRC was recomputed
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in decode_records(stored)] == [9000] * 3
    # Under CREATE_TIME the producer's timestamps stay.
    other = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    assert other.append_as_leader(batch(1, timestamp=5), 2, now_ms=9000).log_append_time == -1
    assert decode_records(other.read(0, 1 << 20))[0].timestamp == 5


def test_follower_refuses_a_producer_batch_without_a_sequence_before_appending() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    log.append_as_follower(batch(1, base=0, epoch=1))
    before = snapshot(directory)
    bad = batch(1, base=1, epoch=1, producer=4, producer_epoch=0, sequence=-1)
    with pytest.raises(PartitionLogError) as error:
        log.append_as_follower(bad)
    assert error.value.code is Errors.INVALID_RECORD and "base offset 1" in str(error.value)
    assert snapshot(directory) == before and log.log_end_offset == 1


def test_flush_messages_one_keeps_all_across_a_truncation_and_a_power_loss() -> None:
    directory = MemoryDirectory()
    config = LogConfig(flush_messages=1)
    log = PartitionLog.open(directory, config, now_ms=0)
    for _ in range(4):
        log.append_as_leader(batch(1), 0, now_ms=0)
    log.truncate_to(2)
    assert log.recovery_point == 2
    log.append_as_leader(batch(1), 1, now_ms=0)
    directory.crash()
    reopened = PartitionLog.open(directory, config, now_ms=0)
    assert reopened.log_end_offset == 3
    assert reopened.epoch_cache.entries == (EpochEntry(0, 0), EpochEntry(1, 2))


def test_overlapping_segments_refuse_to_open_with_the_files_unchanged() -> None:
    from partition_log.segment import Segment

    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    for _ in range(3):
        log.append_as_leader(batch(2), 0, now_ms=0)
    log.close()
    directory.delete(CLEAN_SHUTDOWN_FILE)
    overlapping = Segment.create(directory, 2, now_ms=0)
    overlapping.append(batch(1, base=2))
    overlapping.close()
    handle = directory.open(file_name(2, ".log"))
    handle.append(b"torn")  # a tail recovery would cut
    handle.close()
    before = snapshot(directory)
    with pytest.raises(PartitionLogError) as error:
        PartitionLog.open(directory, LogConfig(), now_ms=0)
    assert file_name(2, ".log") in str(error.value) and "ends at 6" in str(error.value)
    assert snapshot(directory) == before


def _brute_offset_for_timestamp(log: PartitionLog, timestamp: int) -> tuple[int, int] | None:
    for header in all_batches(log):
        data = log.read(max(header.base_offset, log.log_start_offset), 1)
        for record in decode_records(data[: header.size]):
            if record.offset >= log.log_start_offset and record.timestamp >= timestamp:
                return (record.offset, record.timestamp)
    return None


def test_offset_for_timestamp_finds_the_first_record_that_late() -> None:
    import random

    rng = random.Random(5)
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    # Mostly rising timestamps, some going back, several records a batch.
    now = 1000
    for _ in range(40):
        now += rng.randint(-30, 60)
        records = [Record(i, now + rng.randint(-20, 20), b"k", b"v") for i in range(3)]
        log.append_as_leader(build_batch(records), 0, 0)
    assert len(log.segments) > 3
    log.maybe_increment_high_watermark(log.log_end_offset)
    stamps = range(900, now + 100, 7)
    for timestamp in stamps:
        assert log.offset_for_timestamp(timestamp) == _brute_offset_for_timestamp(log, timestamp)
    assert log.offset_for_timestamp(now + 1000) is None
    assert log.offset_for_timestamp(-2) == (0, -1)
    assert log.offset_for_timestamp(-1) == (log.log_end_offset, -1)
    # Never below the log start, even inside a segment and a batch.
    log.delete_records(31)
    first = _brute_offset_for_timestamp(log, 0)
    assert first is not None and first[0] == 31
    assert log.offset_for_timestamp(0) == first
    for timestamp in stamps:
        assert log.offset_for_timestamp(timestamp) == _brute_offset_for_timestamp(log, timestamp)
    assert log.offset_for_timestamp(-2) == (31, -1)
    with pytest.raises(ValueError, match="timestamp -3"):
        log.offset_for_timestamp(-3)


def test_recovery_drops_the_segments_after_one_that_ends_short_of_the_next() -> None:
    # A recovered segment that lost whole batches at its end (cut at a batch
    # boundary, so no damaged byte to find) would leave a hole before the
    # next segment: recovery treats it as a cut and drops the later ones.
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    for _ in range(12):
        log.append_as_leader(batch(2), 0, now_ms=0)
    log.flush(0)
    bases = log.segment_base_offsets
    assert len(bases) >= 3
    middle = file_name(bases[1], ".log")
    kept = [h for h in all_batches(log) if bases[1] <= h.base_offset < bases[2]][0]
    directory.crash()
    # Recover everything, and cut the middle segment after its first batch.
    directory.delete(RECOVERY_POINT_FILE)
    handle = directory.create(RECOVERY_POINT_FILE)
    handle.append(b"0\n0\n")
    handle.sync()
    handle.close()
    directory.sync_directory()
    handle = directory.open(middle)
    handle.truncate(kept.size)
    handle.sync()
    handle.close()
    reopened = PartitionLog.open(directory, SMALL, now_ms=0)
    assert reopened.log_end_offset == kept.next_offset
    assert reopened.recovery.cut_segment == middle
    assert reopened.recovery.reason is not None and "missing" in reopened.recovery.reason
    assert reopened.recovery.dropped_segments == tuple(file_name(b, ".log") for b in bases[2:])
    offsets = [h.base_offset for h in all_batches(reopened)]
    assert offsets == sorted(offsets) and all_batches(reopened)[-1].next_offset == kept.next_offset
    assert reopened.epoch_cache.entries == derived_cache(reopened)
