"""The verification report: one self-contained HTML page.

The page shows the overall verdict, a table of the checks, then for every run
its throughput and latency over time with the faults shaded (as Jepsen's
``perf`` checker draws them: what each fault did to the clients is the first
question about a failing run), the anomalies of that run with their witness
operations, and the per-key linearizability results (Knossos/Porcupine
verdicts, the invalid and unknown keys first).  A run with brokers adds, per
partition, HW and LEO over time per replica, the leader's ISR size and the
consumer lag, on the same time axis with the same faults shaded.

It opens from a file with no network: the CSS is inline, the plots are inline
SVG, and there is no script, font or image to fetch.  Every text that comes
from the data (keys and values are the users') goes through ``html.escape``:
the markup is built by :func:`_el`, which escapes every plain ``str`` child
and attribute, and only its own results (:class:`_Markup`) pass unescaped.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from spark_verify.partitions import PartitionPlot, Series
from spark_verify.timeline import FaultInterval, RunTimeline, Timeline
from spark_verify.verdict import UNKNOWN, Validity, validity_from_json

__all__ = ["MAX_KEY_ROWS", "MAX_WITNESS_ROWS", "render_report", "write_report"]

# Per run, the keys listed one per row; the rest are only counted.  A run of a
# million keys would otherwise make a page no browser opens.
MAX_KEY_ROWS = 1000

# Per anomaly, the witness rows shown.
MAX_WITNESS_ROWS = 50

# Table cells longer than this are cut (values may be long lists of records).
_MAX_CELL = 300


class _Markup(str):
    """Text that is already HTML; everything else is escaped on the way in."""

    __slots__ = ()


_VOID = frozenset({"meta", "br", "hr", "col"})


def _attr(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if math.isfinite(value) else "0"
    return html.escape(str(value), quote=True)


def _el(tag: str, attrs: Mapping[str, object] | None = None, *children: str) -> _Markup:
    """``<tag attrs>children</tag>``; plain-str children and every attribute escaped.

    With no children an SVG element is closed in place (``<rect .../>``).
    """
    a = "".join(f' {k.rstrip("_")}="{_attr(v)}"' for k, v in (attrs or {}).items() if v is not None)
    if tag in _VOID:
        return _Markup(f"<{tag}{a}>")
    if not children and tag in _SVG_EMPTY:
        return _Markup(f"<{tag}{a}/>")
    inner = "".join(c if isinstance(c, _Markup) else html.escape(c, quote=True) for c in children)
    return _Markup(f"<{tag}{a}>{inner}</{tag}>")


_SVG_EMPTY = frozenset({"rect", "line", "path", "circle", "polyline"})


def _cat(parts: Iterable[_Markup]) -> _Markup:
    return _Markup("".join(parts))


# -- verdicts ---------------------------------------------------------------

_VERDICT_WORD = {True: "valid", False: "INVALID", UNKNOWN: "unknown"}
_VERDICT_CLASS = {True: "ok", False: "bad", UNKNOWN: "unk"}


def _validity(value: object, where: str) -> Validity:
    # KEYS holds its verdicts as the text 'true'/'false'/'unknown'.
    if value == "true":
        return True
    if value == "false":
        return False
    try:
        return validity_from_json(value)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _badge(v: Validity) -> _Markup:
    return _el("span", {"class": f"badge {_VERDICT_CLASS[v]}"}, _VERDICT_WORD[v])


# -- formatting -------------------------------------------------------------


def _cut(text: str, limit: int = _MAX_CELL) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(value: Any) -> str:
    """A cell's text: strings as they are, anything else as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return _cut(value)
    return _cut(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))


def _num(x: float) -> str:
    """A tick label: as few digits as show the value."""
    if x == 0:
        return "0"
    if abs(x) >= 1000 or x == int(x):
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _ms(x: float) -> str:
    """A latency tick: ms below a second, s from one second."""
    if x >= 1000:
        return f"{_num(x / 1000)} s"
    return f"{_num(x)} ms"


def _secs(ns: Any) -> str:
    return f"{ns / 1e9:.6f}" if isinstance(ns, int | float) and not isinstance(ns, bool) else ""


# -- plots ------------------------------------------------------------------

_W, _H = 960, 250
_ML, _MR, _MT, _MB = 72, 16, 10, 40
_PW, _PH = _W - _ML - _MR, _H - _MT - _MB

# Tableau 10: one colour per function.
_F_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
# Pale fills for the faults, far from the lines' colours in lightness.
_FAULT_FILLS = (
    "#f4a582",
    "#92c5de",
    "#b8e186",
    "#c2a5cf",
    "#fddc8c",
    "#80cdc1",
    "#f1b6da",
    "#bababa",
)
_DASH = {"ok": None, "fail": "6 3", "info": "1.5 2.5"}
_Q_WIDTH = {"p50": 1.0, "p99": 2.2}


