"""Jepsen's ``history.edn``, read into kq's history lines.

A Jepsen test's store folder holds ``history.edn``: one operation map per
line (``jepsen.store`` writes each op with ``prn``), or, in older stores,
one EDN vector of them.  Each map is read with a real EDN reader
(``edn_format``) and becomes one line of kq's JSON Lines history
(``docs/history-format.md``), so that the rest of the checker reads both
alike:

- ``:type`` ``:invoke``/``:ok``/``:fail``/``:info``, ``:f``, ``:process``
  and ``:time`` are required; keywords become their names (``:write`` ->
  ``"write"``), ``nil`` becomes null;
- ``:value`` may be missing (a read's invoke): it is null;
- ``jepsen.independent`` histories (every client op's value a tuple
  ``[k v]``, Jepsen's ``independent/tuple``) take ``k`` as the key and ``v``
  as the value; other histories are one register, key ``"register"``;
- ``:cas`` values ``[old new]`` stay two-element lists;
- ``:error`` may be missing on a ``:fail`` (Jepsen's clients often omit it);
  when present it becomes text (a keyword's name, a string, or the EDN of
  anything else);
- the nemesis's ops (process ``:nemesis``) are left out: Jepsen records a
  fault as two ``:info`` ops, which are not kq's invoke/completion pairs,
  and linearizability does not depend on them;
- ``:index`` is checked (an integer >= 0) and the ops are renumbered in file
  order (Jepsen's index is that order); other fields (``:node`` names,
  ``:debug``, ``:exception``, ...) are left out.

Anything else is refused with :class:`EdnHistoryError`, naming the file,
the line and the field: a history that cannot be read is never given a
verdict.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import edn_format
from edn_format import Keyword, Symbol

from spark_verify.ops import JEPSEN_MODELS

__all__ = [
    "EDN_KEY",
    "JEPSEN_MODELS",
    "EdnHistory",
    "EdnHistoryError",
    "read_edn_history",
]

EDN_KEY: Final = "register"
"""The key of a history that is not ``jepsen.independent``: one register."""

_TYPES: Final = ("invoke", "ok", "fail", "info")
_KNOWN: Final = frozenset({"type", "f", "value", "process", "time", "index", "error"})
_KV_FS: Final = frozenset({"delete", "get", "put", "append"})


class EdnHistoryError(ValueError):
    """A ``history.edn`` that cannot be read; the message names file, line and field."""


@dataclass(frozen=True, slots=True)
class EdnHistory:
    """A history.edn read: kq history lines (JSON text, ``index`` from 0) with
    each one's line in the EDN file, and the model its ``:f`` values suggest."""

    lines: tuple[str, ...]
    file_lines: tuple[int, ...]
    model: str


