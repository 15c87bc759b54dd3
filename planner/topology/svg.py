"""A picture of a topology as a self-contained SVG (no plotting library needed).

Devices sit on an outer circle in device order, coloured by host; switches sit on an inner
circle (networkx ``shell_layout``, which is deterministic). Line width grows with the log of
the link bandwidth and every link is labelled with it.

Example::

    Path("dgx1.svg").write_text(topology_svg(load_topology("topologies/dgx1-v100.yaml")))
"""

from __future__ import annotations

import math
from html import escape

import networkx as nx

from planner.topology import Topology
from planner.units import format_bandwidth, format_bytes

__all__ = ["topology_svg"]

_HOST_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1"]
_KIND_COLOURS = {
    "nvlink": "#76b900",
    "pcie": "#4e79a7",
    "infiniband": "#e15759",
    "ethernet": "#b07aa1",
}


def topology_svg(topo: Topology, *, size: int = 720) -> str:
    """Render ``topo`` as an SVG document string.

    Example::

        svg = topology_svg(uniform_topology(4))
    """
    devices = topo.device_names()
    switches = topo.switches
    shells = [switches, devices] if switches else [devices]
    if len(switches) == 1:
        shells = [switches, devices]
    pos = nx.shell_layout(topo.graph, nlist=shells, scale=1.0)
    if len(switches) == 1:
        pos[switches[0]] = (0.0, 0.0)
    margin, top = 80, 50
    half = (size - 2 * margin) / 2

    def xy(node: str) -> tuple[float, float]:
        x, y = pos[node]
        return margin + half + float(x) * half, top + margin + half - float(y) * half

    num_links = topo.graph.number_of_edges()  # counts every edge: once, not per link
    widths = [data["bandwidth"] for _, _, data in topo.links()]
    lo, hi = min(widths, default=1.0), max(widths, default=1.0)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size + top}" '
        f'viewBox="0 0 {size} {size + top}" font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{size / 2}" y="28" text-anchor="middle" font-size="16">'
        f"{escape(topo.name)}: {len(devices)} devices, {len(switches)} switches, "
        f"{num_links} links</text>",
    ]
    for u, v, data in topo.links():
        (x1, y1), (x2, y2) = xy(u), xy(v)
        bw = data["bandwidth"]
        ratio = 0.0 if hi == lo else math.log(bw / lo) / math.log(hi / lo)
        colour = _KIND_COLOURS.get(str(data.get("kind", "")).lower(), "#888888")
        title = f"{u} - {v}: {format_bandwidth(bw)}, {data.get('count', 1)} link(s)"
        out.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
            f'stroke-width="{1 + 5 * ratio:.1f}" stroke-opacity="0.7">'
            f"<title>{escape(title)}</title></line>"
        )
        if num_links <= 40:
            # A third of the way along, not the middle: links that cross the centre would
            # otherwise stack their labels on one spot.
            lx, ly = x1 + (x2 - x1) / 3, y1 + (y2 - y1) / 3
            out.append(
                f'<text x="{lx:.1f}" y="{ly - 3:.1f}" text-anchor="middle" '
                f'fill="#444" font-size="9">{escape(format_bandwidth(bw))}</text>'
            )
    hosts = list(topo.hosts())
    host_index = {host: k for k, host in enumerate(hosts)}  # not hosts.index: devices x hosts
    for name in switches:
        x, y = xy(name)
        kind = topo.graph.nodes[name].get("kind", "")
        out.append(
            f'<rect x="{x - 34:.1f}" y="{y - 11:.1f}" width="68" height="22" rx="5" '
            f'fill="#eeeeee" stroke="#555"><title>{escape(f"{name} ({kind})")}</title></rect>'
            f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle">{escape(name)}</text>'
        )
    for name in devices:
        x, y = xy(name)
        d = topo.device(name)
        colour = _HOST_COLOURS[host_index[d.host] % len(_HOST_COLOURS)]
        title = f"{name}: {d.kind} {format_bytes(d.memory_bytes)}, speed {d.speed:g}, {d.host}"
        out.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="18" fill="{colour}" stroke="#222">'
            f"<title>{escape(title)}</title></circle>"
            f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" fill="white">'
            f"{escape(name)}</text>"
        )
    legend_y = size + top - 12
    for k, host in enumerate(hosts[:6]):
        colour = _HOST_COLOURS[k % len(_HOST_COLOURS)]
        out.append(
            f'<circle cx="{20 + 110 * k}" cy="{legend_y - 4}" r="6" fill="{colour}"/>'
            f'<text x="{30 + 110 * k}" y="{legend_y}">{escape(host)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