def _nice_step(span: float, n: int) -> float:
    raw = span / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _ticks(hi: float, n: int) -> list[float]:
    """Ticks from 0 to at least ``hi``, about ``n`` of them, at 1, 2 or 5 x 10^k."""
    if hi <= 0:
        return [0.0, 1.0]
    step = _nice_step(hi, n)
    count = math.ceil(hi / step - 1e-9)
    return [i * step for i in range(count + 1)]


@dataclass(frozen=True, slots=True)
class _Frame:
    """The x scale (seconds) shared by a run's plots, and its fault shading."""

    end_s: float
    faults: tuple[FaultInterval, ...]
    fills: Mapping[str, str]

    def x(self, t: float) -> float:
        return _ML + min(max(t / self.end_s, 0.0), 1.0) * _PW


def _frame_markup(frame: _Frame, y_ticks: Sequence[tuple[float, str]], y_title: str) -> _Markup:
    """Faults (under the data), grid, axes, ticks and titles."""
    parts: list[_Markup] = []
    for fault in frame.faults:
        x0, x1 = frame.x(fault.start_s), frame.x(fault.end_s)
        width = max(x1 - x0, 1.0)
        until = f"{fault.end_s:.3f} s" if fault.ended else f"{fault.end_s:.3f} s (never ended)"
        what = f"{fault.label} {fault.nodes or ''}".strip()
        parts.append(
            _el(
                "rect",
                {
                    "class": "fault",
                    "x": x0,
                    "y": _MT,
                    "width": width,
                    "height": _PH,
                    "fill": frame.fills[fault.label],
                    "fill-opacity": "0.45",
                    "data-fault": fault.label,
                },
                _el("title", None, f"{what}: {fault.start_s:.3f} s to {until}"),
            )
        )
        # A label only where it fits; the legend and the tooltip name the rest.
        label = fault.label if fault.ended else f"{fault.label} (not ended)"
        if width >= 6.2 * len(label) + 6:
            parts.append(_el("text", {"class": "flabel", "x": x0 + 3, "y": _MT + 11}, label))
        elif width >= 6.2 * len(fault.label) + 6:
            parts.append(_el("text", {"class": "flabel", "x": x0 + 3, "y": _MT + 11}, fault.label))
    x_ticks = _ticks(frame.end_s, 10)
    for t in x_ticks:
        if t > frame.end_s * (1 + 1e-9):
            continue
        x = frame.x(t)
        parts.append(_el("line", {"class": "grid", "x1": x, "x2": x, "y1": _MT, "y2": _MT + _PH}))
        parts.append(
            _el(
                "text",
                {"class": "tick", "x": x, "y": _MT + _PH + 14, "text-anchor": "middle"},
                f"{_num(t)} s",
            )
        )
    for y, label in y_ticks:
        parts.append(_el("line", {"class": "grid", "x1": _ML, "x2": _ML + _PW, "y1": y, "y2": y}))
        parts.append(
            _el("text", {"class": "tick", "x": _ML - 5, "y": y + 3.5, "text-anchor": "end"}, label)
        )
    parts.append(_el("rect", {"class": "axes", "x": _ML, "y": _MT, "width": _PW, "height": _PH}))
    parts.append(
        _el(
            "text",
            {"class": "atitle", "x": _ML + _PW / 2, "y": _H - 6, "text-anchor": "middle"},
            "time since the run started (s)",
        )
    )
    parts.append(
        _el(
            "text",
            {
                "class": "atitle",
                "x": 14,
                "y": _MT + _PH / 2,
                "text-anchor": "middle",
                "transform": f"rotate(-90 14 {_MT + _PH / 2:.1f})",
            },
            y_title,
        )
    )
    return _cat(parts)


def _path(points: Sequence[tuple[float, float]]) -> str:
    return "M" + "L".join(f"{x:.1f},{y:.1f}" for x, y in points)


def _series(
    segments: Sequence[Sequence[tuple[float, float]]],
    colour: str,
    dash: str | None,
    width: float,
    name: str,
) -> _Markup:
    parts: list[_Markup] = []
    for seg in segments:
        if len(seg) == 1:  # a lone bucket: a dot, or it would not show at all
            x, y = seg[0]
            parts.append(_el("circle", {"cx": x, "cy": y, "r": 1.2 + width / 2, "fill": colour}))
        elif seg:
            parts.append(
                _el(
                    "path",
                    {
                        "d": _path(seg),
                        "fill": "none",
                        "stroke": colour,
                        "stroke-width": f"{width:g}",
                        "stroke-dasharray": dash,
                        "stroke-linejoin": "round",
                    },
                )
            )
    return _el("g", {"class": "series"}, _el("title", None, name), *parts)


def _svg(label: str, body: _Markup) -> _Markup:
    return _el(
        "svg",
        {
            "class": "plot",
            "viewBox": f"0 0 {_W} {_H}",
            "width": _W,
            "height": _H,
            "role": "img",
            "aria-label": label,
        },
        body,
    )


