"""Two charts of the HTML report as inline SVG (no script, no library, no network).

* ``roofline_svg``: each kernel at its operational intensity ``I = FLOPs / boundary bytes`` and
  its attained rate ``FLOPs / time`` (measured when measured, else predicted), under the roof
  ``min(P_peak, B * I)`` of the target, with the ridge point ``I_c = P_peak / B``;
* ``memory_timeline_svg``: over the kernel order, the arena bytes live at each kernel (the sum
  of the blocks alive there: what no placement can go below) and the high-water mark of the
  placed blocks, against the arena size and its lower bound.

Each point and step carries a ``<title>``: the browser shows it on hover.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from opfuse.report.summary import human_bytes

WIDTH, HEIGHT = 760, 360
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 84, 20, 20, 48
AXIS = "#888"
GRID = "#e6e6e6"
TEXT = "#333"
LIVE, HIGH_WATER = "#7fb3e0", "#e07b39"  # the memory timeline's two series (the page's legend names them)


@dataclass
class RooflinePoint:
    name: str
    intensity: float  # FLOP/byte
    gflops: float  # attained GFLOP/s
    colour: str
    measured: bool
    label: str = ""  # tooltip details


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
            if lo <= 10.0 ** e <= hi]


def _fmt(v: float) -> str:
    if v >= 1000 or v < 0.01:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")
    return f"{v:g}"


class _Frame:
    """A plot area with log or linear axes mapping data to pixels."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, logx: bool, logy: bool):
        self.x0, self.x1, self.y0, self.y1, self.logx, self.logy = x0, x1, y0, y1, logx, logy

    def _t(self, v: float, lo: float, hi: float, log: bool) -> float:
        if log:
            v, lo, hi = math.log10(max(v, 1e-300)), math.log10(lo), math.log10(hi)
        return (v - lo) / (hi - lo) if hi > lo else 0.5

    def x(self, v: float) -> float:
        return MARGIN_L + self._t(v, self.x0, self.x1, self.logx) * (WIDTH - MARGIN_L - MARGIN_R)

    def y(self, v: float) -> float:
        return HEIGHT - MARGIN_B - self._t(v, self.y0, self.y1, self.logy) * (HEIGHT - MARGIN_T - MARGIN_B)

    def axes(self, xticks, yticks, xlabel: str, ylabel: str, xfmt=_fmt, yfmt=_fmt) -> list[str]:
        out = []
        for t in xticks:
            out.append(f'<line x1="{self.x(t):.1f}" y1="{MARGIN_T}" x2="{self.x(t):.1f}" y2="{HEIGHT - MARGIN_B}" '
                       f'stroke="{GRID}"/>')
            out.append(f'<text x="{self.x(t):.1f}" y="{HEIGHT - MARGIN_B + 16}" text-anchor="middle">'
                       f'{escape(xfmt(t))}</text>')
        for t in yticks:
            out.append(f'<line x1="{MARGIN_L}" y1="{self.y(t):.1f}" x2="{WIDTH - MARGIN_R}" y2="{self.y(t):.1f}" '
                       f'stroke="{GRID}"/>')
            out.append(f'<text x="{MARGIN_L - 6}" y="{self.y(t) + 4:.1f}" text-anchor="end">{escape(yfmt(t))}</text>')
        out.append(f'<rect x="{MARGIN_L}" y="{MARGIN_T}" width="{WIDTH - MARGIN_L - MARGIN_R}" '
                   f'height="{HEIGHT - MARGIN_T - MARGIN_B}" fill="none" stroke="{AXIS}"/>')
        out.append(f'<text x="{(MARGIN_L + WIDTH - MARGIN_R) / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
                   f'{escape(xlabel)}</text>')
        out.append(f'<text transform="translate(16 {(MARGIN_T + HEIGHT - MARGIN_B) / 2}) rotate(-90)" '
                   f'text-anchor="middle">{escape(ylabel)}</text>')
        return out


def _svg(body: list[str], label: str) -> str:
    return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(label)}" '
            f'font-family="sans-serif" font-size="11" fill="{TEXT}">' + "".join(body) + "</svg>")


