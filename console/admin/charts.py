"""Training charts as server-side SVG: no JavaScript, nothing from a CDN, nothing to install.

``line_chart`` draws (x, y) series on linear axes with "nice" ticks (1, 2, 2.5, 5 x 10^k) and
tick labels; ``downsample`` bounds what is drawn (the first and last point and each bucket's
lowest and highest, so a spike survives), so a 100k-step job's page stays small and fast.
Every point carries a ``<title>``: hovering shows its step and value. Every piece of text is
escaped; values that are not finite numbers are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from html import escape

Point = tuple[float, float]
MAX_POINTS = 400  # per series, after downsampling
VISIBLE_MARKERS = 60  # at most this many points: each is drawn as a dot, else only on hover


def downsample(points: Sequence[Point], max_points: int = MAX_POINTS) -> list[Point]:
    """At most ``max_points`` of ``points`` (in x order), in x order: the first and last, and
    per bucket of consecutive points the lowest and the highest (min/max decimation)."""
    if max_points < 4:
        raise ValueError("max_points must be at least 4")
    n = len(points)
    if n <= max_points:
        return list(points)
    buckets = (max_points - 2) // 2
    inner = points[1:-1]
    size = len(inner) / buckets
    out = [points[0]]
    for b in range(buckets):
        chunk = inner[int(b * size) : int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(range(len(chunk)), key=lambda i: chunk[i][1])
        hi = max(range(len(chunk)), key=lambda i: chunk[i][1])
        out.extend(chunk[i] for i in sorted({lo, hi}))
    out.append(points[-1])
    return out


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]: about ``count`` of them, 1/2/2.5/5 x 10^k apart."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError("ticks need finite bounds")
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def _tick_step(ticks: Sequence[float]) -> float:
    return ticks[1] - ticks[0] if len(ticks) > 1 else 1.0


def value_label(value: float, step: float) -> str:
    """A tick label as precise as the tick spacing needs."""
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e6:
        return f"{value:.1e}".replace("e-0", "e-").replace("e+0", "e")
    decimals = max(0, -math.floor(math.log10(step)) + (1 if f"{step:g}".endswith("25") else 0))
    return f"{value:.{min(decimals, 6)}f}"


def step_label(value: float, step: float = 1.0) -> str:
    """A step tick: 1200 → 1.2k, 100000 → 100k."""
    if abs(value) >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _x_text(x: float) -> str:
    return str(int(x)) if x.is_integer() else f"{x:g}"


def point_value(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1e-3 else f"{value:.4f}"


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[Point]  # (x, y), x ascending
    color: str
    markers: bool = False  # always draw its dots (a sparse series: validation loss)
    dashed: bool = False


@dataclass(frozen=True)
class Layout:
    width: int = 760
    height: int = 240
    left: int = 64
    right: int = 16
    top: int = 28
    bottom: int = 34

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom


def _clean(points: Sequence[Point]) -> list[Point]:
    out = []
    for x, y in points:
        if isinstance(x, bool) or isinstance(y, bool):
            continue
        try:
            fx, fy = float(x), float(y)
        except (TypeError, ValueError):
            continue
        if math.isfinite(fx) and math.isfinite(fy):
            out.append((fx, fy))
    return out


def _fmt(v: float) -> str:
    return f"{v:.1f}"


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    y_label: str = "",
    x_label: str = "step",
    x_max: float | None = None,
    y_from_zero: bool = False,
    y_format: Callable[[float, float], str] = value_label,
    empty: str = "No training metrics yet.",
    layout: Layout | None = None,
    max_points: int = MAX_POINTS,
    css_class: str = "th-chart",
) -> str:
    """An SVG line chart of ``series`` (x: steps, up to at least ``x_max``); the ``empty``
    message in the frame when no series has a point. Returns markup safe to embed as is."""
    lay = layout or Layout()
    drawn = [(s, downsample(_clean(s.points), max_points)) for s in series]
    drawn = [(s, pts) for s, pts in drawn if pts]
    head = _svg_head(title, lay, css_class)
    if not drawn:  # a short frame saying so
        lay = replace(lay, height=min(lay.height, 110), top=min(lay.top, 24), bottom=12)
        head = _svg_head(title, lay, css_class)
        return (
            head + f'<rect class="frame" x="{lay.left}" y="{lay.top}" width="{_fmt(lay.plot_w)}" '
            f'height="{_fmt(lay.plot_h)}" fill="none"/>'
            + f'<text class="empty" x="{lay.width / 2:.1f}" y="{lay.top + lay.plot_h / 2:.1f}" '
            f'text-anchor="middle">{escape(empty)}</text>' + _heading(title, lay) + "</svg>"
        )
    xs = [p[0] for _, pts in drawn for p in pts]
    ys = [p[1] for _, pts in drawn for p in pts]
    x_lo = min(0.0, min(xs))
    x_hi = max(max(xs), x_max or 0.0, x_lo + 1)
    y_lo, y_hi = min(ys), max(ys)
    if y_from_zero:
        y_lo = min(0.0, y_lo)
    x_ticks = nice_ticks(x_lo, x_hi, 6)
    y_ticks = nice_ticks(y_lo, y_hi, 4)
    x_lo, x_hi = min(x_ticks[0], x_lo), max(x_ticks[-1], x_hi)
    y_lo, y_hi = y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return lay.left + (x - x_lo) / (x_hi - x_lo) * lay.plot_w

    def sy(y: float) -> float:
        return lay.top + lay.plot_h - (y - y_lo) / (y_hi - y_lo) * lay.plot_h

    parts = [head]
    # grid and tick labels
    y_step, x_step = _tick_step(y_ticks), _tick_step(x_ticks)
    for t in y_ticks:
        y = sy(t)
        parts.append(
            f'<line class="grid" x1="{lay.left}" x2="{lay.left + lay.plot_w:.1f}" '
            f'y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{lay.left - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(y_format(t, y_step))}</text>"
        )
    for t in x_ticks:
        if not x_lo <= t <= x_hi:
            continue
        x = sx(t)
        parts.append(
            f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{lay.top}" '
            f'y2="{lay.top + lay.plot_h:.1f}"/>'
            f'<text class="tick" x="{x:.1f}" y="{lay.top + lay.plot_h + 16:.1f}" '
            f'text-anchor="middle">{escape(step_label(t, x_step))}</text>'
        )
    parts.append(
        f'<rect class="frame" x="{lay.left}" y="{lay.top}" width="{_fmt(lay.plot_w)}" '
        f'height="{_fmt(lay.plot_h)}" fill="none"/>'
    )
    parts.append(
        f'<text class="axis" x="{lay.left + lay.plot_w:.1f}" y="{lay.height - 4}" '
        f'text-anchor="end">{escape(x_label)}</text>'
    )
    if y_label:
        parts.append(
            f'<text class="axis" x="12" y="{lay.top + lay.plot_h / 2:.1f}" text-anchor="middle" '
            f'transform="rotate(-90 12 {lay.top + lay.plot_h / 2:.1f})">{escape(y_label)}</text>'
        )
    # series: the line, then a hover target (visible dot where the series is sparse) per point
    for s, pts in drawn:
        name = escape(s.name)
        color = escape(s.color)
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        parts.append(
            f'<g class="series" data-series="{name}" data-points="{len(pts)}" '
            f'style="color:{color}">'
            f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.6"'
            f"{dash}/>"
        )
        visible = s.markers or len(pts) <= VISIBLE_MARKERS
        dot = "pt shown" if visible else "pt"
        for x, y in pts:
            parts.append(
                f'<circle class="{dot}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" '
                f'fill="{color}"><title>step {_x_text(x)}: {name} {escape(point_value(y))}'
                "</title></circle>"
            )
        parts.append("</g>")
    parts.append(_heading(title, lay))
    parts.append(_legend(drawn, lay))
    parts.append("</svg>")
    return "".join(parts)


def _svg_head(title: str, lay: Layout, css_class: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{escape(css_class)}" '
        f'viewBox="0 0 {lay.width} {lay.height}" width="{lay.width}" height="{lay.height}" '
        f'role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>"
    )


def _heading(title: str, lay: Layout) -> str:
    return f'<text class="heading" x="{lay.left}" y="16">{escape(title)}</text>'


def _legend(drawn: Sequence[tuple[Series, list[Point]]], lay: Layout) -> str:
    out, x = [], lay.left + lay.plot_w
    for s, _ in reversed(drawn):
        label = escape(s.name)
        width = 28 + 6.5 * len(s.name)
        x -= width
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        out.append(
            f'<g class="legend"><line x1="{x:.1f}" x2="{x + 18:.1f}" y1="12" y2="12" '
            f'stroke="{escape(s.color)}" stroke-width="2"{dash}/>'
            f'<text x="{x + 22:.1f}" y="16">{label}</text></g>'
        )
    return "".join(out)


TRAIN_COLOR, EVAL_COLOR, LR_COLOR = "#0969da", "#cf222e", "#8250df"


def _small_chart(
    series: Series, title: str, y_label: str, css: str, total_steps: int | None, max_points: int
) -> str:
    """One series under the loss chart, on the same step axis and from zero."""
    return line_chart(
        [series],
        title=title,
        y_label=y_label,
        x_max=total_steps,
        y_from_zero=True,
        max_points=max_points,
        layout=Layout(height=150, top=24),
        css_class=f"th-chart {css}",
    )


def training_charts(
    *,
    loss: Sequence[Point],
    eval_loss: Sequence[Point],
    lr: Sequence[Point],
    total_steps: int | None,
    eval_score: Sequence[Point] = (),
    max_points: int = MAX_POINTS,
) -> str:
    """The job page's charts: train and validation loss over steps, and below it, on their own
    smaller charts with the same step axis, the grader's eval score (graded checkpoints) and
    the learning rate."""
    losses = line_chart(
        [
            Series("train loss", loss, TRAIN_COLOR),
            Series("validation loss", eval_loss, EVAL_COLOR, markers=True, dashed=True),
        ],
        title="Loss",
        y_label="loss",
        x_max=total_steps,
        max_points=max_points,
        css_class="th-chart th-loss",
    )
    if _clean(eval_score):
        losses += _small_chart(
            Series("eval score", eval_score, EVAL_COLOR, markers=True),
            "Eval score (the job's grader, 0 to 1)", "score", "th-eval-score", total_steps,
            max_points,
        )  # fmt: skip
    if not _clean(lr):
        return losses
    rates = _small_chart(
        Series("learning rate", lr, LR_COLOR), "Learning rate", "lr", "th-lr", total_steps,
        max_points,
    )  # fmt: skip
    return losses + rates
