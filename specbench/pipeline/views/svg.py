"""Charts as inline SVG, drawn by hand: an HTML report carries its figures in the page itself (no
plotting library, no font files, no network), and every point or bar carries its numbers, as a tooltip
for the reader and as ``data-x``/``data-y`` attributes for a test or a scraper.

Three kinds, the ones the report needs: lines over a numeric x (acceptance by draft position, speedup
by concurrency), grouped bars over categories (tokens committed per step) and a scatter with the
y = x diagonal (predicted against measured speedup). NaN points are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

# matplotlib's tab10: ten colours that stay apart for the common forms of colour blindness
PALETTE = (
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
WIDTH, HEIGHT = 560, 320
LEFT, RIGHT, TOP, BOTTOM = 62, 16, 30, 46


@dataclass(frozen=True)
class Series:
    label: str
    points: list[tuple[float, float]]  # (x, y); for bars x is the category's index
    intervals: list[tuple[float, float]] | None = None  # (low, high) of each point's y: an error bar
    dashed: bool = False  # drawn as a dashed line (an envelope, beside the measured curves)


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round ticks (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high - low <= 1e-9 * max(1.0, abs(high)):  # one value (up to rounding): a unit around it
        low, high = low - 0.5, high + 0.5
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    # the round step whose number of intervals is nearest the one asked for
    step = min((m * power for m in (1, 2, 5, 10)), key=lambda s: abs((high - low) / s - (count - 1)))
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value < high + step * 0.999 and len(ticks) < 4 * count:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.2g}"


class _Axes:
    """Data -> pixel coordinates over the plot area, and the frame, ticks and labels drawn around it."""

    def __init__(self, xs, ys, y_range=None, log2_x=False, x_ticks=None):
        self.log2_x = log2_x
        xs = [self._x(x) for x in xs]
        self.x_ticks = x_ticks if x_ticks is not None else nice_ticks(min(xs), max(xs))
        if log2_x:
            self.x_ticks = list(range(math.floor(min(xs)), math.ceil(max(xs)) + 1))
        low, high = y_range if y_range else (min(ys), max(ys))
        self.y_ticks = nice_ticks(low, high)
        if y_range:
            self.y_ticks = [t for t in self.y_ticks if low - 1e-9 <= t <= high + 1e-9]
        self.x0, self.x1 = min(self.x_ticks[0], min(xs)), max(self.x_ticks[-1], max(xs))
        self.y0, self.y1 = (low, high) if y_range else (self.y_ticks[0], self.y_ticks[-1])
        if self.x1 == self.x0:
            self.x0, self.x1 = self.x0 - 1, self.x1 + 1

    def _x(self, x: float) -> float:
        return math.log2(x) if self.log2_x else x

    def px(self, x: float) -> float:
        span = WIDTH - LEFT - RIGHT
        return LEFT + (self._x(x) - self.x0) / (self.x1 - self.x0) * span

    def py(self, y: float) -> float:
        span = HEIGHT - TOP - BOTTOM
        return HEIGHT - BOTTOM - (y - self.y0) / (self.y1 - self.y0) * span

    def frame(self, xlabel: str, ylabel: str, x_names: list[str] | None = None) -> list[str]:
        out = [
            f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
            f'height="{HEIGHT - TOP - BOTTOM}" fill="none" stroke="#999"/>'
        ]
        for tick in self.y_ticks:
            y = self.py(tick)
            out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>')
            out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(tick)}</text>')
        if x_names is None:
            for tick in self.x_ticks:
                x = LEFT + (tick - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)
                name = _label(2**tick) if self.log2_x else _label(tick)
                out.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{name}</text>')
        out.append(
            f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 10}" text-anchor="middle">'
            f"{escape(xlabel)}</text>"
        )
        out.append(
            f'<text transform="translate(14 {(TOP + HEIGHT - BOTTOM) / 2:.0f}) rotate(-90)" '
            f'text-anchor="middle">{escape(ylabel)}</text>'
        )
        return out


def _open(title: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="11">',
        f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]


def _point(x: float, y: float, label: str, shown_x, shown_y, fill: str, ring: bool = False) -> str:
    tip = f"{escape(label)}: {shown_x}, {_fmt(shown_y)}"
    data = f'data-series="{escape(label)}" data-x="{shown_x!r}" data-y="{shown_y!r}"'
    paint = f'r="7" fill="none" stroke="{fill}"' if ring else f'r="3.5" fill="{fill}"'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" {paint} {data}><title>{tip}</title></circle>'


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _finite(points) -> list[tuple[float, float]]:
    """The points with both coordinates finite, as plain Python numbers (numpy's repr is not a number)."""
    plain = [tuple(v.item() if hasattr(v, "item") else v for v in point) for point in points]
    return [
        (x, y) for x, y in plain if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
    ]


def _bars(series: Series) -> list[tuple[float, float, float]]:
    """(x, low, high) of each point whose coordinates and interval are finite."""
    if not series.intervals:
        return []
    return [
        (x, low, high)
        for (x, y), (low, high) in zip(series.points, series.intervals, strict=True)
        if _finite([(x, y)]) and _finite([(low, high)])
    ]


ENVELOPE = "#333333"  # a dashed series' colour: apart from every measured one


def _shade(index: int, series: Series) -> str:
    return ENVELOPE if series.dashed else color(index)


def legend(series: list[Series]) -> str:
    """The chart's key as an HTML list (it wraps with the page; an SVG key would not)."""
    items = "".join(
        f'<li><span class="swatch" style="background:{_shade(i, s)}"></span>{escape(s.label)}</li>'
        for i, s in enumerate(series)
    )
    return f'<ul class="legend">{items}</ul>'


def empty(title: str, why: str) -> str:
    """A figure that cannot be drawn: one line in its place, never a broken page."""
    return f'<p class="nofigure"><b>{escape(title)}</b>: {escape(why)}</p>'


def line_chart(
    title: str,
    series: list[Series],
    xlabel: str,
    ylabel: str,
    y_range: tuple[float, float] | None = None,
    reference: float | None = None,
    log2_x: bool = False,
    diagonal: bool = False,
    lines: bool = True,
) -> str:
    """Each series as a polyline with its points marked (``lines=False``: points only, a scatter) and
    its error bars where it has intervals; ``reference``: a grey horizontal line at that y (1.0: no
    speedup); ``diagonal``: the line y = x."""
    bars = {s.label: _bars(s) for s in series}
    drawn = [Series(s.label, _finite(s.points), dashed=s.dashed) for s in series]
    points = [p for s in drawn for p in s.points if not log2_x or p[0] > 0]
    if not points:
        return empty(title, "no finite values to draw")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    ys += [end for s in drawn for x, low, high in bars[s.label] for end in (low, high) if not log2_x or x > 0]
    if reference is not None:
        ys.append(reference)
    if diagonal:
        both = xs + ys
        xs, ys = [min(both), max(both)], [min(both), max(both)]
    axes = _Axes(xs, ys, y_range, log2_x)
    out = _open(title) + axes.frame(xlabel, ylabel)
    if reference is not None:
        y = axes.py(reference)
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#666" '
            'stroke-dasharray="4 3"/>'
        )
    if diagonal:
        a, b = axes.y0, axes.y1
        out.append(
            f'<line x1="{axes.px(a):.1f}" y1="{axes.py(a):.1f}" x2="{axes.px(b):.1f}" y2="{axes.py(b):.1f}" '
            'stroke="#666" stroke-dasharray="4 3"/>'
        )
    # an envelope first, under the measured curves it runs along; its points ringed, not filled
    for index, s in sorted(enumerate(drawn), key=lambda pair: not pair[1].dashed):
        fill = _shade(index, s)
        shown = [(x, y) for x, y in s.points if not log2_x or x > 0]
        if lines and len(shown) > 1:
            path = " ".join(f"{axes.px(x):.1f},{axes.py(y):.1f}" for x, y in shown)
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            out.append(f'<polyline points="{path}" fill="none" stroke="{fill}" stroke-width="1.6"{dash}/>')
        for x, low, high in bars[s.label]:
            if not log2_x or x > 0:
                out.append(
                    f'<line x1="{axes.px(x):.1f}" x2="{axes.px(x):.1f}" y1="{axes.py(low):.1f}" '
                    f'y2="{axes.py(high):.1f}" stroke="{fill}" data-interval="{escape(s.label)}"/>'
                )
        out += [_point(axes.px(x), axes.py(y), s.label, x, y, fill, s.dashed) for x, y in shown]
    out.append("</svg>")
    return "\n".join(out) + legend(series)


