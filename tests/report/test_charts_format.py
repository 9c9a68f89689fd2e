"""Charts and formatters: deterministic SVG, nice ticks, shading levels, articles."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st

from nnmem_sweep.report import charts
from nnmem_sweep.report.tables import level
from nnmem_sweep.report.format import article, gib, percent
from nnmem_sweep.units import GiB


def test_nice_step():
    assert charts.nice_step(80) == 20  # 80/6 = 13.3 -> 20
    assert charts.nice_step(7) == 2  # 1.17 -> 2
    assert charts.nice_step(0.5) == 0.1


@given(st.floats(min_value=1e-3, max_value=1e6))
def test_nice_step_covers_span(span):
    step = charts.nice_step(span)
    assert span / step <= 6 + 1e-9


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_level_is_monotonic_and_zero_only_for_no_fit(a, b):
    top = max(a, b, 1)
    lo, hi = sorted((a, b))
    assert level(lo, top) <= level(hi, top)
    assert (level(a, top) == 0) == (a == 0)
    assert 0 <= level(a, top) <= 5


def test_charts_are_deterministic_and_valid_xml():
    def draw():
        return [
            charts.stacked_bars("t", [("a & b", [GiB, 2 * GiB]), ("<c>", [3 * GiB, 0])], ["w", "g"], [("H100", 75 * GiB)]),
            charts.line_chart("t", [1, 2, 4, 8], [("seq 1", [GiB, 2 * GiB, None, 8 * GiB])], [("A100", 38 * GiB)], "batch"),
            charts.heatmap("t", ["r1", "r<2>"], ["G1", "A100-SXM4-40GB"], [[1, 0], [5, 3]], ["no", "1", "", "4", "", "9"]),
        ]
    first, second = draw(), draw()
    assert first == second
    for svg in first:
        ET.fromstring(svg)
    assert "&lt;c&gt;" in first[0] and "a &amp; b" in first[0] and "r&lt;2&gt;" in first[2]


def test_wrap_breaks_long_names_after_hyphens():
    assert charts._wrap("A100-SXM4-40GB", 11) == ["A100-SXM4-", "40GB"]
    assert charts._wrap("H100 SXM5 80GB (H100 80GB HBM3)", 11) == ["H100 SXM5", "80GB (H100", "80GB HBM3)"]


def test_spread_keeps_labels_apart_and_inside():
    assert charts.spread([10, 12, 50], 11, 0, 100) == [10, 21, 50]
    assert charts.spread([95, 96, 97], 11, 0, 100) == [78, 89, 100]


def test_formatters():
    assert gib(81559 * 2**20) == "79.6 GiB"  # 81559 MiB / 1024 = 79.647
    assert percent(0.05) == "5%" and percent(0.125) == "12.5%"
    assert [article(n) for n in ("H100 SXM", "A100 40GB", "L4", "RTX 4090", "T4", "GeForce", "Tesla")] == \
        ["an", "an", "an", "an", "a", "a", "a"]


def test_line_chart_stops_a_line_where_it_leaves_the_plot():
    # axis capped at 1.5 x 10 GiB = 15 GiB (nice step 5); the line 5 -> 10 -> 40 GiB crosses 15 GiB a sixth of
    # the way from batch 2 to batch 4, so its polyline has 3 points and the chart says so
    svg = charts.line_chart("t", [1, 2, 4], [("s", [5 * GiB, 10 * GiB, 40 * GiB])], [("G", 10 * GiB)], "batch")
    ET.fromstring(svg)
    points = svg.split('points="')[1].split('"')[0].split()
    assert len(points) == 3
    assert "leave the plot above 15 GiB" in svg
