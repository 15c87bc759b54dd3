"""Pictures of a simulated iteration: terminal table and Gantt chart, SVG, HTML, trace JSON.

All renderers read a :class:`~planner.simulate.SimResult`. The SVG and HTML are written
by hand (no plotting library): one row per device, each action a box coloured by its
microbatch; forwards are solid, backwards dark, weight-gradient passes (W) light and
striped, idle time shows as the grey row background, and a memory curve with the device's
limit runs under each row. The trace is Chrome/Perfetto JSON (``chrome://tracing``,
https://ui.perfetto.dev).

Example::

    print_report(result, console, title="1f1b, 8 microbatches")
    Path("gantt.svg").write_text(render_svg(result))
    Path("trace.json").write_text(json.dumps(render_trace(result)))
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.terminal import printable
from planner.units import format_bytes

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from planner.outputs import Outputs
    from planner.plan import StageSpec
    from planner.simulate import SimEvent, SimResult

__all__ = [
    "MIN_GANTT_WIDTH",
    "gantt_text",
    "print_report",
    "render_html",
    "render_pictures",
    "render_svg",
    "render_trace",
]

# Below this the time axis labels overlap the chart and nothing readable is left.
MIN_GANTT_WIDTH = 20

_GOLDEN = 0.618033988749895
_TERM_COLOURS = [
    "red",
    "green",
    "yellow",
    "blue",
    "magenta",
    "cyan",
    "bright_red",
    "bright_green",
    "bright_yellow",
    "bright_blue",
    "bright_magenta",
    "bright_cyan",
]
_SPARK = "▁▂▃▄▅▆▇█"


def _hue(microbatch: int) -> float:
    # Golden-ratio steps keep neighbouring microbatches far apart on the colour wheel.
    return (microbatch * _GOLDEN) % 1.0


def _rgb(h: float, lightness: float, saturation: float) -> str:
    r, g, b = colorsys.hls_to_rgb(h, lightness, saturation)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def _fill(kind: str, microbatch: int) -> str:
    if kind in ("ALLREDUCE", "STEP"):
        return "#555555" if kind == "ALLREDUCE" else "#999999"
    h = _hue(microbatch)
    if kind == "F":
        return _rgb(h, 0.62, 0.75)
    if kind == "W":
        return _rgb(h, 0.82, 0.6)
    return _rgb(h, 0.36, 0.7)  # B and I


def _by_device(result: SimResult) -> dict[str, list[SimEvent]]:
    rows: dict[str, list[SimEvent]] = {d: [] for d in result.device_names}
    for ev in result.events:
        rows.setdefault(ev.device, []).append(ev)
    for evs in rows.values():
        evs.sort(key=lambda e: e.start_ms)
    return rows


def _all_devices(result: SimResult) -> list[str]:
    """Every device of the result, each tensor-parallel group's members after its leader."""
    return [m for d in result.device_names for m in result.groups.get(d, (d,))]


def _recompute_cell(st: StageSpec) -> str:
    """The recompute column: "yes" (one checkpoint for the stage), "each layer", or ""."""
    if not st.recompute:
        return ""
    return "each layer" if st.recompute_layers else "yes"


def _stage_cells(st: StageSpec) -> tuple[str, str]:
    """A stage's devices (replicas by ',', a tensor-parallel group's devices by '+') and its
    parallelism beyond that (``TP2, SP, zero1``; empty for a plain stage)."""
    devices = ", ".join("+".join(g) for g in st.replica_groups)
    extra = [f"TP{st.tensor_parallel}"] if st.tensor_parallel > 1 else []
    if st.sequence_parallel:
        extra.append("SP")
    if st.sharding != "none":
        extra.append(st.sharding)
    return devices, ", ".join(extra)


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 100 else f"{ms:.1f}"


# --------------------------------------------------------------------------- terminal