def bar_chart(title: str, categories: list[str], series: list[Series], xlabel: str, ylabel: str) -> str:
    """Grouped bars: for each category (x index i), one bar per series at y = its value."""
    values = [y for s in series for _, y in _finite(s.points)]
    if not values or not categories:
        return empty(title, "no values to draw")
    axes = _Axes([-0.5, len(categories) - 0.5], [0.0, max(values)], x_ticks=[-0.5, len(categories) - 0.5])
    out = _open(title) + axes.frame(xlabel, ylabel, x_names=categories)
    slot = (axes.px(0.5) - axes.px(-0.5)) * 0.8
    width = slot / max(len(series), 1)
    for i, name in enumerate(categories):
        out.append(
            f'<text x="{axes.px(i):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
            f"{escape(name)}</text>"
        )
    for index, s in enumerate(series):
        for x, y in _finite(s.points):
            left = axes.px(x) - slot / 2 + index * width
            top, base = axes.py(y), axes.py(0.0)
            data = f'data-series="{escape(s.label)}" data-x="{categories[int(x)]}" data-y="{y!r}"'
            tip = f"{escape(s.label)}: {escape(categories[int(x)])}, {_fmt(y)}"
            out.append(
                f'<rect x="{left:.1f}" y="{top:.1f}" width="{max(width - 1, 1):.1f}" '
                f'height="{max(base - top, 0):.1f}" fill="{color(index)}" {data}><title>{tip}</title></rect>'
            )
    out.append("</svg>")
    return "\n".join(out) + legend(series)
