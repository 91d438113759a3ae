"""A picture of a graph as inline SVG: a layered layout of its nodes, coloured by what runs
them, with each fused kernel's nodes outlined.

The layout is the classic layered one (Sugiyama's, simplified): each node goes to the layer one
below its deepest operand; an edge that spans several layers gets a bend point in each layer it
crosses (so it is routed between nodes, never through one); the order within each layer is
improved by a few barycenter sweeps, down and up; then each node is pulled toward the mean
position of its neighbours, keeping a minimum gap. Nothing here needs a system binary.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((4,), torch.float32))
    >>> b.output(b.call("relu", b.call("exp", x)))
    >>> svg = graph_svg(b.build(), {0: ("native", "kernel k0"), 1: ("native", "kernel k0")},
    ...                 {0: "k0", 1: "k0"}, anchor=lambda kind, name: f"#{kind}-{name}")
    >>> svg.startswith("<svg") and 'href="#kernel-k0"' in svg and svg.count("<rect") >= 3
    True
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from plait.ir import Graph, Value

# NOTE: what runs a node (its evidence's executor) -> fill colour; "input" and "output" are
# the graph's own ends
COLOURS = {
    "native": "#b7e4c7",
    "view": "#e3f5e9",
    "extern": "#bcd4f6",
    "fallback": "#f4a7a7",
    "dead": "#dddddd",
    "interpreted": "#f6e0a4",
    "input": "#ffffff",
    "output": "#ffffff",
    "unknown": "#eeeeee",
}
LEGEND = {
    "native": "native kernel",
    "view": "native view (no code)",
    "extern": "extern call (PyTorch kernel)",
    "fallback": "fallback (PyTorch)",
    "interpreted": "reference interpreter",
    "dead": "dead",
}
NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 150, 26, 24, 30, 16
SWEEPS = 4

Anchor = Callable[[str, str], str]


@dataclass
class _Item:
    key: str  # "n<id>", "in<i>", "out", or "d<k>" for a bend point
    layer: int = 0
    x: float = 0.0
    dummy: bool = False


def _style(executor: str, detail: str) -> str:
    if executor == "native" and ("no code" in detail or "inlined" in detail):
        return "view"
    return executor if executor in COLOURS else "unknown"


def _edges(graph: Graph) -> tuple[list[str], list[tuple[str, str]], dict[str, str]]:
    """Items (inputs that feed a node, nodes, the output) and edges between them, by key."""
    producer: dict[int, str] = {}
    labels: dict[str, str] = {}
    keys: list[str] = []
    for i, v in enumerate(graph.inputs):
        if v.kind == "user":
            producer[id(v)] = f"in{i}"
            labels[f"in{i}"] = f"%{v.name}"
    edges: list[tuple[str, str]] = []
    used: set[str] = set()
    for n in graph.nodes:
        key = f"n{n.id}"
        labels[key] = f"#{n.id} {n.op}"
        for v in n.input_values():
            src = producer.get(id(v))
            if src is not None and (src, key) not in edges:
                edges.append((src, key))
                used.add(src)
        for out in n.outputs:
            producer[id(out)] = key
        keys.append(key)
    labels["out"] = "return"
    for o in graph.outputs:
        src = producer.get(id(o)) if isinstance(o, Value) else None
        if src is not None and (src, "out") not in edges:
            edges.append((src, "out"))
            used.add(src)
    inputs = [k for k in labels if k.startswith("in") and k in used]
    return [*inputs, *keys, "out"], edges, labels


def _layers(keys: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    preds: dict[str, list[str]] = {k: [] for k in keys}
    for a, b in edges:
        preds[b].append(a)
    layer: dict[str, int] = {}
    for k in keys:  # NOTE: keys are in topological order (SSA)
        layer[k] = 1 + max((layer[p] for p in preds[k]), default=-1)
    return layer


def _with_bends(
    keys: list[str], edges: list[tuple[str, str]], layer: dict[str, int]
) -> tuple[dict[str, _Item], list[list[str]]]:
    """Items by key and each edge as its chain of keys through one bend point per layer."""
    items = {k: _Item(k, layer[k]) for k in keys}
    chains = []
    for a, b in edges:
        chain = [a]
        for level in range(layer[a] + 1, layer[b]):
            d = f"d{len(items)}"
            items[d] = _Item(d, level, dummy=True)
            chain.append(d)
        chains.append([*chain, b])
    return items, chains


def _order(items: dict[str, _Item], chains: list[list[str]]) -> list[list[str]]:
    depth = max((it.layer for it in items.values()), default=0) + 1
    rows: list[list[str]] = [[] for _ in range(depth)]
    for k, it in items.items():
        rows[it.layer].append(k)
    up: dict[str, list[str]] = {k: [] for k in items}
    down: dict[str, list[str]] = {k: [] for k in items}
    for chain in chains:
        for a, b in itertools.pairwise(chain):
            down[a].append(b)
            up[b].append(a)
    for sweep in range(SWEEPS):
        order = range(1, depth) if sweep % 2 == 0 else range(depth - 2, -1, -1)
        near = up if sweep % 2 == 0 else down
        for level in order:
            pos = {k: i for r in rows for i, k in enumerate(r)}
            centres = {k: _barycentre(k, pos, near) for k in rows[level]}
            rows[level] = sorted(rows[level], key=centres.__getitem__)
    _place(items, rows, up, down)
    return rows


def _barycentre(key: str, pos: Mapping[str, int], near: Mapping[str, list[str]]) -> float:
    """The mean position of ``key``'s neighbours (its own position when it has none)."""
    ns = near[key]
    return sum(pos[n] for n in ns) / len(ns) if ns else float(pos[key])