def _throughput_plot(rt: RunTimeline, frame: _Frame, colours: Mapping[str, str]) -> _Markup:
    per: dict[tuple[str, str], list[float]] = {}
    for r in rt.rows:
        per.setdefault((r.f, r.type), [0.0] * rt.buckets)[r.bucket] = r.throughput
    top = max((max(v) for v in per.values()), default=0.0)
    ticks = _ticks(top, 5)
    hi = ticks[-1] or 1.0

    def y(v: float) -> float:
        return _MT + _PH - v / hi * _PH

    body = [_frame_markup(frame, [(y(t), f"{_num(t)}/s") for t in ticks], "completions per second")]
    for (f, type_), values in sorted(per.items(), key=lambda kv: (kv[0][0], _TYPES[kv[0][1]])):
        # An empty bucket is a bucket with no completion: zero, not a gap.
        points = [(frame.x((b + 0.5) * rt.bucket_s), y(v)) for b, v in enumerate(values)]
        body.append(_series([points], colours[f], _DASH.get(type_), 1.5, f"{f} {type_}"))
    if not per:
        body.append(_no_data("no operations"))
    return _svg(f"throughput of run {rt.run}", _cat(body))


_TYPES = {"ok": 0, "fail": 1, "info": 2}


def _latency_plot(rt: RunTimeline, frame: _Frame, colours: Mapping[str, str]) -> _Markup:
    per: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    for r in rt.rows:
        if r.type == "info":
            continue
        if r.p50_ms is not None:
            per[r.f, r.type, "p50"][r.bucket] = r.p50_ms
        if r.p99_ms is not None:
            per[r.f, r.type, "p99"][r.bucket] = r.p99_ms
    values = [v for d in per.values() for v in d.values()]
    positive = [v for v in values if v > 0]
    if not positive:
        body = [_frame_markup(frame, [], "latency (log scale)")]
        body.append(_no_data("no completed ok or fail operations"))
        return _svg(f"latency of run {rt.run}", _cat(body))
    # A log scale: latencies under faults run from a millisecond to the client's
    # timeout, and both ends matter.
    lo_exp = math.floor(math.log10(min(positive)))
    # A quarter of headroom, so that the slowest ops (often at the client's
    # timeout, a round number) are not drawn on the frame.
    hi_exp = math.ceil(math.log10(max(positive) * 1.25))
    if hi_exp == lo_exp:
        hi_exp += 1
    span = hi_exp - lo_exp

    def y(v: float) -> float:
        e = math.log10(v) if v > 0 else lo_exp
        return _MT + _PH - (e - lo_exp) / span * _PH

    ticks = [(y(10.0**e), _ms(10.0**e)) for e in range(lo_exp, hi_exp + 1)]
    body = [_frame_markup(frame, ticks, "latency (log scale)")]
    order = {"p50": 0, "p99": 1}
    for (f, type_, q), by_bucket in sorted(
        per.items(), key=lambda kv: (kv[0][0], _TYPES[kv[0][1]], order[kv[0][2]])
    ):
        segments: list[list[tuple[float, float]]] = []
        last = -2
        for b in sorted(by_bucket):
            if b != last + 1:  # no completion in a bucket: a gap in the line
                segments.append([])
            segments[-1].append((frame.x((b + 0.5) * rt.bucket_s), y(by_bucket[b])))
            last = b
        body.append(
            _series(segments, colours[f], _DASH.get(type_), _Q_WIDTH[q], f"{f} {type_} {q}")
        )
    return _svg(f"latency of run {rt.run}", _cat(body))


def _no_data(text: str) -> _Markup:
    return _el(
        "text",
        {"class": "nodata", "x": _ML + _PW / 2, "y": _MT + _PH / 2, "text-anchor": "middle"},
        text,
    )


def _line_swatch(colour: str, dash: str | None, width: float) -> _Markup:
    return _el(
        "svg",
        {"class": "sw", "width": 30, "height": 10, "viewBox": "0 0 30 10"},
        _el(
            "line",
            {
                "x1": 1,
                "x2": 29,
                "y1": 5,
                "y2": 5,
                "stroke": colour,
                "stroke-width": f"{width:g}",
                "stroke-dasharray": dash,
            },
        ),
    )


def _legend(colours: Mapping[str, str], fills: Mapping[str, str], types: set[str]) -> _Markup:
    items = [
        _el("span", {"class": "item"}, _line_swatch(c, None, 3), f) for f, c in colours.items()
    ]
    for t in sorted(types, key=_TYPES.__getitem__):
        items.append(_el("span", {"class": "item"}, _line_swatch("#333", _DASH[t], 1.5), t))
    items.append(_el("span", {"class": "item"}, _line_swatch("#333", None, _Q_WIDTH["p50"]), "p50"))
    items.append(_el("span", {"class": "item"}, _line_swatch("#333", None, _Q_WIDTH["p99"]), "p99"))
    for label, fill in fills.items():
        swatch = _el("span", {"class": "fsw", "style": f"background:{fill}"})
        items.append(_el("span", {"class": "item fault-key"}, swatch, label))
    return _el("div", {"class": "legend"}, *items)


