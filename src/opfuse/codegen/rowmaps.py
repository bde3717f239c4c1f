"""Index maps that spread each input row over a block of output rows and columns: a nearest Resize
upsampling by integer factors (``resize.nearest_factors``) and DepthToSpace. Output row ``oh`` reads input row
``oh // sh``, output column ``iw * sw + j`` reads input column ``iw`` (DepthToSpace: of the channel that
``oh % sh`` and ``j`` pick). A pointwise stage through one such map is written with the output columns visited
as ``sw`` neighbours per input column and the input row found by a division per output row, instead of the map's
per-element index arithmetic (DepthToSpace's ``/`` and ``%`` per element, Resize's index tables), which left
gcc a gather it did not vectorise. Where the stage's one output is a Resize's, each input position is computed
once and each finished output row is copied to the ``sh - 1`` rows that repeat it. Same values: each element is
read from where the map reads it (``CodegenOptions.row_maps``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from opfuse.codegen.ctype import c_type
from opfuse.codegen.index import Index, add, depth_to_space_channel, mul
from opfuse.codegen.resize import nearest_factors
from opfuse.ir.graph import Node, Value
from opfuse.ops.registry import get_spec


@dataclass(frozen=True)
class RowMap:
    """``node`` (Resize or DepthToSpace) spreads input row ``oh // sh`` over output row ``oh``, input column
    ``iw`` over output columns ``iw * sw + j``, ``j < sw``."""
    node: Node
    sh: int
    sw: int
    mode: str = ""  # DepthToSpace's DCR or CRD

    @property
    def repeats(self) -> bool:
        """Whether the ``sw`` columns (and ``sh`` rows) of a block are one input element (Resize)."""
        return self.node.op_type == "Resize"

    def source(self, lead: tuple[str, ...], i: str, ih: str, iw: str, j: int) -> Index:
        """The input element output ``(*lead, oh, iw * sw + j)`` reads, with ``ih = oh // sh``, ``i = oh % sh``."""
        x = self.node.input(0)
        if self.repeats:
            return Index(tuple(x.shape), (*lead, ih, iw))
        n, c = lead
        b = self.sh
        ch = depth_to_space_channel(add(mul(i, b), str(j)), c, self.node.outputs[0].shape[1], b, self.mode)
        return Index(tuple(x.shape), (n, ch, ih, iw))


def row_map(inline_nodes, shape) -> RowMap | None:
    """The ``RowMap`` of a stage over ``shape`` that computes exactly one Resize or DepthToSpace inline (and no
    other of either), a nearest Resize upsampling by integer factors along the last two axes only or a
    DepthToSpace of 4-D float or integer data, whose output has the stage's shape; None otherwise."""
    maps = [n for n in inline_nodes if n.op_type in ("Resize", "DepthToSpace")]
    if len(maps) != 1 or len(shape) < 2:
        return None
    node = maps[0]
    if tuple(node.outputs[0].shape) != tuple(shape):
        return None
    if node.op_type == "DepthToSpace":
        a = get_spec(node.op_type, node).attrs_of(node)
        b = int(a["blocksize"])
        return RowMap(node, b, b, a["mode"]) if len(shape) == 4 and b > 1 else None
    f = nearest_factors(node)
    if f is None or any(s != 1 for s in f[:-2]) or f[-2:] == (1, 1):
        return None
    return RowMap(node, f[-2], f[-1])


def _reads(outs: list[Value], y: Value, inline: set[int]) -> bool:
    """Whether computing ``outs`` inline reads ``y`` (``y`` is one of them, or an operand of an inline op on
    the way)."""
    todo, seen = list(outs), set()
    while todo:
        v = todo.pop()
        if v is y:
            return True
        if id(v) in seen or v.producer is None or id(v.producer) not in inline:
            continue
        seen.add(id(v))
        todo.extend(v.producer.input_values())
    return False


def emit_row_maps(kc, ev, outs: list[Value], shape, inline_nodes, body, cost: int) -> bool:
    """The stage's loop nest through its ``RowMap`` (module docstring); ``body(idx)`` stores ``outs`` at an
    output index. False (nothing written) where there is none or ``row_maps`` is off."""
    if not kc.program.options.row_maps:
        return False
    m = row_map(inline_nodes, shape)
    if m is None:
        return False
    x, y = m.node.input(0), m.node.outputs[0]
    if not _reads(outs, y, {id(n) for n in inline_nodes}):
        return False
    r = len(shape)
    H, W = x.shape[-2:]
    OH, OW = shape[-2:]
    lead = math.prod(shape[:-2])
    if lead * H * W == 0:
        return False
    sh, sw = m.sh, m.sw
    w = kc.w
    lv, oh, ih, iw, i = kc.tmp("i"), kc.tmp("oh"), kc.tmp("ih"), kc.tmp("iw"), kc.tmp("bi")
    groups = [(0, r - 2, lv)] if r > 2 else []
    rows_only = m.repeats and len(outs) == 1 and outs[0] is y
    row_var = ih if rows_only else oh
    kc.parallel_for(lead * OH * OW * cost, 2 if lead < kc.program.options.parallel_min_outer else 1)
    w.line(f"for (long {lv} = 0; {lv} < {lead}; ++{lv}) {{")
    w.line(f"  for (long {row_var} = 0; {row_var} < {H if rows_only else OH}; ++{row_var}) {{")
    w.level += 2
    at_out = Index.loops(shape, [*groups, (r - 2, r - 1, oh), (r - 1, r, iw)])
    lead_dims = at_out.dims[:-2]
    if rows_only:
        ct = c_type(y.dtype)
        row, val, k = kc.tmp("row"), kc.tmp("v"), kc.tmp("k")
        w.line(f"{ct}* restrict {row} = {kc.ptr(y, write=True)} + ({lv} * {OH} + {ih} * {sh}) * {OW};")
        with w.block(f"for (long {iw} = 0; {iw} < {W}; ++{iw})"), ev.scope():
            w.line(f"const {ct} {val} = {ev.at(x, m.source(lead_dims, '0', ih, iw, 0))};")
            for j in range(sw):
                w.line(f"{row}[{iw} * {sw} + {j}] = {val};" if sw > 1 else f"{row}[{iw}] = {val};")
        if sh > 1:
            w.line(f"for (int {k} = 1; {k} < {sh}; ++{k}) memcpy({row} + {k} * {OW}, {row}, {OW} * sizeof({ct}));")
    else:
        w.line(f"const long {ih} = {oh} / {sh};" if sh > 1 else f"const long {ih} = {oh};")
        if not m.repeats:
            w.line(f"const long {i} = {oh} % {sh};")
        with w.block(f"for (long {iw} = 0; {iw} < {W}; ++{iw})"), ev.scope():
            vals = [ev.at(x, m.source(lead_dims, i, ih, iw, j)) for j in range(sw)]
            for j in range(sw):
                col = f"({iw} * {sw} + {j})" if sw > 1 else iw
                idx = Index(at_out.shape, at_out.dims[:-1] + (col,), at_out.runs)
                with w.block(""), ev.scope():
                    ev.remember(y, idx, vals[j])
                    body(idx)
    w.level -= 2
    w.line("  }")
    w.line("}")
    return True
