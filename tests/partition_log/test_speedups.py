"""The compiled record check (partition_log/_speedups.c) against its Python
reference (partition_log/records.py): on random valid records sections and on
damaged ones (every byte changed, truncations, extra bytes, overlong varints,
wrong counts) both give the same verdict, and a refusal the same message,
directly and through ``verify``; ``KQ_PURE_PYTHON=1`` turns the compiled
check off."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log import records as records_module
from partition_log.batch import HEADER_SIZE, Compression, build_batch, verify
from partition_log.errors import Errors, PartitionLogError
from partition_log.records import (
    Record,
    _records_fit,
    check_records_section,
    decode_records_section,
    encode_records_section,
)
from partition_log.speedups import compiled_records_fit

ROOT = Path(__file__).resolve().parents[2]
BASE_OFFSET = 1000
BASE_TIMESTAMP = 1_700_000_000_000

needs_compiled = pytest.mark.skipif(
    compiled_records_fit is None, reason="the C extension is not built (no compiler at install)"
)

Fit = Callable[[bytes | bytearray | memoryview, int, int], bool]
Outcome = tuple[Errors, str] | None


def outcome(call: Callable[[], object]) -> Outcome:
    try:
        call()
    except PartitionLogError as error:
        return error.code, str(error.args[0])
    return None


@contextmanager
def switched(fit: Fit | None) -> Iterator[None]:
    """``check_records_section`` with ``fit`` as its compiled walk (None:
    the Python walk), as the extension or KQ_PURE_PYTHON would set it."""
    saved = records_module._compiled_records_fit
    records_module._compiled_records_fit = fit
    try:
        yield
    finally:
        records_module._compiled_records_fit = saved


def check_outcome(fit: Fit | None, data: bytes, count: int, last_offset_delta: int) -> Outcome:
    with switched(fit):
        return outcome(
            lambda: check_records_section(
                data, count, BASE_OFFSET, BASE_TIMESTAMP, last_offset_delta
            )
        )


def assert_same_verdicts(fit: Fit, data: bytes, count: int, last_offset_delta: int) -> None:
    """``fit`` accepts exactly what the decoder accepts, and the check gives
    the decoder's answer and message with ``fit`` and with the Python walk."""
    decoded = outcome(
        lambda: decode_records_section(data, count, BASE_OFFSET, BASE_TIMESTAMP, last_offset_delta)
    )
    assert fit(data, count, last_offset_delta) == (decoded is None)
    assert fit(memoryview(data), count, last_offset_delta) == (decoded is None)
    if _records_fit(data, count, last_offset_delta):
        assert decoded is None  # the Python walk never accepts what decoding refuses
    assert check_outcome(fit, data, count, last_offset_delta) == decoded
    assert check_outcome(None, data, count, last_offset_delta) == decoded


OPTIONAL_BYTES = st.none() | st.binary(max_size=300)
HEADERS = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=8)), max_size=2)


@st.composite
def sections(draw: st.DrawFn) -> tuple[bytes, int, int]:
    """A valid records section, its record count and last offset delta."""
    gaps = draw(st.lists(st.integers(1, 3), max_size=8))
    with_headers = draw(st.booleans())
    offset = BASE_OFFSET - 1
    records = []
    for gap in gaps:
        offset += gap
        records.append(
            Record(
                offset,
                BASE_TIMESTAMP + draw(st.integers(-(2**40), 2**40)),
                draw(OPTIONAL_BYTES),
                draw(OPTIONAL_BYTES),
                tuple(draw(HEADERS)) if with_headers else (),
            )
        )
    last_delta = (offset - BASE_OFFSET) + draw(st.integers(0, 2))
    if not records:
        last_delta = draw(st.integers(0, 3))
    return encode_records_section(records, BASE_OFFSET, BASE_TIMESTAMP), len(records), last_delta