def _run_plots(rt: RunTimeline) -> _Markup:
    fs = sorted({r.f for r in rt.rows})
    colours = {f: _F_COLOURS[i % len(_F_COLOURS)] for i, f in enumerate(fs)}
    labels = sorted({x.label for x in rt.faults})
    fills = {lab: _FAULT_FILLS[i % len(_FAULT_FILLS)] for i, lab in enumerate(labels)}
    frame = _Frame(end_s=rt.end_s if rt.end_s > 0 else 1.0, faults=rt.faults, fills=fills)
    totals = Counter[tuple[str, str]]()
    for r in rt.rows:
        totals[r.f, r.type] += r.count
    summary = ", ".join(
        f"{f} {t} {n:,}"
        for (f, t), n in sorted(totals.items(), key=lambda kv: (kv[0][0], _TYPES[kv[0][1]]))
    )
    return _cat(
        [
            _el(
                "p",
                {"class": "note"},
                f"{rt.end_s:.3f} s in {rt.buckets} buckets of {rt.bucket_s:.3f} s; "
                f"{len(rt.faults)} fault interval(s); completions: {summary or 'none'}.",
            ),
            _el("h4", None, "Throughput"),
            _throughput_plot(rt, frame, colours),
            _el("h4", None, "Latency (p50 and p99 per bucket)"),
            _latency_plot(rt, frame, colours),
            _legend(colours, fills, {r.type for r in rt.rows}),
        ]
    )


# -- the partitions' plots (runs with brokers) --------------------------------------

_HW_WIDTH, _LEO_DASH = 1.8, "5 3"


def _steps(
    points: Sequence[tuple[float, float]], frame: _Frame, y: Any
) -> list[tuple[float, float]]:
    """A value held until the next point: horizontal, then vertical."""
    out: list[tuple[float, float]] = []
    for i, (t, v) in enumerate(points):
        if i:
            out.append((frame.x(t), out[-1][1]))
        out.append((frame.x(t), y(v)))
    return out


def _step_plot(
    label: str,
    frame: _Frame,
    lines: Sequence[tuple[Series, str, str | None, float]],
    y_title: str,
    empty: str,
    integer: bool = False,
) -> _Markup:
    top = max((v for s, *_ in lines for _, v in s.points), default=0.0)
    ticks = _ticks(max(top, 1.0) if integer else top, 5)
    if integer:
        ticks = [t for t in ticks if t == int(t)]
    hi = ticks[-1] or 1.0

    def y(v: float) -> float:
        return _MT + _PH - v / hi * _PH

    body = [_frame_markup(frame, [(y(t), _num(t)) for t in ticks], y_title)]
    for series, colour, dash, width in lines:
        if series.points:
            body.append(
                _series([_steps(series.points, frame, y)], colour, dash, width, series.name)
            )
    if not any(s.points for s, *_ in lines):
        body.append(_no_data(empty))
    return _svg(label, _cat(body))


def _partition_plots(plot: PartitionPlot, frame: _Frame, colours: Mapping[str, str]) -> _Markup:
    title = plot.name + (f" (key {plot.key})" if plot.key is not None else "")
    replicas = [(s, colours[s.name.rsplit(" ", 1)[0]], None, _HW_WIDTH) for s in plot.hw] + [
        (s, colours[s.name.rsplit(" ", 1)[0]], _LEO_DASH, 1.2) for s in plot.leo
    ]
    return _cat(
        [
            _el("h4", None, f"Partition {title}"),
            _step_plot(
                f"HW and LEO of {plot.name} in run {plot.run}",
                frame,
                replicas,
                "offset",
                "no partition state lines",
            ),
            _step_plot(
                f"ISR size of {plot.name} in run {plot.run}",
                frame,
                [(plot.isr, "#333", None, 1.5)],
                "ISR size (leader's)",
                "no leader state lines",
                integer=True,
            ),
            _step_plot(
                f"consumer lag of {plot.name} in run {plot.run}",
                frame,
                [(plot.lag, "#d62728", None, 1.5)],
                "consumer lag (records)",
                "no poll returned records of this partition",
            ),
        ]
    )