def roofline_svg(points: list[RooflinePoint], peak_gflops: float, bandwidth_gbps: float, target: str) -> str:
    """The roofline of ``target`` (``peak_gflops``, ``bandwidth_gbps``) with ``points``."""
    ridge = peak_gflops / bandwidth_gbps
    xs = [p.intensity for p in points if p.intensity > 0] + [ridge]
    ys = [p.gflops for p in points if p.gflops > 0] + [peak_gflops]
    x0, x1 = 10 ** math.floor(math.log10(min(xs) / 2)), 10 ** math.ceil(math.log10(max(xs) * 2))
    y0 = 10 ** math.floor(math.log10(max(min(ys + [bandwidth_gbps * x0]) / 2, 1e-6)))
    y1 = 10 ** math.ceil(math.log10(peak_gflops * 2))
    f = _Frame(x0, x1, y0, y1, True, True)
    body = f.axes(_log_ticks(x0, x1), _log_ticks(y0, y1), "operational intensity (FLOP / byte of main memory)",
                  "GFLOP/s")
    # The roof: memory-bound slope up to the ridge, then flat at the peak.
    xa = max(x0, y0 / bandwidth_gbps)
    body.append(f'<polyline class="roof" points="{f.x(xa):.1f},{f.y(bandwidth_gbps * xa):.1f} '
                f'{f.x(ridge):.1f},{f.y(peak_gflops):.1f} {f.x(x1):.1f},{f.y(peak_gflops):.1f}" fill="none" '
                f'stroke="#222" stroke-width="2"/>')
    body.append(f'<line x1="{f.x(ridge):.1f}" y1="{MARGIN_T}" x2="{f.x(ridge):.1f}" y2="{HEIGHT - MARGIN_B}" '
                f'stroke="#c33" stroke-dasharray="5 4"/>')
    body.append(f'<text x="{f.x(ridge) + 5:.1f}" y="{MARGIN_T + 14}" fill="#c33">ridge {ridge:.2f} FLOP/B</text>')
    body.append(f'<text x="{WIDTH - MARGIN_R - 8}" y="{HEIGHT - MARGIN_B - 10}" text-anchor="end">'
                f'roof of {escape(target)}: {peak_gflops:.3g} GFLOP/s, {bandwidth_gbps:.3g} GB/s</text>')
    for p in points:
        if p.intensity <= 0 or p.gflops <= 0:
            continue
        fill = p.colour if p.measured else "white"
        how = "measured" if p.measured else "predicted"
        tip = f"{p.name}: I = {p.intensity:.3g} FLOP/B, {p.gflops:.3g} GFLOP/s ({how})"
        if p.label:
            tip += f"\n{p.label}"
        body.append(f'<circle class="kernel" cx="{f.x(p.intensity):.1f}" cy="{f.y(p.gflops):.1f}" r="5" fill="{fill}" '
                    f'stroke="{p.colour}" stroke-width="2"><title>{escape(tip)}</title></circle>')
    return _svg(body, f"roofline of {target}")


def memory_timeline_svg(groups: list[str], blocks: list[tuple[int, int, int, int]], arena_bytes: int,
                        lower_bound_bytes: int) -> str:
    """Arena use over the kernel order; ``blocks`` are ``(offset, size, first kernel, last kernel)``."""
    n = max(len(groups), 1)
    live = [sum(s for _, s, a, b in blocks if a <= t <= b) for t in range(n)]
    high = [max((o + s for o, s, a, b in blocks if a <= t <= b), default=0) for t in range(n)]
    top = max([arena_bytes, *live, *high, 1])
    f = _Frame(0, n, 0, top * 1.08, False, False)
    step = max(1, n // 12)
    yt = [top * k / 4 for k in range(5)]
    body = f.axes(list(range(0, n + 1, step)), yt, "kernel (plan order)", "bytes",
                  xfmt=lambda v: str(int(v)), yfmt=human_bytes)
    area = [f"{f.x(0):.1f},{f.y(0):.1f}"]
    line = []
    for t in range(n):
        area += [f"{f.x(t):.1f},{f.y(live[t]):.1f}", f"{f.x(t + 1):.1f},{f.y(live[t]):.1f}"]
        line += [f"{f.x(t):.1f},{f.y(high[t]):.1f}", f"{f.x(t + 1):.1f},{f.y(high[t]):.1f}"]
    area.append(f"{f.x(n):.1f},{f.y(0):.1f}")
    body.append(f'<polygon class="live" points="{" ".join(area)}" fill="{LIVE}" fill-opacity="0.6" stroke="#3b7dbf"/>')
    body.append(f'<polyline points="{" ".join(line)}" fill="none" stroke="{HIGH_WATER}" stroke-width="2"/>')
    for value, colour, label, right in ((arena_bytes, "#222", "arena", True),
                                        (lower_bound_bytes, "#2a9d4b", "lower bound", False)):
        body.append(f'<line x1="{MARGIN_L}" y1="{f.y(value):.1f}" x2="{WIDTH - MARGIN_R}" y2="{f.y(value):.1f}" '
                    f'stroke="{colour}" stroke-dasharray="6 4"/>')
        x, anchor, dy = (WIDTH - MARGIN_R - 6, "end", -5) if right else (MARGIN_L + 6, "start", 13)
        body.append(f'<text x="{x}" y="{f.y(value) + dy:.1f}" text-anchor="{anchor}" fill="{colour}">'
                    f'{label} {escape(human_bytes(value))}</text>')
    for t in range(n):  # hover targets, one per kernel
        name = groups[t] if t < len(groups) else ""
        body.append(f'<rect x="{f.x(t):.1f}" y="{MARGIN_T}" width="{f.x(t + 1) - f.x(t):.2f}" '
                    f'height="{HEIGHT - MARGIN_T - MARGIN_B}" fill="transparent"><title>{escape(f"kernel {t}: {name}")}'
                    f'\n{escape(f"live {human_bytes(live[t])}, high-water {human_bytes(high[t])}")}</title></rect>')
    return _svg(body, "arena memory over the kernel order")
