"""Convolution kernels.

* Regular and grouped Conv (any strides, dilations, pads, spatial rank) run on the GEMM core
  (``gemm.py``): per image and group, ``Y[m, p] = sum_k W[m, k] * X_col[k, p]`` with
  ``k = (c, kernel offset)`` and ``p`` the output position. The weights are packed at build
  time, and ``X_col`` is never materialised. In 2-D (constant weights, float32) the GEMM is
  implicit: the micro-kernel reads each window where it lies (``conv_windows.py``), except
  stride-1 1x1 convolutions whose positions nearly fill whole panels, which pack X's rows (20-35%
  faster than either read in place). Otherwise each tile packs the KC x NC
  slice of ``X_col`` it needs straight from the input (prologue applied; in 2-D whole
  output-row segments are copied and the padded columns zero-filled, other ranks decide
  padding per element). Output tiles get the bias and the fused epilogue while in cache.
* Depthwise Conv (one input and one output channel per group, 2-D) has its own loop nest
  (``depthwise.py``): per channel plane, a zero-padded copy of the plane and one vectorised
  pass per output row with every tap's weight in a register.
* Integer Conv of 8-bit activations (a quantized model's, int32 accumulators): int16 columns and
  weights, two output channels per pass, ``SMLAD`` on the Arm DSP extension (``qconv.py``); on a host
  with AVX2, a register-blocked int16-pair GEMM (depthwise: vectors of positions) with the requantizing
  epilogue in vectors (``qgemm.py``).
* ConvTranspose is a direct gather: output ``o`` reads input ``i = (o + pad - k * d) / s``
  where that division is exact.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.codegen.ctype import c_type, literal
from opfuse.codegen.conv_direct import direct_conv_refusal, direct_problem, row_crossing
from opfuse.codegen.conv_windows import windows_problem
from opfuse.codegen.depthwise import lower_depthwise
from opfuse.codegen.qconv import int8_conv_applies, lower_int8_conv
from opfuse.codegen.qgemm import host_int8_conv_applies, lower_host_int8_conv
from opfuse.codegen.gemm import BPacker, GemmProblem, Operand, emit_gemm, in_memory
from opfuse.codegen.index import Index, add, delinearize, inside_position, mul
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.loops import emit_loop_nest
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.codegen.winograd import lower_winograd, winograd_choice
from opfuse.ops.nn import conv_geometry as _geometry
from opfuse.ops.registry import get_spec


def _bias_term(ev, node, acc: str, oc: str) -> str:
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is None:
        return acc
    return f"{acc} + {ev.at(bias, Index(bias.shape, (oc,)))}"


class _Im2colPacker:
    """Packs the B panel (KC x NC slice of X_col) for one tile, precomputing per column the
    first input position of its window along each spatial axis."""

    def __init__(self, node, geo, group: int):
        self.node, self.geo, self.group = node, geo, group
        self.x = node.input(0)
        self.bases: list[str] = []
        self.offsets: list[int] = []

    def prepare(self, kc, NC: int):
        self.offsets = [kc.scratch(NC * 8) for _ in self.geo.kernel]
        return self

    def per_tile(self, kc, n0: str, nc: str) -> None:
        w = kc.w
        self.bases = []
        for off in self.offsets:
            name = kc.tmp("base")
            w.line(f"long* restrict {name} = {kc.scratch_ptr('long', off)};")
            self.bases.append(name)
        j = kc.tmp("j")
        out_sp = self.node.outputs[0].shape[2:]
        with w.block(f"for (long {j} = 0; {j} < {nc}; ++{j})"):
            pos = delinearize(add(n0, j), out_sp)
            for s, name in enumerate(self.bases):
                w.line(f"{name}[{j}] = {add(mul(pos[s], self.geo.strides[s]), str(-self.geo.pads_begin[s]))};")

    def pack(self, kc, ev, p: GemmProblem, bp, b, n0, nc, pc, kb, NR) -> None:
        w = kc.w
        geo, x = self.geo, self.x
        C = x.shape[1]
        cg = C // self.group
        ksize = math.prod(geo.kernel)
        padded = any(geo.pads_begin) or any(geo.pads_end)
        k, jp, c = kc.tmp("k"), kc.tmp("jp"), kc.tmp("c")
        img = f"{b} / {self.group}" if self.group > 1 else b
        with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"):
            kk, ch = kc.tmp("kk"), kc.tmp("ch")
            w.line(f"const long {kk} = {pc} + {k};")
            gpart = f"({b} % {self.group}) * {cg} + " if self.group > 1 else ""
            w.line(f"const long {ch} = {gpart}{kk} / {ksize};")
            koff = delinearize(f"({kk} % {ksize})", geo.kernel)
            shifts = []
            for s in range(len(geo.kernel)):
                name = kc.tmp("dk")
                w.line(f"const long {name} = {mul(koff[s], geo.dilations[s])};")
                shifts.append(name)
            with w.block(f"for (long {jp} = 0; {jp} < {nc}; {jp} += {NR})"):
                cols, dst = kc.tmp("cols"), kc.tmp("dst")
                w.line(f"const long {cols} = ({p.N} - {n0} - {jp}) < {NR} ? ({p.N} - {n0} - {jp}) : {NR};")
                w.line(f"float* restrict {dst} = {bp} + {jp} * {kb} + {k} * {NR};")
                with w.block(f"for (long {c} = 0; {c} < {cols}; ++{c})"):
                    pos = []
                    for s, base in enumerate(self.bases):
                        name = kc.tmp("q")
                        w.line(f"const long {name} = {base}[{jp} + {c}] + {shifts[s]};")
                        pos.append(name)
                    idx = Index(x.shape, (img, ch) + tuple(pos))
                    if padded:  # read at the nearest position inside and select (``_generic_im2col_loader``)
                        cond = " && ".join(f"(unsigned long){q} < {x.shape[2 + s]}ul" for s, q in enumerate(pos))
                        inside = Index(x.shape, (img, ch) + tuple(
                            inside_position(q, x.shape[2 + s]) for s, q in enumerate(pos)))
                        v = kc.tmp("v")
                        with w.block(""), ev.scope():
                            w.line(f"const float {v} = {ev.at(x, inside)};")
                            w.line(f"{dst}[{c}] = ({cond}) ? {v} : 0.0f;")
                    else:
                        with w.block(""), ev.scope():
                            w.line(f"{dst}[{c}] = {ev.at(x, idx)};")
                w.line(f"for (long {c} = {cols}; {c} < {NR}; ++{c}) {dst}[{c}] = 0.0f;")


def valid_range(out_len: int, in_len: int, stride: int, offset: int) -> tuple[int, int]:
    """Output positions ``o`` with ``0 <= o * stride + offset < in_len``, as ``[lo, hi)``."""
    lo = -(offset // stride) if offset < 0 else 0  # ceil(-offset / stride)
    hi = min(out_len, (in_len - 1 - offset) // stride + 1) if in_len - 1 - offset >= 0 else 0
    return min(lo, out_len), max(min(lo, out_len), hi)


class _RowSegmentPacker:
    """The 2-D im2col packer: for each k = (channel, kh, kw) the tile's columns are walked
    one output-row segment at a time; within a segment the valid columns (precomputed per
    kw) are one strided run of the input row, copied by a branch-free loop, and the padded
    columns are zero-filled. No per-element index arithmetic or bounds test."""

    def __init__(self, node, geo, group: int):
        self.node, self.geo, self.group = node, geo, group
        self.x = node.input(0)

    def prepare(self, kc, NC: int):
        return self

    def per_tile(self, kc, n0: str, nc: str) -> None:
        return None

    def pack(self, kc, ev, p: GemmProblem, bp, b, n0, nc, pc, kb, NR) -> None:
        w = kc.w
        geo, x = self.geo, self.x
        C, H, W = x.shape[1:]
        OH, OW = self.node.outputs[0].shape[2:]
        KH, KW = geo.kernel
        (SH, SW), (DH, DW), (PT, PL) = geo.strides, geo.dilations, geo.pads_begin
        cg = C // self.group
        ranges = [valid_range(OW, W, SW, kw * DW - PL) for kw in range(KW)]
        lo_t, hi_t = kc.tmp("owlo"), kc.tmp("owhi")
        w.line(f"static const long {lo_t}[{KW}] = {{{', '.join(str(r[0]) for r in ranges)}}};")
        w.line(f"static const long {hi_t}[{KW}] = {{{', '.join(str(r[1]) for r in ranges)}}};")
        img = f"{b} / {self.group}" if self.group > 1 else b
        k = kc.tmp("k")
        with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"):
            kk, ch, kh, kw = kc.tmp("kk"), kc.tmp("ch"), kc.tmp("kh"), kc.tmp("kw")
            w.line(f"const long {kk} = {pc} + {k};")
            gpart = f"({b} % {self.group}) * {cg} + " if self.group > 1 else ""
            w.line(f"const long {ch} = {gpart}{kk} / {KH * KW};")
            w.line(f"const long {kh} = ({kk} % {KH * KW}) / {KW};")
            w.line(f"const long {kw} = {kk} % {KW};")
            j = kc.tmp("j")
            w.line(f"long {j} = 0;")
            with w.block(f"while ({j} < {nc})"):
                n, oh, ow0, seg, ih, ok = (kc.tmp(t) for t in ("n", "oh", "ow", "seg", "ih", "ok"))
                w.line(f"const long {n} = {n0} + {j};")
                w.line(f"const long {oh} = {n} / {OW};")
                w.line(f"const long {ow0} = {n} % {OW};")
                w.line(f"const long {seg} = ({OW} - {ow0}) < ({nc} - {j}) ? ({OW} - {ow0}) : ({nc} - {j});")
                w.line(f"const long {ih} = {add(mul(oh, SH), mul(kh, DH), str(-PT))};")
                w.line(f"const int {ok} = (unsigned long){ih} < {H}ul;")
                t = kc.tmp("t")
                with w.block(f"for (long {t} = 0; {t} < {seg}; )"):
                    col, r, piece, dst, a, e, c0, c1, o = (kc.tmp(v) for v in
                                                           ("col", "r", "piece", "dst", "a", "e", "c0", "c1", "o"))
                    w.line(f"const long {col} = {j} + {t};")
                    w.line(f"const long {r} = {col} % {NR};")
                    w.line(f"const long {piece} = ({NR} - {r}) < ({seg} - {t}) ? ({NR} - {r}) : ({seg} - {t});")
                    w.line(f"float* restrict {dst} = {bp} + ({col} - {r}) * {kb} + {k} * {NR} + {r} - ({ow0} + {t});")
                    w.line(f"const long {a} = {ow0} + {t}, {e} = {a} + {piece};")
                    w.line(f"const long {c0} = !{ok} ? {e} : ({lo_t}[{kw}] < {a} ? {a} : "
                           f"({lo_t}[{kw}] > {e} ? {e} : {lo_t}[{kw}]));")
                    w.line(f"const long {c1} = !{ok} ? {e} : ({hi_t}[{kw}] < {c0} ? {c0} : "
                           f"({hi_t}[{kw}] > {e} ? {e} : {hi_t}[{kw}]));")
                    w.line(f"for (long {o} = {a}; {o} < {c0}; ++{o}) {dst}[{o}] = 0.0f;")
                    with w.block(f"for (long {o} = {c0}; {o} < {c1}; ++{o})"), ev.scope():
                        iw = add(mul(o, SW), mul(kw, DW), str(-PL))
                        w.line(f"{dst}[{o}] = {ev.at(x, Index(x.shape, (img, ch, ih, iw)))};")
                    w.line(f"for (long {o} = {c1}; {o} < {e}; ++{o}) {dst}[{o}] = 0.0f;")
                    w.line(f"{t} += {piece};")
                w.line(f"{j} += {seg};")
            # Columns past the tile's last one, up to the panel width, are zero.
            c = kc.tmp("c")
            w.line(f"for (long {c} = {nc}; {c} < ({nc} + {NR} - 1) / {NR} * {NR}; ++{c}) "
                   f"{bp}[({c} - {c} % {NR}) * {kb} + {k} * {NR} + {c} % {NR}] = 0.0f;")


# Most padded columns per position for a 1x1 convolution to pack X (else its windows: positions as rows). 1.07
# until the AVX2 host: its 14x14 layers (196 positions in 208 columns of 6 x 16 panels: 1.061) then packed X, and over
# their windows (196 in 198 rows) they run 0.90-0.91x (1x1 512 -> 512, 1 thread, both builds and onnxruntime
# alternating, 150 runs, the same bits). 1.05 keeps every AVX-512 choice as it was (28x28: 800 in 784, 1.02);
# NEON's 16-column panels change as AVX2's (not measured on Arm).
PACKED_WASTE = 1.05
# Whether a strided 1x1 convolution packs X's rows too (an element-wise gather of every other column
# per K block), instead of reading its stride-2 windows in place. Off: resnet18's layer2 downsample
# (64 -> 128, 56x56 stride 2, 784 positions) took 0.86x the time over its windows (1 thread, kernel
# CPU time, 40 interleaved runs: 147 -> 127 us, 87 -> 101 GFLOP/s).
PACKED_STRIDED = False


def conv_problem(kc, ev, node) -> GemmProblem:
    """Convolution as GEMM, per image and group: ``W @ X_col`` with X_col packed per tile
    (for an unpadded 1x1 convolution X_col is X's rows, strided or not; other ranks and
    run-time weights use the im2col packers), except that 2-D
    convolutions with constant weights in float32 are the implicit GEMM over their windows
    (``conv_windows.py``): measured 20% faster than im2col packing on resnet18's 3x3 layers."""
    geo, G = _geometry(node)
    x, wt = node.input(0), node.input(1)
    out = node.outputs[0]
    nimg, C = x.shape[:2]
    OC = wt.shape[0]
    cg, mg = C // G, OC // G
    out_sp = out.shape[2:]
    nsp = len(out_sp)
    P = math.prod(out_sp)
    K = cg * math.prod(geo.kernel)

    def split(b: str) -> tuple[str, str]:
        return (f"{b} / {G}", f"({b} % {G})") if G > 1 else (b, "0")

    def oc_of(b: str, m: str) -> str:
        return add(mul(split(b)[1], mg), m) if G > 1 else m

    def out_index(b, m, n):
        dims = (split(b)[0], oc_of(b, m)) + tuple(delinearize(n, out_sp))
        return Index(out.shape, dims, ((2, 2 + nsp, n),) if nsp > 1 else ())

    bias = node.inputs[2] if len(node.inputs) > 2 else None

    def bias_at(ev, b, m, n):  # the GEMM's finish: acc + bias_at (conv_bias_term's term)
        return ev.at(bias, Index(bias.shape, (oc_of(b, m),)))
    finish_bias = bias_at if bias is not None else None

    def w_load(ev, b, m, k):
        dims = (oc_of(b, m),) + tuple(delinearize(k, wt.shape[1:]))
        return ev.at(wt, Index(wt.shape, dims, ((1, len(wt.shape), k),)))

    pointwise = (all(k == 1 for k in geo.kernel) and all(s == 1 for s in geo.strides)
                 and not any(geo.pads_begin) and not any(geo.pads_end))
    sw = ev.static.get(id(wt))
    # A 1x1 convolution whose positions nearly fill whole NR-wide panels packs X's rows (not where
    # it is strided, ``PACKED_STRIDED``):
    # 20-35% faster than the windows, or than reading X in place, at 28x28 to 112x112; at 14x14 with AVX2's
    # 16 columns (196 in 208) and at 7x7 (49 in 64) the windows win (``PACKED_WASTE``).
    nr = kc.program.options.gemm_nr
    one_by_one = all(k == 1 for k in geo.kernel) and not any(geo.pads_begin) and not any(geo.pads_end)
    packed_rows = one_by_one and -(-P // nr) * nr <= PACKED_WASTE * P and \
        (PACKED_STRIDED or all(s == 1 for s in geo.strides))
    direct_refusal = direct_conv_refusal(kc.program.options, node, geo, G, sw, out.dtype)
    if direct_refusal is None and not packed_rows:
        band = "a band split by kernel column, panels across output rows" \
            if row_crossing(node, geo, kc.program.options) else "a phase-split band"
        groups = f", per group of {C // G} channels" if G > 1 else ""
        kc.note(lambda name: f"Conv '{name}': direct kernel (channels x positions over {band}{groups})", node)
        return direct_problem(kc, ev, node, geo, sw, finish_bias, G)
    if sw is not None and nsp == 2 and out.dtype == np.float32 and not packed_rows:
        return windows_problem(kc, ev, node, geo, G, sw, finish_bias)

    a_op = Operand(w_load)
    if sw is not None:
        a_op.static = sw.astype(np.float32).reshape(G, mg, K)
        a_op.batch_expr = (lambda b: f"({b} % {G})") if G > 1 else (lambda b: "0")

    def x_index(b, k, n):  # 1x1, stride 1, no padding: X_col is X itself
        img, g = split(b)
        ch = add(mul(g, cg), k) if G > 1 else k
        dims = (img, ch) + tuple(delinearize(n, x.shape[2:]))
        return Index(x.shape, dims, ((2, 2 + nsp, n),) if nsp > 1 else ())

    def x_direct(ev, b, k, n):
        return ev.at(x, x_index(b, k, n))

    b_op = Operand(x_direct)
    if pointwise and in_memory(ev, x):
        b_op.row_ptr = lambda b, k, n: f"{kc.ptr(x)} + {x_index(b, k, n).offset()}"
        b_op.row_step = math.prod(x.shape[2:])  # one channel on: a plane
    packer: BPacker | None
    if pointwise:
        packer = None
    elif nsp == 2:
        packer = _RowSegmentPacker(node, geo, G)
    else:
        packer = _Im2colPacker(node, geo, G)
    return GemmProblem(node.name, nimg * G, mg, P, K, a_op, b_op, out, out_index, finish_bias=finish_bias,
                       pack_b=packer, dtype=out.dtype, store_ld=P if G == 1 and sw is not None else None,
                       row_bias=bias)


def lower_conv(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    node = stage.anchor_node
    geo, G = _geometry(node)
    x, wt = node.input(0), node.input(1)
    C, OC = x.shape[1], wt.shape[0]
    out = node.outputs[0]
    if G == C and OC == C and len(geo.kernel) == 2 and out.dtype == np.float32:
        return lower_depthwise(kc, ev, stage, node, geo, _bias_term)
    if int8_conv_applies(node, ev.static):
        host = host_int8_conv_applies(kc, ev, stage)
        if host is not None:  # AVX2 on the host, plain C over the same packed weights under #else
            return lower_host_int8_conv(kc, ev, stage, host)
        return lower_int8_conv(kc, ev, stage, _bias_term)
    choice = winograd_choice(node, kc.program.options, ev.static)
    if len(x.shape) == 4:
        kc.note(choice.describe, node)
    if choice.transform is not None:
        return lower_winograd(kc, ev, stage, node, choice.transform, _bias_term)
    p = conv_problem(kc, ev, node)
    if out.dtype != np.float32 and p.pack_b is not None:
        p.pack_b = None
        p.b.load = _generic_im2col_loader(node, geo, G)
    emit_gemm(kc, ev, stage, p)


def _generic_im2col_loader(node, geo, G):
    x = node.input(0)
    cg = x.shape[1] // G
    out_sp = node.outputs[0].shape[2:]
    ksize = math.prod(geo.kernel)

    def load(ev, b, k, n):
        w = ev.kc.w
        img, g = (f"{b} / {G}", f"({b} % {G})") if G > 1 else (b, "0")
        ch = add(mul(g, cg), f"({k}) / {ksize}")
        koff = delinearize(f"(({k}) % {ksize})", geo.kernel)
        opos = delinearize(n, out_sp)
        pos = [add(mul(opos[s], geo.strides[s]), str(-geo.pads_begin[s]), mul(koff[s], geo.dilations[s]))
               for s in range(len(geo.kernel))]
        # No load under a condition: read at the nearest position inside the input and select 0 outside
        # (gcc 12.2 -O3 turned ``if (inside) v = x[..]`` here into masked loads, as it did in the Pad and the
        # pools whose masked loads returned other memory: issue 13, tests/e2e/test_guarded_loads.py).
        ct = c_type(x.dtype)
        qs, inside = [], []
        for s, q in enumerate(pos):
            name = ev.kc.tmp("q")
            w.line(f"const long {name} = {q};")
            inside.append(f"(unsigned long){name} < {x.shape[2 + s]}ul")
            qs.append(inside_position(name, x.shape[2 + s]))
        t, v = ev.kc.tmp("t"), ev.kc.tmp("v")
        w.line(f"const {ct} {t} = {ev.at(x, Index(x.shape, (img, ch) + tuple(qs)))};")
        w.line(f"const {ct} {v} = ({' && '.join(inside)}) ? {t} : {literal(0, x.dtype)};")
        return v
    return load


def lower_conv_transpose(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    from opfuse.ops.nn import convT_geometry
    node = stage.anchor_node
    a = get_spec(node.op_type, node).attrs_of(node)
    g = convT_geometry(node, a)
    x, wt = node.input(0), node.input(1)
    out = node.outputs[0]
    C = x.shape[1]
    cg, mg = C // g.group, g.channels_out // g.group
    nsp = len(g.kernel)
    dt = out.dtype
    ct = c_type(dt)
    w = kc.w

    def body(oidx: Index):
        oc = oidx.dims[1]
        grp = f"({oc}) / {mg}" if g.group > 1 else "0"
        m = f"({oc}) % {mg}" if g.group > 1 else oc
        acc = kc.tmp("acc")
        w.line(f"{ct} {acc} = {literal(0, dt)};")
        opened = 0
        pos, koff = [], []
        for s in range(nsp):
            k, t, i = kc.tmp("k"), kc.tmp("t"), kc.tmp("i")
            w.line(f"for (long {k} = 0; {k} < {g.kernel[s]}; ++{k}) {{")
            w.level += 1
            opened += 1
            w.line(f"const long {t} = {add(oidx.dims[2 + s], str(g.pads_begin[s]), mul(k, -g.dilations[s]))};")
            w.line(f"if ({t} < 0 || {t} % {g.strides[s]} != 0) continue;")
            w.line(f"const long {i} = {t} / {g.strides[s]};")
            w.line(f"if ({i} >= {x.shape[2 + s]}) continue;")
            pos.append(i)
            koff.append(k)
        c = kc.tmp("c")
        with w.block(f"for (long {c} = 0; {c} < {cg}; ++{c})"), ev.scope():
            ch = add(mul(grp, cg), c) if g.group > 1 else c
            xv = ev.at(x, Index(x.shape, (oidx.dims[0], ch) + tuple(pos)))
            wv = ev.at(wt, Index(wt.shape, (ch, m) + tuple(koff)))
            w.line(f"{acc} += {xv} * {wv};")
        for _ in range(opened):
            w.level -= 1
            w.line("}")
        y = kc.tmp("y")
        w.line(f"const {ct} {y} = {_bias_term(ev, node, acc, oc)};")
        finish_element(kc, ev, stage, out, oidx, y)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=cg * math.prod(g.kernel))
