"""SVG charts drawn by hand: deterministic text (same input, same bytes), no plotting library, no external fetches.

Every function takes plain lists (labels already formatted, values in bytes) and returns one <svg> element as a
string. All text from the user (GPU names, labels) is XML-escaped here, because templates insert charts with |safe.
Coordinates are rounded to 0.1 px so the output does not depend on float noise.
"""
from __future__ import annotations

import math
import re
from xml.sax.saxutils import escape, quoteattr

from ..units import GiB

# Okabe & Ito (2008) colour-blind-safe palette, one colour per component, in columns.COMPONENTS order + overhead.
COMPONENT_COLOURS = ("#0072B2", "#56B4E9", "#009E73", "#E69F00", "#D55E00", "#CC79A7", "#F0E442", "#999999")
LINE_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
# Sequential shades for max batch (level 0 = does not fit). The report's CSS uses the same values for table cells.
# shades 0..5 (0 = does not fit, 1..5 larger batches), 6: fits the GPU, not the node's host memory (tables.HOST_LEVEL)
LEVEL_FILL = ("#f1f1f1", "#e3eef8", "#c6dbef", "#9ecae1", "#6baed6", "#2f7fc1", "#f3d9a4")
LEVEL_TEXT = ("#777777", "#111111", "#111111", "#111111", "#111111", "#ffffff", "#5a3d00")

WIDTH = 640
FONT = 11
CHAR_W = 6.2  # average glyph advance of an 11 px sans-serif, to size margins and legends


def _n(x: float) -> str:
    """A coordinate with at most one decimal, without a trailing '.0'."""
    text = f"{round(x, 1):.1f}"
    return text[:-2] if text.endswith(".0") else text