def _partitions_section(plots: Sequence[PartitionPlot], rt: RunTimeline | None) -> _Markup:
    """Each partition of a run with brokers: HW (solid) and LEO (dashed) per
    replica, the leader's ISR size, the consumer lag, faults shaded as above."""
    # The run's time axis, stretched to the brokers' last line (they stop
    # after the history ends).
    end = max(
        (t for p in plots for s in (*p.hw, *p.leo, p.isr, p.lag) for t, _ in s.points),
        default=0.0,
    )
    faults = rt.faults if rt is not None else ()
    end = max(end, rt.end_s if rt is not None else 0.0) or 1.0
    labels = sorted({x.label for x in faults})
    fills = {lab: _FAULT_FILLS[i % len(_FAULT_FILLS)] for i, lab in enumerate(labels)}
    frame = _Frame(end_s=end, faults=faults, fills=fills)
    brokers = sorted({s.name.rsplit(" ", 1)[0] for p in plots for s in (*p.hw, *p.leo)})
    colours = {b: _F_COLOURS[i % len(_F_COLOURS)] for i, b in enumerate(brokers)}
    items = [
        _el("span", {"class": "item"}, _line_swatch(c, None, 3), b) for b, c in colours.items()
    ]
    items.append(_el("span", {"class": "item"}, _line_swatch("#333", None, _HW_WIDTH), "HW"))
    items.append(_el("span", {"class": "item"}, _line_swatch("#333", _LEO_DASH, 1.2), "LEO"))
    for label, fill in fills.items():
        swatch = _el("span", {"class": "fsw", "style": f"background:{fill}"})
        items.append(_el("span", {"class": "item fault-key"}, swatch, label))
    legend = _el("div", {"class": "legend"}, *items)
    parts = [
        _el(
            "p",
            {"class": "note"},
            f"{len(plots)} partition(s), from the brokers' partition state lines "
            "(one point per bucket, the last in it) and the history's polls.",
        ),
        legend,
    ]
    parts.extend(_partition_plots(p, frame, colours) for p in plots)
    return _cat(parts)


# -- tables -----------------------------------------------------------------


def _table(head: Sequence[str], rows: Iterable[Sequence[str | _Markup]], cls: str) -> _Markup:
    return _el(
        "table",
        {"class": cls},
        _el("thead", None, _el("tr", None, *(_el("th", None, h) for h in head))),
        _el("tbody", None, *(_el("tr", None, *(_el("td", None, c) for c in row)) for row in rows)),
    )


# Witness columns in this order, then any other field the witnesses carry
# (node-export lines: seq, kind, hash, leader, role).
_WITNESS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("index", "index"),
    ("process", "process"),
    ("f", "f"),
    ("key", "key"),
    ("type", "type"),
    ("value", "value"),
    ("result", "result"),
    ("error", "error"),
    ("node", "node"),
    ("time", "time (s)"),
    ("offset", "offset/epoch"),
)
# Shown inside another column: complete_index with index, the completion's
# time with the invoke's, epoch with offset.
_FOLDED = frozenset({"complete_index", "complete_time", "call", "ret", "epoch"})


def _witness_cell(w: Mapping[str, Any], col: str) -> str:
    if col == "index":
        done = w.get("complete_index")
        return _show(w.get("index")) + ("" if done is None else f" → {done}")
    if col == "time":
        start = w.get("time", w.get("call"))
        end = w.get("complete_time", w.get("ret"))
        text = _secs(start)
        return f"{text} → {_secs(end)}" if end is not None else text
    if col == "offset":
        off, ep = w.get("offset"), w.get("epoch")
        if off is None and ep is None:
            return ""
        return f"{_show(off)}/{_show(ep)}"
    return _show(w.get(col))


def _witness_table(witness: Sequence[Mapping[str, Any]]) -> _Markup:
    shown = [w for w in witness[:MAX_WITNESS_ROWS] if isinstance(w, Mapping)]
    present = {k for w in shown for k in w}
    aliases = {"time": {"time", "call", "complete_time", "ret"}, "offset": {"offset", "epoch"}}
    cols = [(k, h) for k, h in _WITNESS_COLUMNS if present & aliases.get(k, {k})]
    known = {k for k, _ in _WITNESS_COLUMNS} | _FOLDED
    cols += [(k, k) for k in sorted(present - known)]
    table = _table(
        [h for _, h in cols],
        ([_witness_cell(w, k) for k, _ in cols] for w in shown),
        "witness",
    )
    if len(witness) > len(shown):
        more = _el("p", {"class": "note"}, f"{len(witness) - len(shown):,} more witness rows")
        return _cat([table, more])
    return table


def _anomaly(a: Mapping[str, Any]) -> _Markup:
    facts = []
    for name in ("key", "node"):
        if a.get(name) is not None:
            facts.append(_el("span", {"class": "fact"}, f"{name} {_show(a[name])}"))
    witness = a.get("witness") or []
    if not isinstance(witness, list):
        raise ValueError(f"an anomaly's witness must be a list, not {witness!r}")
    return _el(
        "div",
        {"class": "anomaly"},
        _el("div", None, _el("span", {"class": "kind"}, _show(a.get("kind"))), *facts),
        _el("p", {"class": "msg"}, _show(a.get("message"))),
        _witness_table(witness) if witness else _el("p", {"class": "note"}, "no witness"),
    )