# -- the verdicts ---------------------------------------------------------------


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(sections())
def test_valid_sections_are_accepted_by_both(section: tuple[bytes, int, int]) -> None:
    assert compiled_records_fit is not None
    data, count, last_delta = section
    assert compiled_records_fit(data, count, last_delta)
    assert_same_verdicts(compiled_records_fit, data, count, last_delta)


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(sections(), st.data())
def test_damaged_sections_get_the_same_verdicts(
    section: tuple[bytes, int, int], data: st.DataObject
) -> None:
    assert compiled_records_fit is not None
    raw, count, last_delta = section
    damaged = bytearray(raw)
    kind = data.draw(st.sampled_from(["byte", "truncate", "extend", "varint", "count", "delta"]))
    if kind == "byte" and damaged:
        at = data.draw(st.integers(0, len(damaged) - 1))
        damaged[at] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        del damaged[data.draw(st.integers(0, len(damaged))) :]
    elif kind == "extend":
        damaged += data.draw(st.binary(min_size=1, max_size=12))
    elif kind == "varint":
        # An overlong or unterminated varint (more than 5 or 10 bytes) anywhere.
        at = data.draw(st.integers(0, len(damaged)))
        run = b"\xff" * data.draw(st.integers(1, 12)) + data.draw(st.sampled_from([b"", b"\x01"]))
        damaged[at:at] = run
    elif kind == "count":
        count = data.draw(st.sampled_from([count - 1, count + 1, 0, -1, 2**31 - 1]))
    else:
        last_delta = data.draw(st.sampled_from([last_delta - 1, 0, -1, 2**31 - 1]))
    assert_same_verdicts(compiled_records_fit, bytes(damaged), count, last_delta)


def _fixed_sections() -> list[tuple[bytes, int, int]]:
    records = [
        Record(BASE_OFFSET, BASE_TIMESTAMP, b"key", b"value" * 30),
        Record(BASE_OFFSET + 2, BASE_TIMESTAMP - 5, None, b"v", (("h", b"x"), ("\u00e9", None))),
        Record(BASE_OFFSET + 3, BASE_TIMESTAMP + 2**35, b"k" * 200, None),
    ]
    plain = [Record(BASE_OFFSET + i, BASE_TIMESTAMP + i, None, b"abc" * 50) for i in range(3)]
    return [
        (encode_records_section(records, BASE_OFFSET, BASE_TIMESTAMP), 3, 3),
        (encode_records_section(plain, BASE_OFFSET, BASE_TIMESTAMP), 3, 2),
    ]


@needs_compiled
@pytest.mark.parametrize("index", [0, 1], ids=["headers", "plain"])
def test_every_byte_changed_and_every_truncation(index: int) -> None:
    """Each byte of a section set to values that matter to varints and
    lengths (0, 1, 0x7f, 0x80, 0xff, the original with a bit flipped), and
    every prefix: the same verdict and message from both walks."""
    assert compiled_records_fit is not None
    data, count, last_delta = _fixed_sections()[index]
    refused = 0
    for at in range(len(data)):
        for value in {0x00, 0x01, 0x7F, 0x80, 0xFF, data[at] ^ 0x01, data[at] ^ 0x80}:
            damaged = bytearray(data)
            damaged[at] = value
            assert_same_verdicts(compiled_records_fit, bytes(damaged), count, last_delta)
            refused += not compiled_records_fit(damaged, count, last_delta)
    for end in range(len(data)):
        assert not compiled_records_fit(data[:end], count, last_delta)
        assert_same_verdicts(compiled_records_fit, data[:end], count, last_delta)
    # Changed key and value bytes are still valid records; changed lengths,
    # deltas and counts are not: both kinds occur.
    assert 20 <= refused < 7 * len(data)