def print_report(
    result: SimResult,
    console: Console,
    *,
    stages: list[StageSpec] | None = None,
    title: str | None = None,
    gantt: bool = True,
    width: int | None = None,
) -> None:
    """Print the stage table, the per-device table, the summary and a Gantt chart.

    Example::

        print_report(result, planner.terminal.console(), stages=stages, title="my plan")
    """
    from rich.table import Table

    if stages:
        table = Table(title=title or f"Schedule {result.schedule.name}")
        parallel = not all(st.is_plain for st in stages)
        headers = ("stage", "layers", "devices", "recompute")
        for col in headers + (("parallelism",) if parallel else ()):
            table.add_column(col)
        for st in stages:
            a, b = st.layers
            devices, extra = _stage_cells(st)
            row = [str(st.id), f"{a}-{b}" if a != b else str(a), devices]
            row.append(_recompute_cell(st))
            table.add_row(*row, *((extra,) if parallel else ()))
        console.print(table)
    dev = Table(title="Devices")
    for col in ("device", "busy ms", "idle ms", "busy", "peak memory", "limit", "use"):
        dev.add_column(col, justify="left" if col == "device" else "right")
    it = result.iteration_ms
    for d in _all_devices(result):
        busy = result.busy_ms.get(d, 0.0)
        peak = result.memory_bytes.get(d, 0)
        limit = result.memory_limit_bytes.get(d)
        use = f"{100.0 * peak / limit:.0f}%" if limit else "-"
        style = "red" if limit and peak > limit else ""
        dev.add_row(
            d,
            _fmt_ms(busy),
            _fmt_ms(max(0.0, it - busy)),
            f"{100.0 * busy / it:.0f}%" if it > 0 else "-",
            format_bytes(peak),
            format_bytes(limit) if limit else "-",
            use,
            style=style,
        )
    console.print(dev)
    lb = result.lower_bound_ms
    gap = f"{100.0 * (it / lb - 1):.1f}% above" if lb > 0 else "-"
    console.print(
        f"Iteration: {_fmt_ms(it)} ms  ({result.samples_per_s:.1f} samples/s, "
        f"bubble {100.0 * result.bubble_fraction:.1f}%)   lower bound {_fmt_ms(lb)} ms ({gap})"
    )
    if result.staleness is not None:
        console.print(
            f"Weight staleness per stage (optimizer steps): {result.staleness}; "
            "2 weight versions kept"
        )
    if result.iterations > 1:
        console.print(
            f"No flush: timed as a stream of {result.iterations} iterations (one fill and "
            "drain); the iteration is their average and the chart shows the whole stream"
        )
    if not result.fits:
        over = [
            d
            for d in _all_devices(result)
            if d in result.memory_limit_bytes
            and result.memory_bytes[d] > result.memory_limit_bytes[d]
        ]
        console.print(f"Does not fit in memory on: {', '.join(over)}", style="red")
    if gantt and result.events:
        label_w = max(max((len(result.label(d)) for d in result.device_names), default=4), 4) + 1
        cols = width if width is not None else max(30, console.width - label_w - 12)
        console.print(gantt_text(result, width=cols))