def _anomalies(checks: Mapping[str, Mapping[str, Any]], run: str | None) -> _Markup:
    """The anomalies of ``run`` (None: those of no run in particular), check by check."""
    parts: list[_Markup] = []
    for name, check in checks.items():
        mine = [a for a in check["anomalies"] if a.get("run") == run]
        if not mine:
            continue
        kept, count = len(check["anomalies"]), check["count"]
        note = f" (the first {kept:,} of {count:,} found are kept)" if count > kept else ""
        parts.append(
            _el(
                "h4",
                None,
                f"{name}: {len(mine):,} {'anomaly' if len(mine) == 1 else 'anomalies'}{note}",
            )
        )
        parts.extend(_anomaly(a) for a in mine)
    return _cat(parts)


_KEY_ORDER = {False: 0, UNKNOWN: 1, True: 2}


def _keys_section(rows: Sequence[Mapping[str, Any]], max_rows: int) -> _Markup:
    ranked = sorted(
        ((_KEY_ORDER[v], str(r.get("key")), v, r) for v, r in ((r["_valid"], r) for r in rows)),
        key=lambda t: (t[0], t[1]),
    )
    counts = Counter(v for _, _, v, _ in ranked)
    summary = _table(
        ["valid", "INVALID", "unknown", "keys"],
        [[f"{counts[True]:,}", f"{counts[False]:,}", f"{counts[UNKNOWN]:,}", f"{len(ranked):,}"]],
        "summary",
    )
    shown = ranked[:max_rows]
    table = _table(
        ["key", "verdict", "ops", "states", "time (ms)", "kind", "message"],
        (
            [
                _show(r.get("key")),
                _badge(v),
                _show(r.get("ops")),
                _show(r.get("states")),
                _fmt_ms(r.get("elapsed_ms")),
                _show(r.get("kind")),
                _show(r.get("message")),
            ]
            for _, _, v, r in shown
        ),
        "keys",
    )
    parts = [summary, table]
    left = ranked[max_rows:]
    if left:
        by = Counter(v for _, _, v, _ in left)
        what = ", ".join(f"{by[v]:,} {_VERDICT_WORD[v]}" for v in (False, UNKNOWN, True) if by[v])
        parts.append(
            _el("p", {"class": "note cap"}, f"{len(left):,} more keys not shown ({what}).")
        )
    return _cat(parts)


def _fmt_ms(x: Any) -> str:
    return f"{x:.1f}" if isinstance(x, int | float) and not isinstance(x, bool) else _show(x)


