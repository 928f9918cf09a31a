"""spark_verify.report's per-partition plots: HW and LEO per replica, the
leader's ISR size and the consumer lag, drawn from the series' data as inline
SVG on the run's time axis with its faults shaded."""

from __future__ import annotations

import re

from spark_verify.partitions import PartitionPlot, Series
from spark_verify.report import render_report
from spark_verify.timeline import FaultInterval, RunTimeline, Timeline
from tests.spark_verify.test_report import Page

RUN = "20260101T000000Z-queue"
HOSTILE = "<b>t</b>"


def verdict() -> dict[str, object]:
    return {
        "format": 1,
        "valid": True,
        "runs": [{"name": RUN, "model": "queue", "verdict": "valid"}],
        "checks": {},
    }


def plot(topic: str = "queue") -> PartitionPlot:
    return PartitionPlot(
        RUN,
        topic,
        0,
        "0",
        (
            Series("broker 4 HW", ((1.0, 0.0), (2.0, 5.0), (9.0, 12.0))),
            Series("broker 5 HW", ((1.5, 0.0), (9.5, 12.0))),
        ),
        (
            Series("broker 4 LEO", ((1.0, 2.0), (2.0, 6.0), (9.0, 12.0))),
            Series("broker 5 LEO", ((1.5, 0.0), (9.5, 12.0))),
        ),
        Series("ISR size", ((1.0, 3.0), (4.0, 2.0), (8.0, 3.0))),
        Series("consumer lag", ((2.0, 4.0), (6.0, 1.0))),
    )


def timelines() -> dict[str, Timeline]:
    rt = RunTimeline(
        RUN,
        end_s=10.0,
        buckets=10,
        bucket_s=1.0,
        faults=(FaultInterval("pause", None, "[5]", 3.0, 6.0),),
    )
    return {RUN: Timeline(10, (rt,))}


def test_each_partition_gets_its_three_plots_with_the_faults_shaded() -> None:
    page = render_report(verdict(), timelines(), [], title="t", partitions={RUN: [plot()]})
    assert Page(page).problems == []
    section = page[page.index("<h3>Partitions</h3>") :]
    assert "Partition queue-0 (key 0)" in section
    labels = re.findall(r'aria-label="([^"]*)"', section)
    assert labels == [
        f"HW and LEO of queue-0 in run {RUN}",
        f"ISR size of queue-0 in run {RUN}",
        f"consumer lag of queue-0 in run {RUN}",
    ]
    # The pause is shaded in all three, from 3 s to 6 s of the 10 s axis.
    assert section.count('data-fault="pause"') == 3
    for name in ("broker 4 HW", "broker 5 HW", "broker 4 LEO", "ISR size", "consumer lag"):
        assert f"<title>{name}</title>" in section
    # LEO dashed, HW solid, each replica one colour for both.
    hw = re.search(r"<title>broker 4 HW</title><path ([^>]*)/>", section)
    leo = re.search(r"<title>broker 4 LEO</title><path ([^>]*)/>", section)
    assert hw and leo and "stroke-dasharray" not in hw[1] and 'stroke-dasharray="5 3"' in leo[1]
    colour = re.search(r'stroke="([^"]+)"', hw[1])
    assert colour and f'stroke="{colour[1]}"' in leo[1]
    # A step line: the value is held until the next point (a vertical move
    # at 2 s from HW 0 to 5).
    points = re.findall(r"[ML]([\d.]+),([\d.]+)", re.search(r'd="([^"]+)"', hw[1])[1])  # type: ignore[index]
    xs = [float(x) for x, _ in points]
    assert xs[1] == xs[2] and len(points) == 5


def test_a_run_without_a_timeline_still_gets_its_partitions_and_text_is_escaped() -> None:
    empty = PartitionPlot(
        RUN, HOSTILE, 1, None, (), (), Series("ISR size", ()), Series("consumer lag", ())
    )
    page = render_report(verdict(), {}, [], title="t", partitions={RUN: [plot(), empty]})
    assert Page(page).problems == []
    assert HOSTILE not in page and "&lt;b&gt;t&lt;/b&gt;-1" in page
    assert "no partition state lines" in page and "no poll returned records" in page
    assert 'data-fault="' not in page
    # No partitions: no section.
    assert "<h3>Partitions</h3>" not in render_report(verdict(), timelines(), [], title="t")