def _place(
    items: dict[str, _Item],
    rows: list[list[str]],
    up: Mapping[str, list[str]],
    down: Mapping[str, list[str]],
) -> None:
    def width(k: str) -> float:
        return 8.0 if items[k].dummy else float(NODE_W)

    for row in rows:
        x = 0.0
        for k in row:
            items[k].x = x + width(k) / 2
            x += width(k) + GAP_X
    for sweep in range(SWEEPS):
        near = up if sweep % 2 == 0 else down
        order = rows if sweep % 2 == 0 else rows[::-1]
        for row in order:
            wanted = []
            for k in row:
                ns = near[k]
                wanted.append(sum(items[n].x for n in ns) / len(ns) if ns else items[k].x)
            # NOTE: left to right, each item at its wish or just right of its left neighbour
            last = -1e18
            for k, want in zip(row, wanted):
                lo = last + (width(k) + GAP_X) / 2
                items[k].x = max(want, lo)
                last = items[k].x + width(k) / 2
    low = min((it.x - width(k) / 2 for k, it in items.items()), default=0.0)
    for it in items.values():
        it.x -= low


def _y(layer: int) -> float:
    return MARGIN + layer * (NODE_H + GAP_Y)


def graph_svg(
    graph: Graph,
    evidence: Mapping[int, tuple[str, str]],
    kernel_of: Mapping[int, str],
    anchor: Anchor,
) -> str:
    """``graph`` as an SVG document. ``evidence``: node id -> (executor, detail);
    ``kernel_of``: node id -> the kernel computing it (outlined together, linked to the
    kernel); ``anchor(kind, name)``: the link target of a ``node`` (by id) or a ``kernel``."""
    keys, edges, labels = _edges(graph)
    items, chains = _with_bends(keys, edges, _layers(keys, edges))
    rows = _order(items, chains)
    right = max((it.x for it in items.values()), default=0.0) + NODE_W / 2
    width, height = right + 2 * MARGIN, _y(len(rows)) + MARGIN

    def centre(k: str) -> tuple[float, float]:
        it = items[k]
        return MARGIN + it.x, _y(it.layer) + NODE_H / 2

    parts = [
        # NOTE: inline SVG in HTML needs no namespace attribute (and the page names no URL)
        f'<svg class="graph" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">',
        '<g class="edges">',
    ]
    for chain in chains:
        points = [centre(k) for k in chain]
        points[0] = (points[0][0], points[0][1] + NODE_H / 2)
        points[-1] = (points[-1][0], points[-1][1] - NODE_H / 2)
        text = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline points="{text}"/>')
    parts.append("</g>")
    parts += _groups(graph, kernel_of, centre, anchor)
    parts.append('<g class="nodes">')
    for k in keys:
        parts.append(_node(k, labels[k], centre(k), evidence, anchor))
    parts += ["</g>", "</svg>"]
    return "\n".join(parts)