def _text(x: float, y: float, s: str, anchor: str = "start", size: int = FONT, extra: str = "") -> str:
    return (f'<text x="{_n(x)}" y="{_n(y)}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f"{escape(s)}</text>")


def _svg(height: float, body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {_n(height)}" '
            f'width="{WIDTH}" height="{_n(height)}" role="img" aria-label={quoteattr(title)} '
            f'font-family="DejaVu Sans, Arial, sans-serif">'
            f"<title>{escape(title)}</title>" + "".join(body) + "</svg>")


def nice_step(span: float, max_ticks: int = 6) -> float:
    """The smallest 1, 2 or 5 x 10^k step that covers `span` in at most `max_ticks` intervals."""
    if span <= 0:
        return 1.0
    raw = span / max_ticks
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power  # pragma: no cover


def _tick_label(v: float, step: float) -> str:
    return f"{v:,.0f}" if step >= 1 else f"{v:,.{max(0, -math.floor(math.log10(step)))}f}"


def _legend(items: list[tuple[str, str]], y: float, left: float) -> tuple[list[str], float]:
    """Swatches and labels flowing left to right, wrapping; returns the elements and the y below them."""
    out, x = [], left
    for label, colour in items:
        w = 16 + len(label) * CHAR_W + 14
        if x + w > WIDTH - 4 and x > left:
            x, y = left, y + 16
        out.append(f'<rect x="{_n(x)}" y="{_n(y - 9)}" width="10" height="10" fill="{colour}"/>')
        out.append(_text(x + 14, y, label))
        x += w
    return out, y + 8


def spread(wanted: list[float], gap: float, lo: float, hi: float) -> list[float]:
    """Positions as close as possible to `wanted` (ascending), at least `gap` apart, kept within [lo, hi] when they fit."""
    out: list[float] = []
    for w in wanted:
        out.append(max(w, lo, out[-1] + gap) if out else max(w, lo))
    for i in range(len(out) - 1, -1, -1):  # pushed past the bottom: slide the stack back up
        limit = hi if i == len(out) - 1 else out[i + 1] - gap
        out[i] = min(out[i], limit)
    return out


def _wrap(text: str, width: int) -> list[str]:
    """Words into lines of at most `width` characters; a longer word breaks after its hyphens ('A100-SXM4-' '40GB')."""
    lines: list[str] = []
    words = []
    for word in text.split():
        words += re.findall(r"[^-]+-?|-", word) if len(word) > width else [word]
    for word in words:
        if lines and lines[-1].endswith("-") and len(lines[-1]) + len(word) <= width:
            lines[-1] += word
            continue
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def stacked_bars(title: str, bars: list[tuple[str, list[int]]], segment_names: list[str],
                 capacities: list[tuple[str, int]]) -> str:
    """Horizontal stacked bars in GiB: one bar per (label, [bytes per segment]); dashed lines at GPU capacities."""
    left = min(260, max(60, max((len(b[0]) for b in bars), default=4) * CHAR_W + 12))
    right = WIDTH - 20
    bar_h, gap, top = 18, 8, 10
    plot_h = len(bars) * (bar_h + gap)
    xmax_bytes = max([sum(v) for _, v in bars] + [c for _, c in capacities] + [1])
    step = nice_step(xmax_bytes / GiB)
    xmax = math.ceil(xmax_bytes / GiB / step) * step

    def x(b: float) -> float:
        return left + (right - left) * (b / GiB) / xmax

    body: list[str] = []
    axis_y = top + plot_h
    ticks = int(round(xmax / step))
    for i in range(ticks + 1):
        v = i * step
        xx = left + (right - left) * v / xmax
        body.append(f'<line x1="{_n(xx)}" y1="{top}" x2="{_n(xx)}" y2="{_n(axis_y)}" stroke="#e0e0e0"/>')
        body.append(_text(xx, axis_y + 14, _tick_label(v, step), "middle"))
    body.append(_text((left + right) / 2, axis_y + 30, "GiB (2^30 bytes)", "middle"))
    for i, (label, values) in enumerate(bars):
        y = top + i * (bar_h + gap)
        body.append(_text(left - 6, y + bar_h - 5, label, "end"))
        acc = 0
        for j, v in enumerate(values):
            if v <= 0:
                continue
            body.append(f'<rect x="{_n(x(acc))}" y="{_n(y)}" width="{_n(x(acc + v) - x(acc))}" height="{bar_h}" '
                        f'fill="{COMPONENT_COLOURS[j % len(COMPONENT_COLOURS)]}"/>')
            acc += v
    for _label, cap in capacities:
        xx = x(cap)
        body.append(f'<line x1="{_n(xx)}" y1="{top - 4}" x2="{_n(xx)}" y2="{_n(axis_y)}" stroke="#000" '
                    f'stroke-dasharray="4 3"/>')
    body.append(f'<line x1="{_n(left)}" y1="{_n(axis_y)}" x2="{right}" y2="{_n(axis_y)}" stroke="#444"/>')
    items = [(name, COMPONENT_COLOURS[j % len(COMPONENT_COLOURS)]) for j, name in enumerate(segment_names) if name]
    legend, bottom = _legend(items, axis_y + 50, left=8)
    body += legend
    if capacities:
        caps = "; ".join(label for label, _ in capacities)
        for line in _wrap(f"dashed lines, left to right: usable memory of {caps}", int((WIDTH - 16) / 5.7)):
            body.append(_text(8, bottom + 12, line, size=10))
            bottom += 14
    return _svg(bottom + 4, body, title)


def _clip_to_top(points: list[tuple[int, int]], limit: float, px, py) -> list[tuple[float, float]]:
    """Pixel points of a line, ending where it first rises above `limit` (the crossing found on the drawn segment)."""
    out: list[tuple[float, float]] = []
    for i, (x, y) in enumerate(points):
        if y <= limit:
            out.append((px(x), py(y)))
            continue
        if i > 0:
            prev_x, prev_y = points[i - 1]
            ax, ay, bx, by = px(prev_x), py(prev_y), px(x), py(y)
            t = (limit - prev_y) / (y - prev_y)
            out.append((ax + t * (bx - ax), ay + t * (by - ay)))
        break
    return out


def _lines_and_legend(labels: list[str], lines: list[list[tuple[float, float]]], legend_y: float
                      ) -> tuple[list[str], float]:
    """One polyline with dots per series (pixel points, in LINE_COLOURS order), then their legend."""
    out: list[str] = []
    for k, pts in enumerate(lines):
        colour = LINE_COLOURS[k % len(LINE_COLOURS)]
        if not pts:
            continue
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                   + " ".join(f"{_n(a)},{_n(b)}" for a, b in pts) + '"/>')
        out += [f'<circle cx="{_n(a)}" cy="{_n(b)}" r="2.5" fill="{colour}"/>' for a, b in pts]
    legend, end = _legend([(label, LINE_COLOURS[k % len(LINE_COLOURS)]) for k, label in enumerate(labels)],
                          legend_y, left=8)
    return out + legend, end