def gantt_text(result: SimResult, *, width: int = 100) -> Text:
    """A terminal Gantt chart: one row per device (a tensor-parallel group's one row,
    labelled ``gpu0+gpu1``: its members run the same actions) plus a memory sparkline
    under it.

    Letters are the action (F, B, I, W, A = all-reduce, S = step), colour is the
    microbatch; backwards are drawn reversed (coloured background), W dim, idle ``·``.

    Example::

        planner.terminal.console().print(gantt_text(result, width=80))
    """
    from rich.text import Text

    if width < MIN_GANTT_WIDTH:
        raise ValueError(f"gantt width must be at least {MIN_GANTT_WIDTH} columns, got {width}")
    span = max(result.makespan_ms, result.iteration_ms, 1e-12)
    dt = span / width
    rows = _by_device(result)
    labels = {d: printable(result.label(d)) for d in rows}  # text, never terminal codes
    label_w = max(max((len(d) for d in labels.values()), default=4), 4) + 1
    out = Text()
    out.append(f"{'time':<{label_w}}0 ms", style="bold")
    out.append(f"{_fmt_ms(span) + ' ms':>{width - 4}}\n", style="bold")
    for dev, evs in rows.items():
        out.append(f"{labels[dev]:<{label_w}}", style="bold")
        i = 0
        for c in range(width):
            t = (c + 0.5) * dt
            while i < len(evs) and evs[i].end_ms <= t:
                i += 1
            ev = evs[i] if i < len(evs) and evs[i].start_ms <= t else None
            if ev is None:
                # A short action between two column centres would vanish; show it anyway.
                hit = next((e for e in evs[i : i + 4] if c * dt <= e.start_ms < (c + 1) * dt), None)
                ev = hit
            if ev is None:
                out.append("·", style="bright_black")
                continue
            colour = (
                _TERM_COLOURS[ev.microbatch % len(_TERM_COLOURS)] if ev.microbatch >= 0 else "white"
            )
            letter = {"ALLREDUCE": "A", "STEP": "S"}.get(ev.kind, ev.kind)
            if ev.kind == "F":
                out.append(letter, style=f"bold {colour}")
            elif ev.kind == "W":
                out.append(letter.lower(), style=f"dim {colour}")
            else:
                out.append(letter, style=f"bold black on {colour}")
        out.append("\n")
        curve = result.memory_timeline.get(dev)
        if curve:
            out.append(f"{'':<{label_w}}", style="")
            out.append(_sparkline(curve, width, dt, result.memory_limit_bytes.get(dev)))
            out.append(f" {format_bytes(result.memory_bytes.get(dev, 0))}\n", style="dim")
    out.append(
        "F forward  B/I backward (input grad)  w weight grad  A all-reduce  S step  · idle; "
        "colour = microbatch; ▁..█ memory (peak at right)",
        style="dim",
    )
    return out


def _sparkline(curve: list[tuple[float, int]], width: int, dt: float, limit: int | None) -> str:
    top = max(b for _, b in curve) or 1
    low = min(b for _, b in curve)
    levels = []
    j = 0
    level = curve[0][1]
    for c in range(width):
        t_end = (c + 1) * dt
        peak = level
        while j < len(curve) and curve[j][0] < t_end:
            level = curve[j][1]
            peak = max(peak, level)
            j += 1
        levels.append(peak)
    span = max(top - low, 1)
    return "".join(_SPARK[min(7, int((v - low) / span * 7.999))] for v in levels)


# --------------------------------------------------------------------------- SVG / HTML


