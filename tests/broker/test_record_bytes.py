"""The coordinator records' byte primitives (broker/record_bytes.py) on their
own: each codec's error class, the ends of an int's range, a count refused
before it is read.  The codecs' tests (tests/broker/group/test_codec.py,
tests/broker/txn/test_codec.py) check the records built on them."""

from __future__ import annotations

import pytest

from broker.record_bytes import INT8, INT16, INT32, IntType, Reader, Writer, as_bytes


class _Error(ValueError):
    pass


def test_a_reader_raises_its_codecs_error_naming_where_field_and_offset() -> None:
    reader = Reader(_Error, b"\x00\x01\x00", "a key")
    assert reader.fixed("first", INT16) == 1
    with pytest.raises(_Error) as caught:
        reader.fixed("second", INT16)
    assert str(caught.value) == (
        "a key, field 'second': truncated (2 bytes needed, 1 left) at byte 2"
    )


def test_a_writer_raises_its_codecs_error() -> None:
    with pytest.raises(_Error, match="^a value, field 'n': '1' is not an int$"):
        Writer(_Error, "a value").int_("n", IntType(INT32, 0), "1")
    with pytest.raises(_Error, match="^a value: list is not bytes$"):
        as_bytes([], _Error, "a value")


def test_an_int_range_ends_at_its_width() -> None:
    epoch = IntType(INT16, -1)
    writer = Writer(_Error, "v")
    writer.int_("epoch", epoch, -1)
    writer.int_("epoch", epoch, 2**15 - 1)
    assert bytes(writer.out) == b"\xff\xff\x7f\xff"
    for value in (-2, 2**15):
        with pytest.raises(_Error, match=r"out of range \[-1, 32767\]"):
            writer.int_("epoch", epoch, value)
    reader = Reader(_Error, b"\xff\xfe", "v")
    with pytest.raises(_Error, match="-2 is below -1 at byte 0"):
        reader.int_("epoch", epoch)


def test_a_count_the_bytes_left_cannot_hold_is_refused() -> None:
    count = IntType(INT32, 0, "int32 count")
    # Three elements of at least 2 bytes each need 6 bytes; 5 are left.
    reader = Reader(_Error, b"\x00\x00\x00\x03" + b"\x00" * 5, "v")
    with pytest.raises(_Error, match="count 3 is more than the 5 bytes left can hold at byte 0"):
        reader.count("names", count, 2)
    reader = Reader(_Error, b"\x00\x00\x00\x03" + b"\x00" * 6, "v")
    assert reader.count("names", count, 2) == 3
    with pytest.raises(_Error, match="negative int32 count -1 at byte 0"):
        Reader(_Error, b"\xff\xff\xff\xff", "v").count("names", count, 2)


def test_trailing_bytes_are_refused() -> None:
    reader = Reader(_Error, b"\x00\x00\x00", "v")
    reader.fixed("n", INT16)
    with pytest.raises(_Error, match=r"^v: 1 trailing bytes at byte 2 \(why\)$"):
        reader.end("why")
    reader.fixed("m", INT8)
    reader.end()
