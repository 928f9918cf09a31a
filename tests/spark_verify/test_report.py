"""spark_verify.report: the page's content, its escaping, and that it stands alone."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from spark_verify.report import MAX_KEY_ROWS, render_report, write_report
from spark_verify.timeline import BucketStats, FaultInterval, RunTimeline, Timeline

HOSTILE = "<script>alert('k')</script>"
RUN = "20260101T000000Z-register"

# Elements HTML closes by itself.
VOID = {"meta", "br", "hr", "col", "img", "input", "link", "source", "wbr", "area", "base"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str | None]
    text: list[str] = field(default_factory=list)


class Page(HTMLParser):
    """Parses the page, failing on any tag closed out of order or left open."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[Element] = []
        self.elements: list[Element] = []
        self.problems: list[str] = []
        self.feed(text)
        self.close()
        if self.stack:
            self.problems.append(f"never closed: {[e.tag for e in self.stack]}")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        e = Element(tag, dict(attrs))
        self.elements.append(e)
        if tag not in VOID:
            self.stack.append(e)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(Element(tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1].tag != tag:
            self.problems.append(f"</{tag}> closes {[e.tag for e in self.stack][-3:]}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        for e in self.stack:
            e.text.append(data)

    def find(self, tag: str, cls: str | None = None) -> list[Element]:
        return [
            e
            for e in self.elements
            if e.tag == tag and (cls is None or cls in (e.attrs.get("class") or "").split())
        ]

    def table_rows(self, cls: str) -> list[list[str]]:
        """The cell texts of every body row of the tables of class ``cls``."""
        rows: list[list[str]] = []
        inside = False
        for e in self.elements:
            if e.tag == "table":
                inside = cls in (e.attrs.get("class") or "").split()
            elif inside and e.tag == "tr":
                rows.append([])
            elif inside and e.tag == "td":
                rows[-1].append("".join(e.text))
        return [r for r in rows if r]


def parse(text: str) -> Page:
    page = Page(text)
    assert page.problems == []
    return page


WITNESS = [
    {"index": 4, "complete_index": 8, "process": 2, "f": "cas", "key": HOSTILE, "type": "info",
     "value": ["v0-1", "v2-1"], "error": "timeout", "time": 6_000_000, "node": 2},
    {"index": 16, "complete_index": 17, "process": 0, "f": "read", "key": HOSTILE, "type": "ok",
     "value": None, "result": "v2-1", "time": 2_500_100_000, "complete_time": 2_510_000_000,
     "node": 3, "offset": 8, "epoch": 2},
]  # fmt: skip


def verdict() -> dict[str, Any]:
    return {
        "format": 1,
        "valid": False,
        "elapsed_s": 3.5,
        "runs": [{"name": RUN, "path": f"runs/{RUN}", "model": "register", "ops": 9, "keys": 3}],
        "checks": {
            "well-formed": {"valid": True, "count": 0, "anomalies": [], "detail": {"ops": 9}},
            "linearizable": {
                "valid": False,
                "count": 250,
                "anomalies": [
                    {"check": "linearizable", "kind": "nonlinearizable",
                     "message": f"no linearization of {HOSTILE}", "run": RUN, "key": HOSTILE,
                     "witness": WITNESS},
                ],
                "detail": {"keys": 3},
            },
            "lost-commits": {
                "valid": "unknown",
                "count": 0,
                "anomalies": [],
                "detail": {"reason": "node 3 exported nothing"},
            },
            "log-agreement": {
                "valid": False,
                "count": 1,
                "anomalies": [
                    {"check": "log-agreement", "kind": "offset-conflict",
                     "message": "two records at offset 7", "node": 2,
                     "witness": [{"node": 1, "seq": 3, "offset": 7, "epoch": 2, "kind": "data",
                                  "hash": "ab" * 32}]},
                ],
                "detail": {},
            },
        },
    }  # fmt: skip


def run_timeline() -> RunTimeline:
    return RunTimeline(
        run=RUN,
        end_s=10.0,
        buckets=10,
        bucket_s=1.0,
        rows=(
            BucketStats(0, "read", "ok", 30, 30.0, 2.0, 3.0, 4.0, 5.0),
            BucketStats(1, "read", "ok", 25, 25.0, 2.5, 3.0, 9.0, 9.5),
            BucketStats(1, "write", "fail", 2, 2.0, 800.0, 900.0, 990.0, 1000.0),
            BucketStats(2, "write", "info", 1, 1.0),
            BucketStats(5, "read", "ok", 20, 20.0, 0.0, 1.0, 2.0, 2.0),
            BucketStats(6, "write", "ok", 10, 10.0, 5.0, 6.0, 7.0, 8.0),
        ),
        faults=(
            FaultInterval("kill", "kill-leader", "[2]", 1.0, 4.0),
            FaultInterval("partition", "halves", "[[1],[2,3]]", 3.0, 6.0),
            FaultInterval("pause", None, "[3]", 8.0, 10.0, ended=False),
        ),
    )


def key_row(key: str, valid: str, message: str | None = None) -> dict[str, Any]:
    return {
        "run": RUN,
        "key": key,
        "ops": 4,
        "valid": valid,
        "elapsed_ms": 1.25,
        "states": 7,
        "kind": None if valid == "true" else "nonlinearizable",
        "message": message,
        "witness": "[]",
    }


def render(keys: Sequence[dict[str, Any]] | None = None, **kw: Any) -> str:
    rows = keys if keys is not None else [
        key_row("k1", "true"),
        key_row(HOSTILE, "false", "<b>no</b> & more"),
        key_row("k2", "unknown", "budget"),
    ]  # fmt: skip
    return render_report(verdict(), {RUN: Timeline(10, (run_timeline(),))}, rows, **kw)


def test_report_shows_the_verdict_checks_plots_and_witnesses() -> None:
    text = render(title=f"verify {HOSTILE}")
    page = parse(text)
    banner = page.find("div", "verdict")
    assert len(banner) == 1 and "".join(banner[0].text) == "INVALID"
    assert "bad" in (banner[0].attrs["class"] or "")

    checks = {r[0]: r[1:] for r in page.table_rows("checks")}
    assert list(checks) == ["well-formed", "linearizable", "lost-commits", "log-agreement"]
    assert checks["well-formed"][:2] == ["valid", "0"]
    assert checks["linearizable"][:2] == ["INVALID", "250"]
    assert checks["lost-commits"] == ["unknown", "0", "node 3 exported nothing"]

    # Two plots, each with one shaded rect per fault interval.
    plots = page.find("svg", "plot")
    assert [p.attrs["aria-label"] for p in plots] == [
        f"throughput of run {RUN}",
        f"latency of run {RUN}",
    ]
    faults = page.find("rect", "fault")
    assert [f.attrs["data-fault"] for f in faults] == 2 * [
        "kill-leader",
        "partition halves",
        "pause",
    ]
    assert len({f.attrs["fill"] for f in faults}) == 3
    legend = ["".join(e.text) for e in page.find("span", "fault-key")]
    assert legend == ["kill-leader", "partition halves", "pause"]
    titles = "".join("".join(e.text) for e in page.find("title"))
    assert "pause [3]: 8.000 s to 10.000 s (never ended)" in titles
    # Axes in seconds, latency ticks with units on a log scale.
    ticks = ["".join(e.text) for e in page.find("text", "tick")]
    assert "0 s" in ticks and "10 s" in ticks
    assert {"1 ms", "10 ms", "100 ms", "1 s"} <= set(ticks)

    # The witness operations, with times in seconds and offset/epoch together.
    witness = page.table_rows("witness")
    assert witness[0] == [
        "4 → 8", "2", "cas", HOSTILE, "info", '["v0-1","v2-1"]', "", "timeout", "2", "0.006000", "",
    ]  # fmt: skip
    assert witness[1][-2:] == ["2.500100 → 2.510000", "8/2"]
    # node, offset/epoch, then the other fields by name: hash, kind, seq
    assert witness[2] == ["1", "7/2", "ab" * 32, "data", "3"]
    headings = ["".join(e.text) for e in page.find("h4")]
    assert "linearizable: 1 anomaly (the first 1 of 250 found are kept)" in headings
    assert "log-agreement: 1 anomaly" in headings  # of no run: after the runs

    # Keys: invalid first, then unknown, then valid; the hostile key shown as text.
    keys = page.table_rows("keys")
    assert [(r[0], r[1]) for r in keys] == [
        (HOSTILE, "INVALID"),
        ("k2", "unknown"),
        ("k1", "valid"),
    ]
    assert keys[0][-1] == "<b>no</b> & more"
    assert page.table_rows("summary") == [["1", "1", "1", "3"]]

    # Hostile text stays text: no script element, no tag from the data.
    assert page.find("script") == [] and page.find("b") == []
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "".join(page.find("title")[0].text) == f"verify {HOSTILE}"


def test_report_stands_alone() -> None:
    text = render(title="t")
    assert "http://" not in text and "https://" not in text
    page = parse(text)
    for e in page.elements:
        for name in ("src", "href", "xlink:href"):
            assert name not in e.attrs, f"<{e.tag}> refers to {e.attrs[name]}"
    assert not re.search(r"url\(|@import", text)
    assert page.find("style") and page.find("meta")[0].attrs == {"charset": "utf-8"}


def test_report_caps_the_keys_and_says_how_many_were_left_out() -> None:
    keys = [key_row(f"k{i:05d}", "true") for i in range(MAX_KEY_ROWS + 40)]
    keys[700] = key_row("bad", "false")
    keys[900] = key_row("maybe", "unknown")
    page = parse(render(keys, title="t"))
    rows = page.table_rows("keys")
    assert len(rows) == MAX_KEY_ROWS
    assert [r[0] for r in rows[:3]] == ["bad", "maybe", "k00000"]
    cap = page.find("p", "cap")
    assert ["".join(c.text) for c in cap] == ["40 more keys not shown (40 valid)."]
    assert page.table_rows("summary") == [
        [f"{MAX_KEY_ROWS + 38:,}", "1", "1", f"{MAX_KEY_ROWS + 40:,}"]
    ]

    few = parse(render(keys[:3], title="t", max_keys=1))
    assert ["".join(c.text) for c in few.find("p", "cap")] == ["2 more keys not shown (2 valid)."]
    assert parse(render(keys[:3], title="t")).find("p", "cap") == []


@pytest.mark.parametrize(
    ("valid", "word", "cls"), [(True, "valid", "ok"), ("unknown", "unknown", "unk")]
)
def test_report_colours_each_verdict(valid: object, word: str, cls: str) -> None:
    v = verdict()
    v["valid"] = valid
    page = parse(render_report(v, {}, [], title="t"))
    banner = page.find("div", "verdict")[0]
    assert "".join(banner.text) == word
    assert banner.attrs["class"] == f"verdict {cls}"
    # Without a timeline the run still gets its section, and says so.
    assert "no timeline" in "".join(e for p in page.find("p", "note") for e in p.text)


def test_report_refuses_bad_input() -> None:
    tl = Timeline(10, (run_timeline(),))
    with pytest.raises(ValueError, match=r"timelines\['other'\] holds the runs \['20260101"):
        render_report(verdict(), {"other": tl}, [], title="t")
    bad = verdict()
    bad["valid"] = "maybe"
    with pytest.raises(ValueError, match="the verdict: a verdict's valid must be"):
        render_report(bad, {}, [], title="t")
    bad = verdict()
    bad["checks"]["linearizable"]["anomalies"] = "none"
    with pytest.raises(ValueError, match="check 'linearizable': anomalies must be a list"):
        render_report(bad, {}, [], title="t")
    with pytest.raises(ValueError, match=r"keys row 0 \(key 'k'\)"):
        render_report(verdict(), {}, [key_row("k", "yes")], title="t")


def test_write_report(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    write_report(out, verdict(), Timeline(10, (run_timeline(),)).per_run(), [], title="t")
    text = out.read_text(encoding="utf-8")
    assert text == render_report(verdict(), {RUN: Timeline(10, (run_timeline(),))}, [], title="t")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_details_are_sentences_with_rounded_numbers() -> None:
    v = verdict()
    v["runs"][0].update(
        verdict="invalid", reason="anomalies found by linearizable", search_s=0.1 + 0.2
    )
    v["checks"]["well-formed"]["detail"] = {"problems": {}}
    v["checks"]["linearizable"]["detail"] = {
        "keys": 12345,
        "invalid": 1,
        "unknown": 0,
        "unknown_keys": [],
        "states": 2_000_000,
        "slowest_key_ms": 0.1 + 0.2,
        "key_budget_s": 10.0,
    }
    v["checks"]["log-agreement"]["detail"] = {"kinds": {"offset-conflict": 1}, "ratio": 2 / 3}
    v["checks"]["single-leader"] = {
        "valid": True,
        "count": 0,
        "anomalies": [],
        "detail": {"applicable": False, "reason": "no node exports"},
    }
    page = render_report(v, {RUN: Timeline(10, (run_timeline(),))}, [], title="t")
    text = re.sub(r"<[^>]+>", " ", page)
    assert "0.30000000000000004" not in page and "{}" not in text
    assert "0.6666" not in page and "ratio: 0.667" in text
    assert "no problems" in text
    assert (
        "12,345 keys; 1 invalid; 0 unknown; 2,000,000 states explored; slowest key 0.3 ms; "
        "budget 10 s per key" in text
    )
    assert "1 offset-conflict" in text
    assert "not applicable (no node exports)" in text
    assert "node 3 exported nothing" in text
    # The runs table: each run's verdict, its reason, and its search time.
    assert "INVALID" in text and "anomalies found by linearizable" in text and "0.3 s" in text