# -- the page ---------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 8px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #ccc}
h3{font-size:16px;margin:18px 0 6px}h4{font-size:14px;margin:14px 0 4px}
.verdict{font-size:28px;font-weight:700;padding:10px 16px;border-radius:6px;display:inline-block}
.verdict.ok{background:#e3f4e1;color:#1b6e20;border:2px solid #1b6e20}
.verdict.bad{background:#fde2e1;color:#a50f15;border:2px solid #a50f15}
.verdict.unk{background:#fff3d6;color:#8a5a00;border:2px solid #b07800}
.badge{font-weight:600;padding:0 6px;border-radius:3px}
.badge.ok{background:#e3f4e1;color:#1b6e20}.badge.bad{background:#fde2e1;color:#a50f15}
.badge.unk{background:#fff3d6;color:#8a5a00}
table{border-collapse:collapse;margin:6px 0}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td{font-variant-numeric:tabular-nums}
table.witness td,table.keys td{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
td{max-width:480px;overflow-wrap:anywhere}
.note{color:#555;font-size:13px}.cap{font-weight:600}
svg.plot{display:block;max-width:100%;height:auto;font-size:11px}
.plot .axes{fill:none;stroke:#444}.plot .grid{stroke:#e6e6e6}
.plot .tick{fill:#444}.plot .atitle{fill:#222;font-size:12px}
.plot .flabel{fill:#333;font-size:10px}.plot .nodata{fill:#888;font-size:14px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:4px 0 10px 72px;font-size:12px}
.legend .item{display:inline-flex;align-items:center;gap:4px}
.legend .fsw{display:inline-block;width:18px;height:12px;opacity:.8;border:1px solid #999}
.anomaly{border-left:3px solid #a50f15;padding:2px 10px;margin:8px 0}
.anomaly .kind{font-weight:600;color:#a50f15;margin-right:10px}
.anomaly .fact{margin-right:10px;color:#444}.anomaly .msg{margin:2px 0}
"""


def _checks(verdict: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    checks = verdict.get("checks")
    if not isinstance(checks, Mapping):
        raise ValueError(f"the verdict's checks must be an object, not {checks!r}")
    out: dict[str, dict[str, Any]] = {}
    for name, c in checks.items():
        if not isinstance(c, Mapping):
            raise ValueError(f"check {name!r}: must be an object, not {c!r}")
        anomalies = c.get("anomalies", [])
        if not isinstance(anomalies, list) or not all(isinstance(a, Mapping) for a in anomalies):
            raise ValueError(f"check {name!r}: anomalies must be a list of objects")
        count = c.get("count", len(anomalies))
        if isinstance(count, bool) or not isinstance(count, int):
            raise ValueError(f"check {name!r}: count must be an integer, not {count!r}")
        detail = c.get("detail", {})
        if not isinstance(detail, Mapping):
            raise ValueError(f"check {name!r}: detail must be an object, not {detail!r}")
        out[str(name)] = {
            "valid": _validity(c.get("valid"), f"check {name!r}"),
            "count": count,
            "anomalies": anomalies,
            "detail": detail,
        }
    return out


# A check's detail, as a sentence: each known counter's phrase ({} is the
# number, rounded), in this order; other counters follow as "name: value".
_PHRASES: Final = (
    ("keys", "{} keys"),
    ("invalid", "{} invalid"),
    ("unknown", "{} unknown"),
    ("states", "{} states explored"),
    ("slowest_key_ms", "slowest key {} ms"),
    ("key_budget_s", "budget {} s per key"),
    ("largest_key_cache_mib", "largest key's cache {} MiB"),
    ("key_memory_mib", "bound {} MiB per key"),
    ("writes", "{} writes"),
    ("checked", "{} checked"),
    ("uncheckable", "{} not checkable"),
    ("data_records", "{} data records"),
    ("runs", "{} runs checked"),
)
_SKIPPED: Final = frozenset({"applicable", "unknown_keys", "missing"})


def _number(x: Any) -> str:
    """A count with thousands separators; a float to at most 3 significant digits
    (``0.30000000000000004`` is 0.3), whole above 1,000."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return _show(x)
    if isinstance(x, int):
        return f"{x:,}"
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _counts_text(counts: Mapping[str, Any], none: str) -> str:
    """``{"open-invoke": 2, "index": 1}`` as "2 open-invoke, 1 index"; ``none`` if empty."""
    shown = [f"{_number(v)} {k}" for k, v in sorted(counts.items()) if v]
    return ", ".join(shown) if shown else none


def _detail(detail: Mapping[str, Any]) -> str:
    """A check's detail as a short sentence, never a raw dictionary."""
    if detail.get("applicable") is False:
        reason = detail.get("reason")
        return "not applicable" + (f" ({reason})" if isinstance(reason, str) else "")
    parts: list[str] = []
    for name, phrase in _PHRASES:
        if name in detail:
            parts.append(phrase.format(_number(detail[name])))
    for name in ("problems", "kinds"):
        value = detail.get(name)
        if isinstance(value, Mapping):
            word = "problems" if name == "problems" else "anomalies"
            parts.append(_counts_text(value, f"no {word}"))
    unknown_keys = detail.get("unknown_keys")
    if isinstance(unknown_keys, list) and unknown_keys:
        names = ", ".join(
            _show(k.get("key")) if isinstance(k, Mapping) else _show(k) for k in unknown_keys[:5]
        )
        more = f" and {len(unknown_keys) - 5:,} more" if len(unknown_keys) > 5 else ""
        parts.append(f"undecided keys: {names}{more}")
    missing = detail.get("missing")
    if isinstance(missing, list) and missing:
        parts.append("no final check recorded for " + ", ".join(_show(m) for m in missing))
    known = {n for n, _ in _PHRASES} | {"problems", "kinds"} | _SKIPPED
    for name, value in detail.items():
        if name in known:
            continue
        if name == "reason" and isinstance(value, str):
            parts.append(value)
        elif isinstance(value, Mapping):
            parts.append(f"{name}: {_counts_text(value, 'none')}")
        elif isinstance(value, list):
            parts.append(f"{name}: " + (", ".join(_show(v) for v in value) or "none"))
        else:
            parts.append(f"{name}: {_number(value)}")
    return _cut("; ".join(parts), 600) if parts else "nothing to report"


def render_report(
    verdict: Mapping[str, Any],
    timelines: Mapping[str, Timeline],
    keys: Sequence[Mapping[str, Any]],
    *,
    title: str,
    max_keys: int = MAX_KEY_ROWS,
    partitions: Mapping[str, Sequence[PartitionPlot]] | None = None,
) -> str:
    """The report as one HTML page with no external reference.

    ``verdict`` is the verdict JSON object (``format``, ``valid``, ``runs``,
    ``checks``, ``elapsed_s``); ``timelines`` maps a run's name to a Timeline
    holding that run (``Timeline.per_run()``); ``keys`` are KEYS rows (as
    mappings; Spark Rows are taken too); ``partitions`` maps a run with
    brokers to its partitions' series (``spark_verify.partitions.partition_plots``).
    """
    if not isinstance(verdict, Mapping):
        raise ValueError(f"the verdict must be a JSON object, not {type(verdict).__name__}")
    if max_keys < 0:
        raise ValueError(f"max_keys must be at least 0, not {max_keys}")
    overall = _validity(verdict.get("valid"), "the verdict")
    checks = _checks(verdict)
    runs = verdict.get("runs", [])
    if not isinstance(runs, list) or not all(
        isinstance(r, Mapping) and isinstance(r.get("name"), str) for r in runs
    ):
        raise ValueError("the verdict's runs must be a list of objects with a name")

    per_run: dict[str, RunTimeline] = {}
    for name, tl in timelines.items():
        try:
            per_run[name] = tl.run(name)
        except KeyError:
            have = [r.run for r in tl.runs]
            raise ValueError(
                f"timelines[{name!r}] holds the runs {have}, not {name!r} "
                "(key the timelines by run: Timeline.per_run())"
            ) from None

    keys_by_run: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for i, row in enumerate(keys):
        as_dict = getattr(row, "asDict", None)
        r = dict(as_dict() if callable(as_dict) else row)
        run = r.get("run")
        r["_valid"] = _validity(r.get("valid"), f"keys row {i} (key {r.get('key')!r})")
        keys_by_run[str(run)].append(r)

    names = [r["name"] for r in runs]
    extra = set(per_run) | set(keys_by_run)
    extra |= {a["run"] for c in checks.values() for a in c["anomalies"] if a.get("run")}
    extra |= set(partitions or {})
    names += sorted(n for n in extra if n not in set(names))

    elapsed = verdict.get("elapsed_s")
    head = [
        _el("h1", None, title),
        _el("div", {"class": f"verdict {_VERDICT_CLASS[overall]}"}, _VERDICT_WORD[overall]),
    ]
    if isinstance(elapsed, int | float) and not isinstance(elapsed, bool):
        head.append(_el("p", {"class": "note"}, f"verified in {elapsed:.1f} s"))
    if runs:
        head.append(
            _table(
                ["run", "model", "ops", "keys", "verdict", "search time", "path"],
                (
                    [
                        _show(r.get("name")),
                        _show(r.get("model")),
                        _count(r.get("ops")),
                        _count(r.get("keys")),
                        _run_verdict(r),
                        _seconds(r.get("search_s")),
                        _show(r.get("path")),
                    ]
                    for r in runs
                ),
                "runs",
            )
        )
    head.append(_el("h2", None, "Checks"))
    head.append(
        _table(
            ["check", "verdict", "anomalies", "detail"],
            (
                [name, _badge(c["valid"]), f"{c['count']:,}", _detail(c["detail"])]
                for name, c in checks.items()
            ),
            "checks",
        )
    )

    body: list[_Markup] = head
    for name in names:
        body.append(_el("h2", None, f"Run {name}"))
        rt = per_run.get(name)
        body.append(
            _run_plots(rt) if rt is not None else _el("p", {"class": "note"}, "no timeline")
        )
        if partitions and partitions.get(name):
            body.append(_el("h3", None, "Partitions"))
            body.append(_partitions_section(partitions[name], rt))
        found = _anomalies(checks, name)
        if found:
            body.append(_el("h3", None, "Anomalies"))
            body.append(found)
        if keys_by_run.get(name):
            body.append(_el("h3", None, "Keys"))
            body.append(_keys_section(keys_by_run[name], max_keys))
    loose = _anomalies(checks, None)
    if loose:
        body.append(_el("h2", None, "Anomalies of no single run"))
        body.append(loose)

    page = _el(
        "html",
        {"lang": "en"},
        _el(
            "head",
            None,
            _el("meta", {"charset": "utf-8"}),
            _el("meta", {"name": "viewport", "content": "width=device-width, initial-scale=1"}),
            _el("title", None, title),
            _el("style", None, _Markup(_CSS)),
        ),
        _el("body", None, *body),
    )
    return "<!DOCTYPE html>\n" + page + "\n"


_RUN_VERDICTS: Final = {
    "valid": ("valid", "ok"),
    "invalid": ("INVALID", "bad"),
    "unknown": ("unknown", "unk"),
    "cannot-verify": ("cannot verify", "bad"),
}


def _run_verdict(run: Mapping[str, Any]) -> _Markup | str:
    word, css = _RUN_VERDICTS.get(str(run.get("verdict")), ("", ""))
    if not word:
        return ""
    badge = _el("span", {"class": f"badge {css}"}, word)
    reason = run.get("reason")
    if run.get("verdict") != "valid" and isinstance(reason, str):
        return _cat([badge, _Markup(" "), _Markup(html.escape(_cut(reason, 200)))])
    return badge


def _seconds(x: Any) -> str:
    return f"{_number(x)} s" if isinstance(x, int | float) and not isinstance(x, bool) else ""


def _count(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else _show(x)


def write_report(
    path: str | os.PathLike[str],
    verdict: Mapping[str, Any],
    timelines: Mapping[str, Timeline],
    keys: Sequence[Mapping[str, Any]],
    *,
    title: str,
    max_keys: int = MAX_KEY_ROWS,
    partitions: Mapping[str, Sequence[PartitionPlot]] | None = None,
) -> None:
    """Render the report and write it to ``path`` (UTF-8), replacing the file atomically."""
    text = render_report(
        verdict, timelines, keys, title=title, max_keys=max_keys, partitions=partitions
    )
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, path)
