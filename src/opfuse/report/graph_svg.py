"""The fused graph as SVG: every op a box, every fusion group of two or more ops a coloured
cluster around its ops, coloured by the rule that formed it.

Graphviz lays it out when ``dot`` is installed (``layout="dot"``, or ``"auto"`` finding it);
otherwise (``"svg"``) a layered layout of the group graph written here: each group goes to the
layer after its deepest producer (longest path), groups in a layer are ordered by the mean
position of their producers (one barycentre sweep), and a group's ops stack inside its box in
plan order. Graph inputs sit above, outputs below; an edge runs from an op to each op reading
its output.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from html import escape

from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionGroup, FusionPlan

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#86bc86")
SINGLE = "#9e9e9e"
DOT_TIMEOUT_S = 60
LAYOUTS = ("auto", "dot", "svg")

# The layered layout's geometry, in pixels.
NODE_W, NODE_H, NODE_GAP = 118, 26, 10
BOX_PAD, BOX_HEAD = 8, 16
COL_GAP, LAYER_GAP = 26, 34
IO_H = 22


def rule_colours(plan: FusionPlan) -> dict[str, str]:
    """Rule -> colour, in order of first appearance (stable across runs of one plan)."""
    rules = list(dict.fromkeys(str(g.attrs.get("rule") or g.kind) for g in plan.groups if len(g.nodes) > 1))
    return {r: PALETTE[i % len(PALETTE)] for i, r in enumerate(rules)}


def _colour(group: FusionGroup, colours: dict[str, str]) -> str:
    return colours.get(str(group.attrs.get("rule") or group.kind), SINGLE) if len(group.nodes) > 1 else SINGLE


def _tint(colour: str, amount: float = 0.82) -> str:
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{int(c + (255 - c) * amount):02x}" for c in (r, g, b))


def graph_svg(plan: FusionPlan, layout: str = "auto") -> tuple[str, str]:
    """``(svg, how)``: the SVG and the layout used (``"graphviz dot"`` or ``"built-in layered"``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    colours = rule_colours(plan)
    dot = shutil.which("dot") if layout in ("auto", "dot") else None
    if dot:
        svg = _graphviz(dot, to_dot(plan, colours))
        if svg is not None:
            return svg, "graphviz dot"
    return layered_svg(plan, colours), "built-in layered"


# Graphviz --------------------------------------------------------------------------------------------

def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _shape(v) -> str:
    return f"{v.dtype.name}[{'x'.join(str(d) for d in v.shape)}]" if v.type is not None else "?"


def to_dot(plan: FusionPlan, colours: dict[str, str]) -> str:
    graph = plan.graph
    ids = {n.name: f"n{i}" for i, n in enumerate(graph.nodes)}
    lines = ["digraph opfuse {", "  rankdir=TB; nodesep=0.18; ranksep=0.28; bgcolor=transparent;",
             '  node [shape=box, style="rounded,filled", fillcolor=white, fontname="Helvetica", fontsize=10, '
             'height=0.3, margin="0.08,0.03"];',
             '  edge [color="#777777", arrowsize=0.6];']
    for i, v in enumerate(graph.inputs):
        lines.append(f'  in{i} [label={_q(v.name)}, shape=ellipse, fillcolor="#eeeeee", tooltip={_q(_shape(v))}];')
    for k, g in enumerate(plan.groups, 1):
        members = [f"    {ids[n.name]} [label={_q(n.op_type)}, tooltip={_q(n.name)}];" for n in g.nodes]
        if len(g.nodes) > 1:
            c = _colour(g, colours)
            lines.append(f"  subgraph cluster_{k} {{")
            label = f"#{k} {g.attrs.get('rule') or g.kind}"
            lines.append(f'    label={_q(label)}; labeljust=l; fontsize=9; '
                         f'fontname="Helvetica"; style="rounded,filled"; fillcolor="{_tint(c)}"; color="{c}"; '
                         f'penwidth=1.5; tooltip={_q(g.name)};')
            lines += members
            lines.append("  }")
        else:
            lines += [m.replace("];", f', color="{SINGLE}"];') for m in members]
    inputs = {id(v): f"in{i}" for i, v in enumerate(graph.inputs)}
    for n in graph.nodes:
        for v in n.input_values():
            src = ids[v.producer.name] if v.producer is not None else inputs.get(id(v))
            if src is not None:
                lines.append(f"  {src} -> {ids[n.name]} [tooltip={_q(v.name + ' ' + _shape(v))}];")
    for i, v in enumerate(graph.outputs):
        lines.append(f'  out{i} [label={_q(v.name)}, shape=ellipse, fillcolor="#eeeeee", tooltip={_q(_shape(v))}];')
        src = ids[v.producer.name] if v.producer is not None else inputs.get(id(v))
        if src is not None:
            lines.append(f"  {src} -> out{i};")
    lines.append("}")
    return "\n".join(lines)


def _graphviz(dot: str, source: str) -> str | None:
    try:
        r = subprocess.run([dot, "-Tsvg"], input=source, capture_output=True, text=True, timeout=DOT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or "<svg" not in r.stdout:
        return None
    svg = r.stdout[r.stdout.index("<svg"):]  # drop the XML prolog and doctype: it is inlined in HTML
    svg = re.sub(r"<!--.*?-->", "", svg, flags=re.S)
    return svg.replace("<svg ", '<svg class="graph" ', 1)


# Built-in layered layout --------------------------------------------------------------------------

def _text(x: float, y: float, text: str, size: int = 11, anchor: str = "middle", weight: str = "normal",
          fill: str = "#222") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'fill="{fill}">{escape(text)}</text>')


def _layers(plan: FusionPlan) -> list[list[FusionGroup]]:
    depth: dict[int, int] = {}
    preds: dict[int, set[int]] = {id(g): set() for g in plan.groups}
    for a, b, _ in plan.group_edges():
        if a is not b:
            preds[id(b)].add(id(a))
    for g in plan.groups:  # plan order is topological
        depth[id(g)] = 1 + max((depth[p] for p in preds[id(g)]), default=-1)
    layers: list[list[FusionGroup]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for g in plan.groups:
        layers[depth[id(g)]].append(g)
    return layers


def layered_svg(plan: FusionPlan, colours: dict[str, str]) -> str:
    graph: Graph = plan.graph
    layers = _layers(plan)
    index = {id(g): k for k, g in enumerate(plan.groups, 1)}
    centre: dict[str, tuple[float, float, float]] = {}  # node or io name -> (x, top y, bottom y)
    boxes: list[str] = []
    nodes_svg: list[str] = []

    def box_h(g: FusionGroup) -> float:
        n = len(g.nodes)
        return n * NODE_H + (n - 1) * NODE_GAP + (2 * BOX_PAD + BOX_HEAD if n > 1 else 0)

    def box_w(g: FusionGroup) -> float:
        return NODE_W + (2 * BOX_PAD if len(g.nodes) > 1 else 0)

    rows: list[list[FusionGroup]] = []
    xpos: dict[int, float] = {}
    for layer in layers:  # barycentre order: the mean x of each group's producers
        def bary(g: FusionGroup) -> float:
            xs = [xpos[id(plan.group_of(v.producer))] for v in g.inputs()
                  if v.producer is not None and id(plan.group_of(v.producer)) in xpos]
            return sum(xs) / len(xs) if xs else 0.0
        row = sorted(layer, key=bary)
        x = 0.0
        for g in row:
            xpos[id(g)] = x + box_w(g) / 2
            x += box_w(g) + COL_GAP
        rows.append(row)
    widths = [sum(box_w(g) + COL_GAP for g in row) - COL_GAP for row in rows]
    width = max([*widths, len(graph.inputs) * (NODE_W + COL_GAP), len(graph.outputs) * (NODE_W + COL_GAP), NODE_W])
    width += 2 * COL_GAP

    y = 12.0
    io_row = lambda values: [(COL_GAP + (width - 2 * COL_GAP) * (i + 0.5) / len(values), v)  # noqa: E731
                             for i, v in enumerate(values)]
    for x, v in io_row(graph.inputs):
        centre["in:" + v.name] = (x, y, y + IO_H)
        nodes_svg.append(f'<g><title>{escape(f"input {v.name}: {_shape(v)}")}</title>'
                         f'<rect x="{x - NODE_W / 2:.1f}" y="{y:.1f}" width="{NODE_W}" height="{IO_H}" rx="11" '
                         f'fill="#eeeeee" stroke="#999"/>{_text(x, y + 15, v.name[:18])}</g>')
    y += IO_H + LAYER_GAP
    for row, w in zip(rows, widths, strict=True):
        x = (width - w) / 2
        height = max(box_h(g) for g in row)
        for g in row:
            bw, bh = box_w(g), box_h(g)
            cx = x + bw / 2
            ny = y
            if len(g.nodes) > 1:
                c = _colour(g, colours)
                label = f"#{index[id(g)]} {g.attrs.get('rule') or g.kind}"
                boxes.append(f'<g class="cluster"><title>{escape(f"{g.name}: " + "+".join(g.op_types))}</title>'
                             f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw}" height="{bh}" rx="8" fill="{_tint(c)}" '
                             f'stroke="{c}" stroke-width="1.5"/>'
                             f'{_text(x + 6, y + 12, label[:20], 9, "start", "bold", c)}</g>')
                ny = y + BOX_PAD + BOX_HEAD
            for n in g.nodes:
                stroke = _colour(g, colours)
                centre[n.name] = (cx, ny, ny + NODE_H)
                nodes_svg.append(f'<g class="node"><title>{escape(n.name)}</title>'
                                 f'<rect x="{cx - NODE_W / 2:.1f}" y="{ny:.1f}" width="{NODE_W}" height="{NODE_H}" '
                                 f'rx="5" fill="white" stroke="{stroke}"/>{_text(cx, ny + 17, n.op_type[:18])}</g>')
                ny += NODE_H + NODE_GAP
            x += bw + COL_GAP
        y += height + LAYER_GAP
    for x, v in io_row(graph.outputs):
        centre["out:" + v.name] = (x, y, y + IO_H)
        nodes_svg.append(f'<g><title>{escape(f"output {v.name}: {_shape(v)}")}</title>'
                         f'<rect x="{x - NODE_W / 2:.1f}" y="{y:.1f}" width="{NODE_W}" height="{IO_H}" rx="11" '
                         f'fill="#eeeeee" stroke="#999"/>{_text(x, y + 15, v.name[:18])}</g>')
    height = y + IO_H + 12

    def src_of(v) -> str | None:
        if v.producer is not None:
            return v.producer.name
        return "in:" + v.name if "in:" + v.name in centre else None

    edges: list[str] = []

    def edge(a: str, b: str, tip: str) -> None:
        x1, _, y1 = centre[a]
        x2, y2, _ = centre[b]
        if y2 < y1:  # never: layers go down
            return
        # A vertical edge that would run through ops between its ends bends around them.
        blocked = abs(x1 - x2) < 1 and any(abs(x - x1) < 1 and y1 < top < y2 for x, top, _ in centre.values())
        bend = -NODE_W * 0.75 if blocked else 0.0
        mid = (y1 + y2) / 2
        edges.append(f'<path d="M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{mid:.1f} {x2 + bend:.1f},{mid:.1f} '
                     f'{x2:.1f},{y2 - 3:.1f}" fill="none" stroke="#888" stroke-width="1" marker-end="url(#arrow)">'
                     f'<title>{escape(tip)}</title></path>')

    for n in graph.nodes:
        for v in n.input_values():
            s = src_of(v)
            if s is not None:
                edge(s, n.name, f"{v.name} {_shape(v)}")
    for v in graph.outputs:
        s = src_of(v)
        if s is not None:
            edge(s, "out:" + v.name, v.name)
    defs = ('<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
            'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#888"/></marker></defs>')
    return (f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
            f'width="{width:.0f}" height="{height:.0f}" font-family="sans-serif">{defs}'
            + "".join(boxes) + "".join(edges) + "".join(nodes_svg) + "</svg>")