def _ops(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """Each top-level op map with its 1-based line."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].lstrip().startswith(("[", "(")):
        # One vector of ops (older stores): its maps carry no line of their
        # own, so each is named by its position in the vector.
        try:
            values = edn_format.loads_all(text)
        except Exception as exc:  # edn_format raises several types
            raise EdnHistoryError(f"{path}: not EDN: {exc}") from None
        if len(values) != 1 or not isinstance(values[0], Sequence):
            raise EdnHistoryError(f"{path}: line {first + 1}: expected one vector of op maps")
        for op in values[0]:
            yield -1, op
        return
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            values = edn_format.loads_all(line)
        except Exception as exc:
            raise EdnHistoryError(f"{path}: line {number}: not EDN: {exc}") from None
        for op in values:
            yield number, op


def _name(x: Any) -> Any:
    return x.name if isinstance(x, Keyword | Symbol) else x


def _json(x: Any, where: str) -> Any:
    """An EDN value as JSON: keywords and symbols as their names, nil as null."""
    if x is None or isinstance(x, bool | int | str):
        return x
    if isinstance(x, float | Decimal):
        return float(x)
    if isinstance(x, Keyword | Symbol):
        return x.name
    if isinstance(x, Sequence) and not isinstance(x, str):
        return [_json(v, where) for v in x]
    if isinstance(x, Mapping):
        return {str(_json(k, where)): _json(v, where) for k, v in x.items()}
    raise EdnHistoryError(
        f"{where}: a value must be nil, a number, a string, a keyword, a "
        f"vector or a map, got {edn_format.dumps(x)}"
    )


def _key_text(k: Any, where: str) -> str:
    k = _name(k)
    if isinstance(k, bool) or not isinstance(k, int | str):
        raise EdnHistoryError(
            f"{where}: field :value: an independent key must be an integer, a string or a "
            f"keyword, got {edn_format.dumps(k)}"
        )
    return str(k)


def read_edn_history(path: Path) -> EdnHistory:
    """Read ``path`` (a ``history.edn``); see the module's docstring."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EdnHistoryError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise EdnHistoryError(f"{path}: not UTF-8 text: {exc.reason}") from None
    rows: list[tuple[int, str, dict[str, Any], bool]] = []
    for position, (number, raw) in enumerate(_ops(path, text)):
        where = f"{path}: line {number}" if number > 0 else f"{path}: op {position}"
        if not isinstance(raw, Mapping):
            raise EdnHistoryError(f"{where}: not an op map: {edn_format.dumps(raw)[:80]}")
        op = {str(_name(k)): v for k, v in raw.items()}
        missing = [f":{n}" for n in ("type", "f", "process", "time") if n not in op]
        if missing:
            raise EdnHistoryError(f"{where}: missing field(s) {', '.join(missing)}")
        kind = _name(op["type"])
        if kind not in _TYPES:
            raise EdnHistoryError(
                f"{where}: field :type must be :invoke, :ok, :fail or :info, got "
                f"{edn_format.dumps(op['type'])}"
            )
        process = _name(op["process"])
        nemesis = process == "nemesis"
        if not nemesis and (
            isinstance(process, bool) or not isinstance(process, int) or process < 0
        ):
            raise EdnHistoryError(
                f"{where}: field :process must be an integer >= 0 or :nemesis, got "
                f"{edn_format.dumps(op['process'])}"
            )
        f = _name(op["f"])
        if not isinstance(f, str) or not f:
            raise EdnHistoryError(
                f"{where}: field :f must be a keyword or a non-empty string, got "
                f"{edn_format.dumps(op['f'])}"
            )
        for field in ("time", "index"):
            v = op.get(field, 0)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise EdnHistoryError(
                    f"{where}: field :{field} must be an integer >= 0, got {edn_format.dumps(v)}"
                )
        if nemesis:
            continue
        value = _json(op.get("value"), f"{where}: field :value")
        line: dict[str, Any] = {"time": op["time"], "type": kind, "process": process, "f": f}
        error = op.get("error")
        if error is not None:
            error = _name(error)
            line["error"] = (
                error if isinstance(error, str) and error else edn_format.dumps(op["error"])
            )
        elif kind == "info":
            # kq's format wants a reason on info; Jepsen's says "indeterminate".
            line["error"] = "indeterminate"
        rows.append(
            (
                number if number > 0 else position,
                where,
                {**line, "value": value},
                kind == "invoke" and value is None,
            )
        )
    independent = bool(rows) and all(
        isinstance(r[2]["value"], list) and len(r[2]["value"]) == 2 for r in rows
    )
    lines: list[str] = []
    numbers: list[int] = []
    fs: set[str] = set()
    keys: dict[str, Any] = {}
    for index, (number, where, op, _) in enumerate(rows):
        value = op.pop("value")
        if independent:
            k, value = value
            key = _key_text(k, where)
            first = keys.setdefault(key, k)
            if first != k:
                raise EdnHistoryError(
                    f"{where}: field :value: keys {edn_format.dumps(first)} and "
                    f"{edn_format.dumps(k)} have the same name {key!r}"
                )
        else:
            key = EDN_KEY
        fs.add(op["f"])
        out = {
            "index": index,
            "time": op["time"],
            "type": op["type"],
            "process": op["process"],
            "f": op["f"],
            "key": key,
            "value": value,
        }
        if "error" in op:
            out["error"] = op["error"]
        lines.append(json.dumps(out, separators=(",", ":"), ensure_ascii=False))
        numbers.append(number)
    model = "kv" if fs & _KV_FS else "register"
    return EdnHistory(tuple(lines), tuple(numbers), model)