def line_chart(title: str, xs: list[int], series: list[tuple[str, list[int | None]]],
               capacities: list[tuple[str, int]], x_label: str) -> str:
    """Total memory (bytes) against batch, one line per series, each GPU's usable memory as a horizontal line.

    The x axis is log2 when the batch values span a factor of 8 or more (batches are usually powers of two).
    """
    left, right, top, plot_h = 56, WIDTH - 150, 10, 260
    xs = sorted(xs)
    log = len(xs) > 1 and xs[0] > 0 and xs[-1] / xs[0] >= 8
    fx = (lambda v: math.log2(v)) if log else (lambda v: float(v))
    x0, x1 = fx(xs[0]), fx(xs[-1]) if len(xs) > 1 else fx(xs[0]) + 1
    if x1 == x0:
        x1 = x0 + 1
    values = [v for _, ys in series for v in ys if v is not None] + [c for _, c in capacities] + [1]
    # a line far above every GPU would flatten the capacities into the floor: cap the axis at 1.5x the largest
    # capacity and stop a line where it leaves the plot (totals only grow with batch)
    top_value = min(max(values), int(1.5 * max(c for _, c in capacities))) if capacities else max(values)
    clipped = top_value < max(values)
    step = nice_step(top_value / GiB)
    ymax = math.ceil(top_value / GiB / step) * step
    bottom_y = top + plot_h

    def px(v: float) -> float:
        return left + (right - left) * (fx(v) - x0) / (x1 - x0)

    def py(b: float) -> float:
        return bottom_y - plot_h * (b / GiB) / ymax

    body: list[str] = []
    for i in range(int(round(ymax / step)) + 1):
        v = i * step
        yy = bottom_y - plot_h * v / ymax
        body.append(f'<line x1="{left}" y1="{_n(yy)}" x2="{right}" y2="{_n(yy)}" stroke="#e6e6e6"/>')
        body.append(_text(left - 5, yy + 4, _tick_label(v, step), "end"))
    body.append(_text(12, top + plot_h / 2, "GiB", "middle", extra=f' transform="rotate(-90 12 {_n(top + plot_h / 2)})"'))
    for v in xs:
        body.append(f'<line x1="{_n(px(v))}" y1="{_n(bottom_y)}" x2="{_n(px(v))}" y2="{_n(bottom_y + 4)}" stroke="#444"/>')
        body.append(_text(px(v), bottom_y + 16, f"{v:,}", "middle"))
    body.append(_text((left + right) / 2, bottom_y + 32, x_label + (" (log scale)" if log else ""), "middle"))
    body.append(f'<line x1="{left}" y1="{_n(bottom_y)}" x2="{right}" y2="{_n(bottom_y)}" stroke="#444"/>')
    # capacity lines, labelled at the right edge; labels spread apart so they never overlap
    caps = sorted(capacities, key=lambda c: -c[1])  # top of the plot first
    wanted = [py(cap) + 4 for _, cap in caps]
    for label, cap in caps:
        yy = py(cap)
        body.append(f'<line x1="{left}" y1="{_n(yy)}" x2="{right}" y2="{_n(yy)}" stroke="#000" stroke-dasharray="5 3"/>')
    for (label, _), ly in zip(caps, spread(wanted, 11, top + 4, bottom_y + 4)):
        body.append(_text(right + 4, ly, label if len(label) <= 26 else label[:25] + "…", size=9))
    lines = [_clip_to_top([(xv, yv) for xv, yv in zip(xs, ys) if yv is not None], ymax * GiB, px, py)
             for _, ys in series]
    legend, end = _lines_and_legend([label for label, _ in series], lines, bottom_y + 52)
    body += legend
    if clipped:
        body.append(_text(8, end + 10, f"Lines that end early leave the plot above {ymax:,.0f} GiB.", size=10))
        end += 14
    return _svg(end + 4, body, title)