def _groups(
    graph: Graph,
    kernel_of: Mapping[int, str],
    centre: Callable[[str], tuple[float, float]],
    anchor: Anchor,
) -> list[str]:
    """Each kernel's nodes outlined together, linked to the kernel's source: one box around
    them where it holds no other node, else one box around each (a kernel whose nodes lie far
    apart in the graph, such as copies of saved values, is not drawn over the rest)."""
    members: dict[str, list[tuple[float, float]]] = {}
    others: list[tuple[str | None, tuple[float, float]]] = []
    for n in graph.nodes:
        name = kernel_of.get(n.id)
        at = centre(f"n{n.id}")
        others.append((name, at))
        if name is not None:
            members.setdefault(name, []).append(at)
    parts = ['<g class="kernels">']
    for name, points in members.items():
        box = _box(points)
        inside = [
            at for owner, at in others if owner != name and box[0] < at[0] < box[2]
            and box[1] < at[1] < box[3]
        ]  # fmt: skip
        for b in [box] if not inside else [_box([at]) for at in points]:
            parts.append(_outline(name, b, anchor))
    parts.append("</g>")
    return parts


def _box(points: list[tuple[float, float]], pad: float = 6.0) -> tuple[float, ...]:
    return (
        min(x for x, _ in points) - NODE_W / 2 - pad,
        min(y for _, y in points) - NODE_H / 2 - pad,
        max(x for x, _ in points) + NODE_W / 2 + pad,
        max(y for _, y in points) + NODE_H / 2 + pad,
    )


def _outline(name: str, box: tuple[float, ...], anchor: Anchor) -> str:
    x0, y0, x1, y1 = box
    href = html.escape(anchor("kernel", name))
    return (
        f'<a href="{href}"><rect class="kernel" x="{x0:.1f}" y="{y0:.1f}" '
        f'width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" rx="6"/>'
        f'<text class="kernel-label" x="{x1 + 3:.1f}" y="{y0 + 10:.1f}">'
        f"{html.escape(name)}</text><title>kernel {html.escape(name)}</title></a>"
    )


def _node(
    key: str,
    label: str,
    at: tuple[float, float],
    evidence: Mapping[int, tuple[str, str]],
    anchor: Anchor,
) -> str:
    x, y = at
    if key.startswith("n"):
        nid = int(key[1:])
        executor, detail = evidence.get(nid, ("unknown", "no evidence recorded"))
        style = _style(executor, detail)
        tip = f"node {nid}: {executor}: {detail}"
        href = anchor("node", str(nid))
    else:
        style = "output" if key == "out" else "input"
        tip, href = label, ""
    shown = label if len(label) <= 22 else label[:21] + "…"
    body = (
        f'<rect class="node {style}" x="{x - NODE_W / 2:.1f}" y="{y - NODE_H / 2:.1f}" '
        f'width="{NODE_W}" height="{NODE_H}" rx="4" fill="{COLOURS[style]}"/>'
        f'<text x="{x:.1f}" y="{y + 4:.1f}">{html.escape(shown)}</text>'
        f"<title>{html.escape(tip)}</title>"
    )
    if href:
        return f'<a href="{html.escape(href)}">{body}</a>'
    return f"<g>{body}</g>"
