"""A small hand-written SVG line plot with log axes, so benchmarks need no plotting library.

Example::

    svg = line_plot({"one switch": [(10, 0.1), (100, 0.9)]}, title="solve time",
                    xlabel="layers", ylabel="seconds")
    Path("plot.svg").write_text(svg)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

__all__ = ["line_plot"]

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
_DASHES = ("", "6 3")


def _decades(lo: float, hi: float) -> list[float]:
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0**k for k in range(first, last + 1)]


def _label(v: float) -> str:
    return f"{v:g}"


def line_plot(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    logy: bool = True,
    xticks: Sequence[float] | None = None,
    styles: Mapping[str, tuple[int, int]] | None = None,
    width: int = 640,
    height: int = 400,
) -> str:
    """An SVG document: one polyline with markers per series, legend at the right.

    ``styles`` maps a series name to (colour index, dash index), e.g. one colour per device
    count and one dash per topology; by default colours cycle, then dashes.
    """
    points = [(x, y) for pts in series.values() for x, y in pts if x > 0 and y > 0]
    if not points:
        raise ValueError("nothing to plot")
    left, right, top, bottom = 70, 170, 36, 50
    pw, ph = width - left - right, height - top - bottom
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    xt = list(xticks) if xticks else (_decades(min(xs), max(xs)) if logx else [])
    yt = _decades(min(ys), max(ys)) if logy else []
    x0, x1 = min([*xs, *xt]), max([*xs, *xt])
    y0, y1 = (min(yt), max(yt)) if logy else (0.0, max(ys) * 1.1)
    fx = (lambda v: math.log10(v)) if logx else (lambda v: v)
    fy = (lambda v: math.log10(v)) if logy else (lambda v: v)

    def px(v: float) -> float:
        return left + pw * (fx(v) - fx(x0)) / ((fx(x1) - fx(x0)) or 1)

    def py(v: float) -> float:
        return top + ph - ph * (fy(v) - fy(y0)) / ((fy(y1) - fy(y0)) or 1)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left + pw / 2}" y="20" text-anchor="middle" font-size="14">'
        f"{escape(title)}</text>",
    ]
    if not logy:
        step = 10 ** math.floor(math.log10(y1 / 2))
        yt = [step * k for k in range(int(y1 / step) + 1)]
    for v in xt:
        x = px(v)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{_label(v)}</text>')
    for v in yt:
        y = py(v)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(v)}</text>')
    out.append(
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>'
    )
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 12}" text-anchor="middle">{escape(xlabel)}</text>'
    )
    out.append(
        f'<text transform="translate(16 {top + ph / 2}) rotate(-90)" text-anchor="middle">'
        f"{escape(ylabel)}</text>"
    )
    for i, (name, pts) in enumerate(series.items()):
        ci, di = (styles or {}).get(name, (i, i // len(_COLOURS)))
        colour, dash = _COLOURS[ci % len(_COLOURS)], _DASHES[di % len(_DASHES)]
        good = sorted((x, y) for x, y in pts if x > 0 and y > 0)
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in good)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.8"'
            f"{dash_attr}/>"
        )
        for x, y in good:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}"/>')
        ly = top + 8 + 18 * i
        lx = left + pw + 12
        out.append(
            f'<line x1="{lx}" y1="{ly}" x2="{lx + 22}" y2="{ly}" stroke="{colour}" '
            f'stroke-width="2"{dash_attr}/>'
        )
        out.append(f'<text x="{lx + 28}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