@needs_compiled
def test_a_header_key_that_is_not_utf8_is_refused_as_the_decoder_does() -> None:
    assert compiled_records_fit is not None
    record = Record(BASE_OFFSET, BASE_TIMESTAMP, b"k", b"v", (("ab", b"x"),))
    data = encode_records_section([record], BASE_OFFSET, BASE_TIMESTAMP)
    at = data.index(b"ab")
    for bad in (b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0"):  # invalid, overlong, a surrogate
        damaged = data[:at] + bad + data[at + 2 :]
        assert not compiled_records_fit(damaged, 1, 0)
        assert_same_verdicts(compiled_records_fit, damaged, 1, 0)
        assert "header key at position" in str(check_outcome(compiled_records_fit, damaged, 1, 0))


@needs_compiled
def test_the_comparison_fires_on_a_walk_that_differs() -> None:
    """The comparison above is not vacuous: a walk that accepts a damaged
    section, or refuses a valid one, fails it."""
    data, count, last_delta = _fixed_sections()[1]
    with pytest.raises(AssertionError):
        assert_same_verdicts(lambda *_: True, data[:-1], count, last_delta)
    with pytest.raises(AssertionError):
        assert_same_verdicts(lambda *_: False, data, count, last_delta)


@needs_compiled
def test_bad_arguments_are_type_errors() -> None:
    assert compiled_records_fit is not None
    with pytest.raises(TypeError):
        compiled_records_fit("text", 1, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        compiled_records_fit(b"", 1)  # type: ignore[call-arg]
    with pytest.raises(OverflowError):
        compiled_records_fit(b"", 2**70, 0)


# -- through verify ---------------------------------------------------------------


def _recrc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return bytes(batch)


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(sections(), st.sampled_from(list(Compression)[:1] + [Compression.GZIP]), st.data())
def test_verify_answers_the_same_with_either_walk(
    section: tuple[bytes, int, int], codec: Compression, data: st.DataObject
) -> None:
    """A batch whose records are damaged but whose CRC matches (a producer's
    bug, not a disk's): verify's answer and message are the same with the
    compiled walk and with the Python one."""
    raw, count, last_delta = section
    records = decode_records_section(raw, count, BASE_OFFSET, BASE_TIMESTAMP, last_delta)
    batch = bytearray(
        build_batch(
            list(records),
            base_offset=BASE_OFFSET,
            base_timestamp=BASE_TIMESTAMP,
            last_offset_delta=last_delta,
            compression=codec,
        )
    )
    if codec is Compression.NONE and len(batch) > HEADER_SIZE and data.draw(st.booleans()):
        at = data.draw(st.integers(HEADER_SIZE, len(batch) - 1))
        batch[at] = data.draw(st.integers(0, 255))
    whole = _recrc(batch)
    with switched(compiled_records_fit):
        compiled = outcome(lambda: verify(whole))
        compiled_view = outcome(lambda: verify(memoryview(whole)))
    with switched(None):
        python = outcome(lambda: verify(whole))
    assert compiled == compiled_view == python


# -- the switch -------------------------------------------------------------------


def _active_walk(environment: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "KQ_PURE_PYTHON"} | environment
    code = (
        "from partition_log import records, speedups\n"
        "print(speedups.COMPILED, records._compiled_records_fit is not None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@needs_compiled
def test_kq_pure_python_turns_the_compiled_walk_off() -> None:
    assert _active_walk({}) == "True True"
    assert _active_walk({"KQ_PURE_PYTHON": "0"}) == "True True"
    assert _active_walk({"KQ_PURE_PYTHON": "1"}) == "False False"


def test_without_the_extension_the_python_walk_answers() -> None:
    """What an install without a compiler runs: the Python walk, accepting a
    valid section and refusing a damaged one with the decoder's message."""
    data, count, last_delta = _fixed_sections()[1]
    assert check_outcome(None, data, count, last_delta) is None
    refused = check_outcome(None, data[:-1], count, last_delta)
    assert refused is not None and refused[0] is Errors.CORRUPT_MESSAGE
    assert "record 2 of 3 is malformed" in refused[1]