def heatmap(title: str, row_labels: list[str], col_labels: list[str], cells: list[list[int]],
            legend: list[str]) -> str:
    """A grid of shaded cells, level 0..6 (0 = does not fit; 6 = fits the GPU, not the node's host memory), with a
    legend of what each shade means.

    Cells carry no numbers (the tables do): a PDF renderer lays out every SVG text separately, and hundreds of them
    cost seconds.
    """
    left = min(300, max(60, max((len(r) for r in row_labels), default=4) * 5.7 + 10))
    cols = max(1, len(col_labels))
    cell_w = min(70, (WIDTH - left - 4) / cols)
    per_line = max(4, int(cell_w / 5.4))
    wrapped = [_wrap(label, per_line)[:4] for label in col_labels]
    cell_h, head = 12, 8 + 11 * max((len(w) for w in wrapped), default=1)
    body: list[str] = []
    for j, lines in enumerate(wrapped):
        cx = left + (j + 0.5) * cell_w
        for k, line in enumerate(lines):
            y = head - 4 - 11 * (len(lines) - 1 - k)
            body.append(_text(cx, y, line if len(line) <= per_line else line[: per_line - 1] + "…", "middle", size=9))
    for i, (label, row) in enumerate(zip(row_labels, cells)):
        y = head + i * cell_h
        body.append(_text(left - 6, y + cell_h - 3, label, "end", size=9))
        for j, level in enumerate(row):
            body.append(f'<rect x="{_n(left + j * cell_w)}" y="{_n(y)}" width="{_n(cell_w - 1)}" '
                        f'height="{cell_h - 1}" fill="{LEVEL_FILL[level]}"/>')
    y = head + len(row_labels) * cell_h + 18
    items = [(text, LEVEL_FILL[k]) for k, text in enumerate(legend) if text]
    out, end = _legend(items, y, left=8)
    return _svg(end + 4, body + out, title)


def concurrency_chart(title: str, contexts: list[int], series: list[tuple[str, list[int]]]) -> str:
    """Sequences that fit (y) against context length in tokens (x), one line per GPU; both axes log2 when they span
    a factor of 8 or more. A point with 0 sequences (not even one fits) is left out, so a line may end early."""
    left, right, top, plot_h = 56, WIDTH - 20, 10, 240
    xs = sorted(contexts)
    ys_all = [v for _, ys in series for v in ys if v > 0] or [1]
    log_x = len(xs) > 1 and xs[0] > 0 and xs[-1] / xs[0] >= 8
    log_y = max(ys_all) / min(ys_all) >= 8
    fx = (lambda v: math.log2(v)) if log_x else (lambda v: float(v))
    x0, x1 = fx(xs[0]), fx(xs[-1])
    if x1 == x0:
        x1 = x0 + 1
    if log_y:  # ticks at powers of two from 1 up past the largest value, at most 8 of them
        top_k = math.ceil(math.log2(max(ys_all)))
        stride = max(1, math.ceil((top_k + 1) / 8))
        y_ticks = [2 ** k for k in range(0, top_k + stride, stride)]
    else:
        step = max(1, nice_step(max(ys_all)))  # whole sequences
        y_ticks = [i * step for i in range(int(math.ceil(max(ys_all) / step)) + 1)]
    ymax = float(y_ticks[-1])
    fy = (lambda v: math.log2(v)) if log_y else (lambda v: float(v))
    bottom_y = top + plot_h

    def px(v: float) -> float:
        return left + (right - left) * (fx(v) - x0) / (x1 - x0)

    def py(v: float) -> float:
        return bottom_y - plot_h * fy(v) / (fy(ymax) or 1)

    body: list[str] = []
    for v in y_ticks:
        yy = py(v)
        body.append(f'<line x1="{left}" y1="{_n(yy)}" x2="{right}" y2="{_n(yy)}" stroke="#e6e6e6"/>')
        body.append(_text(left - 5, yy + 4, f"{v:,.0f}", "end"))
    body.append(_text(12, top + plot_h / 2, "sequences", "middle",
                      extra=f' transform="rotate(-90 12 {_n(top + plot_h / 2)})"'))
    labelled = spread([px(v) for v in xs], 34, left, right)
    for v, lx in zip(xs, labelled):
        body.append(f'<line x1="{_n(px(v))}" y1="{_n(bottom_y)}" x2="{_n(px(v))}" y2="{_n(bottom_y + 4)}" '
                    'stroke="#444"/>')
        body.append(_text(lx, bottom_y + 16, f"{v / 1024:,.0f}k" if v >= 10240 else f"{v:,}", "middle", size=9))
    body.append(_text((left + right) / 2, bottom_y + 32, "context (tokens per sequence" +
                      (", log scale)" if log_x else ")"), "middle"))
    body.append(f'<line x1="{left}" y1="{_n(bottom_y)}" x2="{right}" y2="{_n(bottom_y)}" stroke="#444"/>')
    lines = [[(px(x), py(y)) for x, y in zip(xs, ys) if y > 0] for _, ys in series]
    legend, end = _lines_and_legend([label for label, _ in series], lines, bottom_y + 52)
    return _svg(end + 4, body + legend, title)
