"""The byte primitives of kq's coordinator records: Kafka's big-endian layout
(``struct``'s ``>``) as the offsets topic's records (:mod:`broker.group.codec`)
and the transaction log's (:mod:`broker.txn.codec`) write and read it.

- ``int8``/``int16``/``int32``/``int64``: signed, of that width, each field
  with its own lowest allowed value (:class:`IntType`);
- ``string``: an int16 length then that many bytes of UTF-8; a ``nullable
  string`` is ``-1`` (no bytes) for ``None``;
- a count: an int32, never negative, refused before anything is read when
  the bytes left cannot hold that many of the smallest element.

Pure: no clock, no I/O.  A :class:`Writer` and a :class:`Reader` raise the
error class their codec gives them (a ``ValueError``), with a message that
names ``where`` (the record and part), the field and, on reading, the byte
offset; a reader raises nothing else, whatever the bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, Final

__all__ = [
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "NULL_LENGTH",
    "STRING_MAX",
    "IntType",
    "Reader",
    "Writer",
    "as_bytes",
]

INT8: Final = struct.Struct(">b")
INT16: Final = struct.Struct(">h")
INT32: Final = struct.Struct(">i")
INT64: Final = struct.Struct(">q")
# The longest string an int16 length can say.
STRING_MAX: Final = 2**15 - 1
# A nullable string's length for None.
NULL_LENGTH: Final = -1


@dataclass(frozen=True, slots=True)
class IntType:
    """A fixed-size int field: its struct and the lowest value it may hold
    (the highest is its width's).  A ``name`` (``"int32 count"``) is said in
    messages; without one the field's name says enough."""

    codec: struct.Struct
    low: int
    name: str = ""

    @property
    def high(self) -> int:
        return int(2 ** (8 * self.codec.size - 1) - 1)

    def below(self, value: int) -> str:
        """The problem of a value read below :attr:`low`."""
        if self.name and self.low == 0:
            return f"negative {self.name} {value}"
        return f"{value} is below {self.low}"


class Writer:
    """Appends fields to ``out``; ``where`` names the record and part (key or
    value) in the ``error`` it raises."""

    __slots__ = ("error", "out", "where")

    # How a too long string's limit is said ("more than 32767"); a codec's
    # subclass may say it its own way, its messages unchanged.
    string_limit: ClassVar[str] = f"{STRING_MAX}"

    def __init__(self, error: type[ValueError], where: str) -> None:
        self.error = error
        self.out = bytearray()
        self.where = where

    def fail(self, field: str, problem: str) -> ValueError:
        return self.error(f"{self.where}, field {field!r}: {problem}")

    def int_(self, field: str, kind: IntType, value: object) -> None:
        named = f" ({kind.name})" if kind.name else ""
        # bool is an int to Python but never a field of these records.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(field, f"{value!r} is not an int{named}")
        if not kind.low <= value <= kind.high:
            of = f" of {kind.name}" if kind.name else ""
            raise self.fail(field, f"{value} is out of range{of} [{kind.low}, {kind.high}]")
        self.out += kind.codec.pack(value)

    def string(self, field: str, value: object, *, nullable: bool = False) -> None:
        if value is None and nullable:
            self.out += INT16.pack(NULL_LENGTH)
            return
        if not isinstance(value, str):
            wanted = "a string or None" if nullable else "a string"
            raise self.fail(field, f"{value!r} is not {wanted}")
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise self.fail(field, f"not encodable as UTF-8 ({e.reason})") from None
        if len(data) > STRING_MAX:
            raise self.fail(field, f"{len(data)} bytes of UTF-8, more than {self.string_limit}")
        self.out += INT16.pack(len(data))
        self.out += data


class Reader:
    """Reads fields from ``data`` from the start; every failure is an
    ``error`` naming ``where``, the field and the byte offset."""

    __slots__ = ("data", "error", "pos", "where")

    # Said after "negative string length" of a string that is not nullable:
    # worth saying in a codec that has nullable strings too.
    not_nullable_note: ClassVar[str] = ""

    def __init__(self, error: type[ValueError], data: bytes, where: str) -> None:
        self.error = error
        self.data = data
        self.pos = 0
        self.where = where

    def fail(self, field: str, problem: str, at: int | None = None) -> ValueError:
        offset = self.pos if at is None else at
        return self.error(f"{self.where}, field {field!r}: {problem} at byte {offset}")

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, field: str, size: int) -> bytes:
        left = self.left()
        if size > left:
            raise self.fail(field, f"truncated ({size} bytes needed, {left} left)")
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out

    def fixed(self, field: str, codec: struct.Struct) -> int:
        value: int = codec.unpack(self.take(field, codec.size))[0]
        return value

    def int_(self, field: str, kind: IntType) -> int:
        at = self.pos
        value = self.fixed(field, kind.codec)
        if value < kind.low:
            raise self.fail(field, kind.below(value), at)
        return value

    def string(self, field: str, *, nullable: bool = False) -> str | None:
        at = self.pos
        length = self.fixed(field, INT16)
        if length == NULL_LENGTH and nullable:
            return None
        if length < 0:
            what = "length" if nullable else f"length{self.not_nullable_note}"
            raise self.fail(field, f"negative string {what} {length}", at)
        data = self.take(field, length)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(field, f"invalid UTF-8 ({e.reason})", at + 2 + e.start) from None

    def text(self, field: str) -> str:
        """A string that is not nullable."""
        value = self.string(field)
        assert value is not None  # not nullable: None was refused
        return value

    def count(self, field: str, kind: IntType, min_element_bytes: int) -> int:
        """A count of elements of at least ``min_element_bytes`` each: one
        the bytes left cannot hold is refused before anything is read."""
        at = self.pos
        count = self.int_(field, kind)
        left = self.left()
        if count * min_element_bytes > left:
            raise self.fail(field, f"count {count} is more than the {left} bytes left can hold", at)
        return count

    def end(self, note: str = "") -> None:
        """Every byte was read; ``note`` says why trailing ones are wrong."""
        left = self.left()
        if left:
            why = f" ({note})" if note else ""
            raise self.error(f"{self.where}: {left} trailing bytes at byte {self.pos}{why}")


def as_bytes(data: object, error: type[ValueError], where: str) -> bytes:
    """``data`` as bytes (a bytearray or memoryview copied), else ``error``
    naming ``where``."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise error(f"{where}: {type(data).__name__} is not bytes")