def render_svg(result: SimResult, *, title: str | None = None, width: int = 1200) -> str:
    """A self-contained SVG Gantt chart with a memory curve per device.

    Example::

        Path("gantt.svg").write_text(render_svg(result, title="1f1b"))
    """
    rows = _by_device(result)
    span = max(result.makespan_ms, result.iteration_ms, 1e-12)
    left, right, top = 110, 20, 64
    row_h, mem_h, gap = 26, 30, 12
    plot_w = width - left - right
    height = top + len(rows) * (row_h + mem_h + gap) + 56
    x = lambda t: left + t / span * plot_w  # noqa: E731 - a tiny local scale
    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif">',
        "<defs>"
        '<pattern id="wstripe" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="white" '
        'fill-opacity="0"/><line x1="0" y1="0" x2="0" y2="6" stroke="#ffffff" '
        'stroke-width="2" stroke-opacity="0.7"/></pattern>'
        '<pattern id="idle" width="8" height="8" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="8" height="8" fill="#eeeeee"/>'
        '<line x1="0" y1="0" x2="0" y2="8" stroke="#dddddd" stroke-width="3"/></pattern>'
        "</defs>",
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    heading = title or f"{result.schedule.name}: {result.num_microbatches} microbatches"
    if result.iterations > 1:
        heading += f" (stream of {result.iterations} iterations, no flush)"
    summary = (
        f"iteration {_fmt_ms(result.iteration_ms)} ms, bubble "
        f"{100 * result.bubble_fraction:.1f}%, lower bound {_fmt_ms(result.lower_bound_ms)} ms"
    )
    parts.append(
        f'<text x="{left}" y="24" font-size="16" font-weight="bold">{escape(heading)}</text>'
        f'<text x="{left}" y="44" font-size="12" fill="#444">{escape(summary)}</text>'
    )
    chunks = max(1, result.schedule.virtual_stages)
    ranks = max(1, result.schedule.num_stages // chunks)
    y = top
    for dev, evs in rows.items():
        parts.append(
            f'<text x="{left - 8}" y="{y + row_h * 0.68:.1f}" font-size="12" '
            f'text-anchor="end" font-weight="bold">{escape(result.label(dev))}</text>'
            f'<rect x="{left}" y="{y}" width="{plot_w}" height="{row_h}" fill="url(#idle)">'
            "<title>idle</title></rect>"
        )
        for ev in evs:
            x0, x1 = x(ev.start_ms), x(ev.end_ms)
            w = max(x1 - x0, 0.6)
            fill = _fill(ev.kind, ev.microbatch)
            label = (
                f"{ev.kind}{ev.stage}"
                if ev.microbatch < 0
                else f"{ev.kind}{ev.stage}.{ev.microbatch}"
            )
            tip = f"{label} on {result.label(dev)}: {ev.start_ms:.3f} - {ev.end_ms:.3f} ms"
            parts.append(
                f'<rect x="{x0:.2f}" y="{y}" width="{w:.2f}" height="{row_h}" fill="{fill}" '
                f'stroke="white" stroke-width="0.5"><title>{escape(tip)}</title></rect>'
            )
            if ev.kind == "W":
                parts.append(
                    f'<rect x="{x0:.2f}" y="{y}" width="{w:.2f}" height="{row_h}" '
                    'fill="url(#wstripe)" pointer-events="none"/>'
                )
            text = f"{ev.kind}{ev.microbatch}" if ev.microbatch >= 0 else ev.kind[0]
            if chunks > 1 and ev.microbatch >= 0:
                # Interleaved: a letter tells the device's chunks apart (a = first).
                text += "abcdefghijklmnopqrstuvwxyz"[min(25, ev.stage // ranks)]
            if w >= 7.5 * len(text):
                colour = "white" if ev.kind in ("B", "I", "ALLREDUCE") else "#111"
                parts.append(
                    f'<text x="{x0 + w / 2:.2f}" y="{y + row_h * 0.66:.1f}" font-size="11" '
                    f'text-anchor="middle" fill="{colour}" pointer-events="none">{text}</text>'
                )
        parts.append(_svg_memory(result, dev, y + row_h + 2, mem_h - 4, left, plot_w, span))
        y += row_h + mem_h + gap
    # Time axis with about ten round ticks.
    step = _nice_step(span / 10)
    parts.append(f'<line x1="{left}" y1="{y}" x2="{left + plot_w}" y2="{y}" stroke="#333"/>')
    t = 0.0
    while t <= span + 1e-9:
        parts.append(
            f'<line x1="{x(t):.1f}" y1="{y}" x2="{x(t):.1f}" y2="{y + 5}" stroke="#333"/>'
            f'<text x="{x(t):.1f}" y="{y + 18}" font-size="11" text-anchor="middle">'
            f"{t:g}</text>"
        )
        t += step
    parts.append(
        f'<text x="{left + plot_w}" y="{y + 34}" font-size="11" text-anchor="end">time (ms)</text>'
    )
    parts.append(_svg_legend(left, y + 34))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _svg_memory(
    result: SimResult, dev: str, y: float, h: float, left: float, plot_w: float, span: float
) -> str:
    curve = result.memory_timeline.get(dev)
    if not curve:
        return ""
    limit = result.memory_limit_bytes.get(dev)
    peak = result.memory_bytes.get(dev, max(b for _, b in curve))
    scale_top = max(peak, 1)
    # Show the limit only when it is near enough to be readable; say it in the label.
    show_limit = limit is not None and limit <= 1.25 * peak
    if show_limit and limit is not None:
        scale_top = max(scale_top, limit)
    low = min(b for _, b in curve)
    # Without a nearby limit the curve spans static memory .. peak, so that the
    # activations' rise and fall stays visible; the labels give the absolute numbers.
    base = 0 if show_limit else low
    rng = max(scale_top - base, 1)

    def yy(b: float) -> float:
        return y + h - (b - base) / rng * h

    pts = [f"{left:.1f},{y + h:.1f}"]
    prev = curve[0][1]
    for t, b in curve:
        px = left + min(t, span) / span * plot_w
        pts.append(f"{px:.1f},{yy(prev):.1f}")
        pts.append(f"{px:.1f},{yy(b):.1f}")
        prev = b
    pts.append(f"{left + plot_w:.1f},{yy(prev):.1f}")
    pts.append(f"{left + plot_w:.1f},{y + h:.1f}")
    label = f"peak {format_bytes(peak)}" + (f" / {format_bytes(limit)}" if limit else "")
    lines = [f"peak {format_bytes(peak)}"]
    lines.append(
        f"of {format_bytes(limit)}" if show_limit and limit else f"min {format_bytes(low)}"
    )
    out = [
        f'<rect x="{left}" y="{y}" width="{plot_w}" height="{h}" fill="#fafafa"/>',
        f'<polygon points="{" ".join(pts)}" fill="#9ecae1" stroke="#3182bd" '
        f'stroke-width="1"><title>memory of {escape(dev)}: {label}</title></polygon>',
    ]
    for i, line in enumerate(lines):
        out.append(
            f'<text x="{left - 8}" y="{y + 9 + 10 * i:.1f}" font-size="9" text-anchor="end" '
            f'fill="#3182bd">{escape(line)}</text>'
        )
    if show_limit and limit is not None:
        ly = yy(limit)
        out.append(
            f'<line x1="{left}" y1="{ly:.1f}" x2="{left + plot_w}" y2="{ly:.1f}" '
            'stroke="#d62728" stroke-dasharray="4 3"><title>memory limit</title></line>'
        )
    return "".join(out)


def _svg_legend(x0: float, y: float) -> str:
    items = [
        ("F forward", _fill("F", 0), False),
        ("B / I backward (input grad)", _fill("B", 0), False),
        ("W weight grad", _fill("W", 0), True),
        ("idle", "url(#idle)", False),
        ("memory", "#9ecae1", False),
    ]
    out = []
    x = x0
    for label, fill, striped in items:
        out.append(
            f'<rect x="{x}" y="{y - 10}" width="14" height="12" fill="{fill}" stroke="#999" '
            'stroke-width="0.5"/>'
        )
        if striped:
            out.append(f'<rect x="{x}" y="{y - 10}" width="14" height="12" fill="url(#wstripe)"/>')
        out.append(f'<text x="{x + 18}" y="{y}" font-size="11">{escape(label)}</text>')
        x += 30 + 6.2 * len(label)
    out.append(f'<text x="{x + 10}" y="{y}" font-size="11" fill="#555">colour = microbatch</text>')
    return "".join(out)


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 5, 10):
        if raw <= mult * mag:
            return float(mult * mag)
    return float(10 * mag)


def render_html(
    result: SimResult, *, title: str | None = None, stages: Sequence[StageSpec] | None = None
) -> str:
    """A standalone HTML page: summary, stage and device tables, and the SVG chart.

    Example::

        Path("plan.html").write_text(render_html(result, stages=stages))
    """
    heading = title or f"pipeplan: {result.schedule.name}"
    rows = []
    for d in _all_devices(result):
        busy = result.busy_ms.get(d, 0.0)
        limit = result.memory_limit_bytes.get(d)
        rows.append(
            f"<tr><td>{escape(d)}</td><td>{busy:.3f}</td>"
            f"<td>{max(0.0, result.iteration_ms - busy):.3f}</td>"
            f"<td>{escape(format_bytes(result.memory_bytes.get(d, 0)))}</td>"
            f"<td>{escape(format_bytes(limit)) if limit else '-'}</td></tr>"
        )
    parallel = not all(s.is_plain for s in stages or [])
    stage_rows = "".join(
        f"<tr><td>{s.id}</td><td>{s.layers[0]}-{s.layers[1]}</td>"
        f"<td>{escape(_stage_cells(s)[0])}</td><td>{_recompute_cell(s)}</td>"
        + (f"<td>{escape(_stage_cells(s)[1])}</td>" if parallel else "")
        + "</tr>"
        for s in stages or []
    )
    stage_table = (
        "<h2>Stages</h2><table><tr><th>stage</th><th>layers</th><th>devices</th>"
        f"<th>recompute</th>{'<th>parallelism</th>' if parallel else ''}</tr>{stage_rows}</table>"
        if stages
        else ""
    )
    stale = (
        f"<p>Weight staleness per stage: {result.staleness} (two weight versions)</p>"
        if result.staleness is not None
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(heading)}</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 16px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 10px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
.summary {{ font-size: 15px; }}
</style></head><body>
<h1>{escape(heading)}</h1>
<p class="summary">Iteration <b>{result.iteration_ms:.3f} ms</b>
({result.samples_per_s:.1f} samples/s), bubble {100 * result.bubble_fraction:.1f}%,
lower bound {result.lower_bound_ms:.3f} ms; {result.num_microbatches} microbatches of
{result.microbatch_size}.</p>
{stale}
{stage_table}
<h2>Devices</h2>
<table><tr><th>device</th><th>busy ms</th><th>idle ms</th><th>peak memory</th><th>limit</th></tr>
{"".join(rows)}</table>
<h2>Schedule</h2>
<p>Hover over a box for its times.</p>
{render_svg(result, title=heading)}
</body></html>
"""


# --------------------------------------------------------------------------- trace


def render_trace(result: SimResult) -> dict[str, Any]:
    """Chrome/Perfetto trace JSON: a thread per device (every member of a tensor-parallel
    group, each with its leader's events), one per link direction (between groups: named
    by the groups), and a memory counter per device. Times are microseconds.

    Example::

        Path("trace.json").write_text(json.dumps(render_trace(result)))
    """
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "devices"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "transfers"}},
    ]
    tids = {d: i for i, d in enumerate(_all_devices(result))}
    for d, tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": d}})
    for ev in result.events:
        name = f"{ev.kind}{ev.stage}" + (f".{ev.microbatch}" if ev.microbatch >= 0 else "")
        for member in result.groups.get(ev.device, (ev.device,)):
            events.append(
                {
                    "name": name,
                    "cat": ev.kind,
                    "ph": "X",
                    "pid": 1,
                    "tid": tids[member],
                    "ts": round(ev.start_ms * 1e3, 3),
                    "dur": round((ev.end_ms - ev.start_ms) * 1e3, 3),
                    "args": {"stage": ev.stage, "microbatch": ev.microbatch},
                }
            )
    links: dict[tuple[str, str], int] = {}
    for tr in result.transfers:
        pair = (tr.src, tr.dst)
        if pair not in links:
            links[pair] = len(links)
            events.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": 2,
                    "tid": links[pair],
                    "args": {"name": f"{result.label(tr.src)} -> {result.label(tr.dst)}"},
                }
            )
        events.append(
            {
                "name": f"{'act' if tr.kind == 'F' else 'grad'} {tr.stage}.{tr.microbatch}",
                "cat": "transfer",
                "ph": "X",
                "pid": 2,
                "tid": links[pair],
                "ts": round(tr.start_ms * 1e3, 3),
                "dur": round((tr.end_ms - tr.start_ms) * 1e3, 3),
                "args": {"bytes": tr.nbytes},
            }
        )
    for d, curve in result.memory_timeline.items():
        for t, b in curve:
            events.append(
                {
                    "name": f"memory {d}",
                    "ph": "C",
                    "pid": 1,
                    "ts": round(t * 1e3, 3),
                    "args": {"bytes": b},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "metadata": {
            "schedule": result.schedule.name,
            "iteration_ms": result.iteration_ms,
            "bubble_fraction": result.bubble_fraction,
        },
    }


def render_pictures(
    outs: Outputs,
    result: Any,
    stages: Sequence[StageSpec],
    *,
    svg: Path | None,
    html: Path | None,
    trace: Path | None,
    title: str,
) -> None:
    """Render the requested SVG/HTML/trace files and hand them to ``outs`` (where they
    were declared), which writes them with the command's other outputs, all or none.

    Example::

        render_pictures(outs, result, stages, svg=Path("g.svg"), html=None, trace=None, title="")
        outs.commit()
    """
    if svg is not None:
        outs.write_text(svg, render_svg(result, title=title))
    if html is not None:
        outs.write_text(html, render_html(result, title=title, stages=stages))
    if trace is not None:
        outs.write_json(trace, render_trace(result))
