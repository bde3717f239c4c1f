"""LSTM, GRU and RNN: the input projection as blocked GEMMs, then a time loop over the recurrent products.

The math is in ``opfuse.ops.recurrent`` (gate order i, o, f, c for LSTM; z, r, h for GRU). Per
direction ``d`` (a bidirectional node runs two passes, forward then reverse, writing Y's
direction axis interleaved), with ``N = G * H`` gate columns:

1. ``XW = X W^T + bias`` as one GEMM per block of ``recurrent_block_steps`` time steps (taken in
   the direction's order), rows ordered (t, b): the block's X rows are packed into the GEMM
   micro-kernel's MR-row panels, ``W^T`` is in NR-column panels (packed at build time when W is
   a constant, per run otherwise), and ``XW`` starts at the bias (``Wb + Rb``, except the GRU's
   ``Rbh`` with ``linear_before_reset``, which stays inside the reset product). The block's XW
   is still in cache when its steps read it, and scratch does not grow with T;
2. for each step t of the block (descending for the reverse direction) and batch row b with
   ``t < sequence_lens[b]``: ``XW[t, b] += h[b] R^T`` (``opfuse_rnn_matvec``: an axpy per hidden
   unit over the unit-stride rows of ``R^T``, which gcc vectorises without reordering any sum;
   ``R^T`` is transposed at build time when R is a constant), then one loop over the H units
   applies the clip, the activations (``vecmath``'s vectorisable sigmoid and tanh, or the
   other ONNX activations inline), the peepholes and the state update, and writes Y. The GRU
   runs its candidate's product after the reset gate: ``(r * h) Rh^T`` (or ``h Rh^T + Rbh``
   scaled by r with ``linear_before_reset``);
3. ``Y_h`` (``Y_c``) take the final state; a row that ran no step gets zeros and Y rows past a
   row's length are zeros (onnxruntime's behaviour).

The state (h, c) lives in scratch; a batch row's product reads only its own h, so the row's
state is updated in place. A ``sequence_lens`` value outside ``[0, T]`` is a run-time fault
(the runtime raises ``InputError``). Everything is plain C99 apart from the micro-kernel's and
the mat-vec's ``#if``-guarded intrinsics, so ``simd="none"`` computes the same sums (without FMA).
float64 computes the projection as a direct loop over X and W in place, the plain mat-vec, and
libm's exp/tanh/expm1/log1p for the activations.
"""
from __future__ import annotations

import numpy as np

from opfuse.codegen import vecmath
from opfuse.codegen.ctype import c_type, literal
from opfuse.codegen.gemm import pack_b_panels, require_outlined_microkernel
from opfuse.codegen.microkernel import AVX2_GUARD
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.errors import UnsupportedOpError
from opfuse.ops.recurrent import Activation, RecurrentConfig, output_shapes, recurrent_config, sequence_lens_message
from opfuse.ops.registry import get_spec

MATVEC = "opfuse_rnn_matvec"
# Columns per register block of the AVX2 mat-vec: 8 ymm accumulators keep both FMA ports busy
# (latency 4, throughput 2 per cycle) and leave registers for the broadcast and the loads.
MATVEC_BLOCK = 64


def matvec_name(ct: str) -> str:
    return MATVEC if ct == "float" else f"{MATVEC}_{ct}"


def matvec_text(simd: str, ct: str = "float") -> str:
    """``acc[n] += sum_k x[k] * rt[k * ldr + n]`` for ``n < N``; every sum in increasing k.

    With AVX2/FMA (``#if``-guarded, ``simd="auto"``): blocks of MATVEC_BLOCK columns whose
    accumulators stay in registers over the whole k loop (R^T is read once per call), then
    8-column blocks, then scalar columns. Plain C99 (``simd="none"``, or no AVX2): four rows of
    ``rt`` per pass over ``acc``, an axpy gcc vectorises without reordering a sum. ``ct``: the
    element type (``double`` always takes the plain path)."""
    nv = MATVEC_BLOCK // 8
    accs = [f"a{v}" for v in range(nv)]
    avx2 = "\n".join([
        f"  for (; n + {MATVEC_BLOCK} <= N; n += {MATVEC_BLOCK}) {{",
        "    __m256 " + ", ".join(f"{a} = _mm256_loadu_ps(acc + n + {8 * v})" for v, a in enumerate(accs)) + ";",
        "    for (long k = 0; k < K; ++k) {",
        "      const __m256 xk = _mm256_broadcast_ss(x + k);",
        "      const float* restrict r = rt + k * ldr + n;",
        *[f"      {a} = _mm256_fmadd_ps(xk, _mm256_loadu_ps(r + {8 * v}), {a});" for v, a in enumerate(accs)],
        "    }",
        *[f"    _mm256_storeu_ps(acc + n + {8 * v}, {a});" for v, a in enumerate(accs)],
        "  }",
        "  for (; n + 8 <= N; n += 8) {",
        "    __m256 a0 = _mm256_loadu_ps(acc + n);",
        "    for (long k = 0; k < K; ++k) a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + k), "
        "_mm256_loadu_ps(rt + k * ldr + n), a0);",
        "    _mm256_storeu_ps(acc + n, a0);",
        "  }",
        "  for (; n < N; ++n) {",
        "    float a = acc[n];",
        "    for (long k = 0; k < K; ++k) a += x[k] * rt[k * ldr + n];",
        "    acc[n] = a;",
        "  }",
    ])
    plain = f"""\
  long k = 0;
  for (; k + 4 <= K; k += 4) {{
    const {ct} x0 = x[k], x1 = x[k + 1], x2 = x[k + 2], x3 = x[k + 3];
    const {ct}* restrict r0 = rt + k * ldr;
    const {ct}* restrict r1 = r0 + ldr;
    const {ct}* restrict r2 = r1 + ldr;
    const {ct}* restrict r3 = r2 + ldr;
    for (long n = 0; n < N; ++n) acc[n] = (((acc[n] + x0 * r0[n]) + x1 * r1[n]) + x2 * r2[n]) + x3 * r3[n];
  }}
  for (; k < K; ++k) {{
    const {ct} x0 = x[k];
    const {ct}* restrict r0 = rt + k * ldr;
    for (long n = 0; n < N; ++n) acc[n] += x0 * r0[n];
  }}"""
    head = (f"static void {matvec_name(ct)}(long K, long N, const {ct}* restrict x, const {ct}* restrict rt, "
            f"long ldr,\n                     {ct}* restrict acc) {{\n")
    if simd == "none" or ct != "float":
        return head + plain + "\n}\n"
    return (f"#if {AVX2_GUARD}\n#include <immintrin.h>\n#endif\n" + head + f"#if {AVX2_GUARD}\n  long n = 0;\n"
            + avx2 + "\n#else\n" + plain + "\n#endif\n}\n")


# double: libm, as the NumPy reference computes them (float32 takes vecmath's vectorisable helpers).
_DOUBLE_ACTIVATIONS = {
    "Sigmoid": "(1.0 / (1.0 + exp(-{x})))",
    "Tanh": "tanh({x})",
    "ScaledTanh": "({a} * tanh({b} * {x}))",
    "Elu": "({x} >= 0.0 ? {x} : {a} * expm1({x}))",
    "Softplus": "(({x} > 0.0 ? {x} : 0.0) + log1p(exp(-fabs({x}))))",
}


def activation_c(program, act: Activation, x: str, dtype=np.float32) -> str:
    """C expression of ``act`` at ``x`` (a plain variable: it may appear more than once), in
    ``dtype`` (float32 or float64)."""
    dt = np.dtype(dtype)
    a = literal(float(act.alpha), dt) if act.alpha is not None else ""
    b = literal(float(act.beta), dt) if act.beta is not None else ""
    n = act.name
    if dt != np.float32 and n in _DOUBLE_ACTIVATIONS:
        return _DOUBLE_ACTIVATIONS[n].format(x=x, a=a, b=b)
    if n == "Sigmoid":
        return f"{vecmath.require(program, vecmath.SIGMOID)}({x})"
    if n == "Tanh":
        return f"{vecmath.require(program, vecmath.TANH)}({x})"
    if n == "Relu":
        return f"({x} > 0.0f ? {x} : ({x} != {x} ? {x} : 0.0f))"
    if n == "Affine":
        return f"({x} * {a} + {b})"
    if n == "LeakyRelu":
        return f"({x} >= 0.0f ? {x} : {x} * {a})"
    if n == "ThresholdedRelu":
        return f"({x} > {a} ? {x} : 0.0f)"
    if n == "ScaledTanh":
        return f"({a} * {vecmath.require(program, vecmath.TANH)}({b} * {x}))"
    if n == "HardSigmoid":
        y = f"({x} * {a} + {b})"
        return f"({y} < 0.0f ? 0.0f : ({y} > 1.0f ? 1.0f : {y}))"
    if n == "Elu":
        return f"({x} >= 0.0f ? {x} : {a} * {vecmath.require(program, vecmath.EXPM1)}({x}))"
    if n == "Softsign":
        return f"({x} / (1.0f + ({x} < 0.0f ? -{x} : {x})))"
    if n == "Softplus":
        return f"{vecmath.require(program, vecmath.SOFTPLUS)}({x})"
    raise AssertionError(n)


def lower_recurrent(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    node = stage.anchor_node
    cfg = recurrent_config(node, get_spec(node.op_type, node).attrs_of(node))
    if node.input(0).dtype not in (np.float32, np.float64):  # the op, not the group: no UnsupportedGroupError
        raise UnsupportedOpError(node.op_type, node.name,
                                 detail=f"the C kernel runs float32 and float64, not {node.input(0).dtype} "
                                        f"(the reference backend runs it)")
    for v in node.input_values():
        if v.producer is not None and id(v.producer) in analysis.inline:
            raise kc.error(f"{node.op_type} reads its inputs from memory (no fused prologue)")
    _Lowering(kc, node, cfg, {id(v) for v in stage.outputs}).emit()


class _Lowering:
    def __init__(self, kc, node, cfg: RecurrentConfig, stored: set[int]):
        self.kc, self.node, self.cfg, self.w = kc, node, cfg, kc.w
        ins = list(node.inputs) + [None] * (8 - len(node.inputs))
        self.x, self.wt, self.r, self.b, self.lens, self.h0, self.c0, self.p = ins[:8]
        self.outs = [v if id(v) in stored else None for v in node.outputs] + [None] * 3
        self.dt = node.input(0).dtype
        self.ct = c_type(self.dt)
        self.f32 = self.dt == np.float32
        # float32: the GEMM micro-kernel's panels; float64: a direct loop (panels of 1 x 1).
        self.ukr, self.MR, self.NR = require_outlined_microkernel(kc) if self.f32 else ("", 1, 1)
        self.N = cfg.gates * cfg.hidden
        self.NP = -(-self.N // self.NR)
        self.NPAD = self.NP * self.NR
        # Time steps per projection block, rows (t, b) per block, MR-row panels per block.
        self.TB = max(1, min(cfg.seq, kc.program.options.recurrent_block_steps))
        self.M = self.TB * cfg.batch
        self.MP = -(-self.M // self.MR)

    # Scratch and operands --------------------------------------------------------------------
    def _scratch(self, name: str, elements: int) -> str:
        kc, ct = self.kc, self.ct
        p = kc.tmp(name)
        self.w.line(f"{ct}* restrict {p} = {kc.scratch_ptr(ct, kc.scratch(max(elements, 1) * self.dt.itemsize))};")
        return p

    def _lit(self, v: float) -> str:
        return literal(float(v), self.dt)

    def _packed_w(self, d: int) -> str:
        """W[d]^T in NR-column panels (NP x I x NR): a build-time constant, or packed now."""
        kc, NR, I_ = self.kc, self.NR, self.cfg.input_size
        if not self.f32:
            return kc.ptr(self.wt)
        if self.wt.const is not None:
            packed = pack_b_panels(np.asarray(self.wt.const[d], np.float32).T[None], NR)
            return kc.const_array(("rnn_w", self.node.name, d), packed, f"{self.node.name}_w{d}")
        wp = self.wp
        src = kc.ptr(self.wt)
        n, k = kc.tmp("n"), kc.tmp("k")
        with self.w.block(f"for (long {n} = 0; {n} < {self.NPAD}; ++{n})"):
            with self.w.block(f"for (long {k} = 0; {k} < {I_}; ++{k})"):
                self.w.line(f"{wp}[({n} / {NR}) * {I_ * NR} + {k} * {NR} + {n} % {NR}] = {n} < {self.N} ? "
                            f"{src}[{d * self.N * I_} + {n} * {I_} + {k}] : 0.0f;")
        return wp

    def _transposed_r(self, d: int) -> str:
        """R[d]^T (H x N, row-major): a build-time constant, or transposed now."""
        kc, H, N = self.kc, self.cfg.hidden, self.N
        if self.r.const is not None:
            rt_data = np.ascontiguousarray(np.asarray(self.r.const[d], self.dt).T)
            return kc.const_array(("rnn_rt", self.node.name, d), rt_data, f"{self.node.name}_rt{d}")
        rt, src = self.rt, kc.ptr(self.r)
        n, k = kc.tmp("n"), kc.tmp("k")
        with self.w.block(f"for (long {n} = 0; {n} < {N}; ++{n})"):
            self.w.line(f"for (long {k} = 0; {k} < {H}; ++{k}) {rt}[{k} * {N} + {n}] = "
                        f"{src}[{d * N * H} + {n} * {H} + {k}];")
        return rt

    def _state_index(self, d: int, b: str, j: str) -> str:
        cfg = self.cfg
        if cfg.layout == 0:
            return f"({d * cfg.batch} + {b}) * {cfg.hidden} + {j}"
        return f"({b} * {cfg.directions} + {d}) * {cfg.hidden} + {j}"

    def _y_index(self, d: int, t: str, b: str, j: str) -> str:
        cfg = self.cfg
        if cfg.layout == 0:
            return f"(({t} * {cfg.directions} + {d}) * {cfg.batch} + {b}) * {cfg.hidden} + {j}"
        return f"(({b} * {cfg.seq} + {t}) * {cfg.directions} + {d}) * {cfg.hidden} + {j}"

    # The kernel -----------------------------------------------------------------------------
    def emit(self) -> None:
        kc, cfg = self.kc, self.cfg
        T, B, I_, H, N = cfg.seq, cfg.batch, cfg.input_size, cfg.hidden, self.N
        MR, NR, NPAD = self.MR, self.NR, self.NPAD
        assert output_shapes(cfg)[0] == self.node.outputs[0].shape
        kc.note(lambda name: f"{self.node.op_type} {name}: input projection as {self.M}x{N}x{I_} GEMMs "
                             f"({self.TB} steps each), {T} steps x {cfg.directions} direction(s) of {B} "
                             f"recurrent {H}x{N} products", self.node)
        self.ap = self._scratch("ap", self.MP * I_ * MR) if self.f32 else ""
        self.xw = self._scratch("xw", self.MP * MR * NPAD)
        self.h = self._scratch("h", B * H)
        self.c = self._scratch("c", B * H)
        self.tmp = self._scratch("gt", 2 * H)  # GRU: r * h, or h Rh^T + Rbh
        self.bias = self._scratch("bias", N + H)
        self.len = kc.tmp("len")
        self.wp = self._scratch("wp", self.NP * I_ * NR) if self.wt.const is None and self.f32 else ""
        self.rt = self._scratch("rt", H * N) if self.r.const is None else ""
        self._lengths()
        for d in range(cfg.directions):
            self._direction(d)

    def _lengths(self) -> None:
        kc, w, cfg = self.kc, self.w, self.cfg
        B, T = cfg.batch, cfg.seq
        w.line(f"long {self.len}[{B}];")
        b = kc.tmp("b")
        if self.lens is None:
            w.line(f"for (long {b} = 0; {b} < {B}; ++{b}) {self.len}[{b}] = {T};")
            return
        flag = kc.fault(self.node, sequence_lens_message(self.node, T))
        src = kc.ptr(self.lens)
        with w.block(f"for (long {b} = 0; {b} < {B}; ++{b})"):
            w.line(f"const long l = (long){src}[{b}];")
            w.line(f"{flag} |= l < 0 || l > {T};")
            w.line(f"{self.len}[{b}] = l < 0 ? 0 : (l > {T} ? {T} : l);")

    def _pack_x(self, t0: str, rows: str) -> None:
        """X rows (t0 + m / B, m % B), m < rows, into MR-row panels, k-major; padding rows zero."""
        kc, w = self.kc, self.w
        I_, MR = self.cfg.input_size, self.MR
        x = kc.ptr(self.x)
        m, k = kc.tmp("m"), kc.tmp("k")
        w.line(f"memset({self.ap}, 0, sizeof(float) * {self.MP * I_ * MR});")
        with w.block(f"for (long {m} = 0; {m} < {rows}; ++{m})"):
            w.line(f"const float* restrict xr = {x} + ({self._x_row(t0, m)}) * {I_};")
            w.line(f"float* restrict dst = {self.ap} + ({m} / {MR}) * {I_ * MR} + {m} % {MR};")
            w.line(f"for (long {k} = 0; {k} < {I_}; ++{k}) dst[{k} * {MR}] = xr[{k}];")

    def _x_row(self, t0: str, m: str) -> str:
        """The row of X (flattened to rows of I) of time step ``t0 + m / B`` and batch entry ``m % B``."""
        T, B = self.cfg.seq, self.cfg.batch
        if self.cfg.layout == 0:
            return f"{t0} * {B} + {m}"
        return f"({m} % {B}) * {T} + {t0} + {m} / {B}"

    def _bias(self, d: int) -> None:
        w, cfg, N, H = self.w, self.cfg, self.N, self.cfg.hidden
        n = self.kc.tmp("n")
        lbr = cfg.op == "GRU" and cfg.linear_before_reset
        if self.b is None:
            w.line(f"for (long {n} = 0; {n} < {N + H}; ++{n}) {self.bias}[{n}] = 0.0f;")
            return
        bp = self.kc.ptr(self.b)
        wb, rb = f"{bp}[{d * 2 * N} + {n}]", f"{bp}[{d * 2 * N + N} + {n}]"
        if lbr:  # the candidate's Rbh stays inside the reset product: kept at bias[N:]
            # Two loops, not ``n < 2H ? wb + rb : wb``: no load under a condition (issue 13, ``_project``).
            w.line(f"for (long {n} = 0; {n} < {2 * H}; ++{n}) {self.bias}[{n}] = {wb} + {rb};")
            w.line(f"for (long {n} = {2 * H}; {n} < {N}; ++{n}) {self.bias}[{n}] = {wb};")
            w.line(f"for (long {n} = 0; {n} < {H}; ++{n}) {self.bias}[{N} + {n}] = "
                   f"{bp}[{d * 2 * N + N + 2 * H} + {n}];")
        else:
            w.line(f"for (long {n} = 0; {n} < {N}; ++{n}) {self.bias}[{n}] = {wb} + {rb};")

    def _direction(self, d: int) -> None:
        kc, w, cfg = self.kc, self.w, self.cfg
        T, B, H, NPAD = cfg.seq, cfg.batch, cfg.hidden, self.NPAD
        w.line(f"/* direction {d}: {'reverse' if cfg.is_reverse(d) else 'forward'} */")
        self._bias(d)
        wp = self._packed_w(d)
        rt = self._transposed_r(d)
        b, j = kc.tmp("b"), kc.tmp("j")
        states = ((self.h, self.h0), (self.c, self.c0)) if cfg.op == "LSTM" else ((self.h, self.h0),)
        for state, src in states:
            val = f"{kc.ptr(src)}[{self._state_index(d, b, j)}]" if src is not None else "0.0f"
            with w.block(f"for (long {b} = 0; {b} < {B}; ++{b})"):
                w.line(f"for (long {j} = 0; {j} < {H}; ++{j}) {state}[{b} * {H} + {j}] = {val};")
        TB = self.TB
        s0, steps, t0 = kc.tmp("s0"), kc.tmp("steps"), kc.tmp("t0")
        with w.block(f"for (long {s0} = 0; {s0} < {T}; {s0} += {TB})"):
            # The block's steps, and its first time index: forward t0 = s0, reverse the block
            # ends at T - s0.
            w.line(f"const long {steps} = {T} - {s0} < {TB} ? {T} - {s0} : {TB};")
            w.line(f"const long {t0} = {f'{T} - {s0} - {steps}' if cfg.is_reverse(d) else s0};")
            self._project(d, wp, t0, steps)
            s, t = kc.tmp("s"), kc.tmp("t")
            y = self.outs[0]
            with w.block(f"for (long {s} = 0; {s} < {steps}; ++{s})"):
                w.line(f"const long {t} = {f'{t0} + {steps} - 1 - {s}' if cfg.is_reverse(d) else f'{t0} + {s}'};")
                with w.block(f"for (long {b} = 0; {b} < {B}; ++{b})"):
                    with w.block(f"if ({t} >= {self.len}[{b}])"):
                        if y is not None:
                            yp = kc.ptr(y, write=True)
                            w.line(f"for (long {j} = 0; {j} < {H}; ++{j}) "
                                   f"{yp}[{self._y_index(d, t, b, j)}] = 0.0f;")
                        w.line("continue;")
                    g, hb = kc.tmp("g"), kc.tmp("hb")
                    w.line(f"{self.ct}* restrict {g} = {self.xw} + (({t} - {t0}) * {B} + {b}) * {NPAD};")
                    w.line(f"{self.ct}* restrict {hb} = {self.h} + {b} * {H};")
                    self._cell(d, g, hb, rt, t, b)
        for k, state in ((1, self.h), (2, self.c)):
            out = self.outs[k]
            if out is None:
                continue
            op = kc.ptr(out, write=True)
            with w.block(f"for (long {b} = 0; {b} < {B}; ++{b})"):
                w.line(f"for (long {j} = 0; {j} < {H}; ++{j}) {op}[{self._state_index(d, b, j)}] = "
                       f"{self.len}[{b}] > 0 ? {state}[{b} * {H} + {j}] : 0.0f;")

    def _project(self, d: int, wp: str, t0: str, steps: str) -> None:
        """XW rows (t, b) of the block's steps ``t0 .. t0 + steps - 1``: the bias, plus X W^T."""
        kc, w, cfg = self.kc, self.w, self.cfg
        B, I_, N = cfg.batch, cfg.input_size, self.N
        MR, NR, NPAD = self.MR, self.NR, self.NPAD
        rows, m, n = kc.tmp("rows"), kc.tmp("m"), kc.tmp("n")
        w.line(f"const long {rows} = {steps} * {B};")
        # The bias, then zeros to the padded width: two loops, no load under a condition (``n < N ? bias[n] : 0``
        # was vectorised by gcc 12.2 -O3 into masked loads, the form that returned other memory in the Pad and
        # the pools: issue 13, tests/e2e/test_guarded_loads.py).
        with w.block(f"for (long {m} = 0; {m} < {self.MP * MR}; ++{m})"):
            w.line(f"for (long {n} = 0; {n} < {N}; ++{n}) {self.xw}[{m} * {NPAD} + {n}] = {self.bias}[{n}];")
            if NPAD > N:
                w.line(f"for (long {n} = {N}; {n} < {NPAD}; ++{n}) {self.xw}[{m} * {NPAD} + {n}] = 0.0f;")
        mp, np_ = kc.tmp("mp"), kc.tmp("np")
        if self.f32:
            self._pack_x(t0, rows)
            kc.parallel_for(2 * self.M * N * I_)
            with w.block(f"for (long {mp} = 0; {mp} < ({rows} + {MR - 1}) / {MR}; ++{mp})"):
                w.line(f"for (long {np_} = 0; {np_} < {self.NP}; ++{np_}) {self.ukr}({I_}, "
                       f"{self.ap} + {mp} * {I_ * MR}, {wp} + {np_} * {I_ * NR}, "
                       f"{self.xw} + {mp} * {MR * NPAD} + {np_} * {NR}, {NPAD});")
            return
        # float64: XW[m, n] += sum_k X[row m, k] W[d, n, k], reading both in place.
        k, acc = kc.tmp("k"), kc.tmp("acc")
        kc.parallel_for(2 * self.M * N * I_)
        with w.block(f"for (long {mp} = 0; {mp} < {rows}; ++{mp})"):
            w.line(f"const {self.ct}* restrict xr = {kc.ptr(self.x)} + ({self._x_row(t0, mp)}) * {I_};")
            with w.block(f"for (long {np_} = 0; {np_} < {N}; ++{np_})"):
                w.line(f"const {self.ct}* restrict wr = {wp} + {d * N * I_} + {np_} * {I_};")
                w.line(f"{self.ct} {acc} = {self.xw}[{mp} * {NPAD} + {np_}];")
                w.line(f"for (long {k} = 0; {k} < {I_}; ++{k}) {acc} += xr[{k}] * wr[{k}];")
                w.line(f"{self.xw}[{mp} * {NPAD} + {np_}] = {acc};")

    def _clip(self, v: str) -> None:
        c = self.cfg.clip
        if c is not None:
            lim = self._lit(c)
            self.w.line(f"{v} = {v} < -{lim} ? -{lim} : ({v} > {lim} ? {lim} : {v});")

    def _pre(self, expr: str) -> str:
        """A clipped pre-activation as a fresh variable."""
        v = self.kc.tmp("v")
        self.w.line(f"{self.ct} {v} = {expr};")
        self._clip(v)
        return v

    def _cell(self, d: int, g: str, hb: str, rt: str, t: str, b: str) -> None:
        kc, w, cfg = self.kc, self.w, self.cfg
        H, N = cfg.hidden, self.N
        prog = kc.program
        acts = cfg.activations[d]
        matvec = prog.require_helper(matvec_name(self.ct), matvec_text(prog.options.simd, self.ct))
        j = kc.tmp("j")
        y = self.outs[0]
        yp = kc.ptr(y, write=True) if y is not None else None

        def emit_y(hn: str) -> None:
            if yp is not None:
                w.line(f"{yp}[{self._y_index(d, t, b, j)}] = {hn};")

        if cfg.op == "RNN":
            w.line(f"{matvec}({H}, {N}, {hb}, {rt}, {N}, {g});")
            with w.block(f"for (long {j} = 0; {j} < {H}; ++{j})"):
                v = self._pre(f"{g}[{j}]")
                w.line(f"{hb}[{j}] = {activation_c(prog, acts[0], v, self.dt)};")
                emit_y(f"{hb}[{j}]")
            return
        if cfg.op == "GRU":
            gt = self.tmp
            w.line(f"{matvec}({H}, {2 * H}, {hb}, {rt}, {N}, {g});")
            with w.block(f"for (long {j} = 0; {j} < {2 * H}; ++{j})"):
                v = self._pre(f"{g}[{j}]")
                w.line(f"{g}[{j}] = {activation_c(prog, acts[0], v, self.dt)};")
            if cfg.linear_before_reset:
                w.line(f"for (long {j} = 0; {j} < {H}; ++{j}) {gt}[{j}] = {self.bias}[{N} + {j}];")
                w.line(f"{matvec}({H}, {H}, {hb}, {rt} + {2 * H}, {N}, {gt});")
                cand = f"{g}[{2 * H} + {j}] + {g}[{H} + {j}] * {gt}[{j}]"
            else:
                w.line(f"for (long {j} = 0; {j} < {H}; ++{j}) {gt}[{j}] = {g}[{H} + {j}] * {hb}[{j}];")
                w.line(f"{matvec}({H}, {H}, {gt}, {rt} + {2 * H}, {N}, {g} + {2 * H});")
                cand = f"{g}[{2 * H} + {j}]"
            with w.block(f"for (long {j} = 0; {j} < {H}; ++{j})"):
                v = self._pre(cand)
                hh, z = kc.tmp("hh"), kc.tmp("z")
                w.line(f"const {self.ct} {hh} = {activation_c(prog, acts[1], v, self.dt)};")
                w.line(f"const {self.ct} {z} = {g}[{j}];")
                w.line(f"{hb}[{j}] = (1.0f - {z}) * {hh} + {z} * {hb}[{j}];")
                emit_y(f"{hb}[{j}]")
            return
        # LSTM: gates i, o, f, c at columns 0, H, 2H, 3H; peepholes i, o, f.
        w.line(f"{matvec}({H}, {N}, {hb}, {rt}, {N}, {g});")
        cb = kc.tmp("cb")
        w.line(f"{self.ct}* restrict {cb} = {self.c} + {b} * {H};")
        pp = kc.ptr(self.p) if self.p is not None else None

        def peep(k: int, state: str) -> str:
            return f" + {pp}[{d * 3 * H + k * H} + {j}] * {state}" if pp is not None else ""

        with w.block(f"for (long {j} = 0; {j} < {H}; ++{j})"):
            cp = kc.tmp("cp")
            w.line(f"const {self.ct} {cp} = {cb}[{j}];")
            vi = self._pre(f"{g}[{j}]{peep(0, cp)}")
            i_, f_, c_, o_ = kc.tmp("i"), kc.tmp("f"), kc.tmp("cc"), kc.tmp("o")
            w.line(f"const {self.ct} {i_} = {activation_c(prog, acts[0], vi, self.dt)};")
            if cfg.input_forget:
                w.line(f"const {self.ct} {f_} = 1.0f - {i_};")
            else:
                vf = self._pre(f"{g}[{2 * H} + {j}]{peep(2, cp)}")
                w.line(f"const {self.ct} {f_} = {activation_c(prog, acts[0], vf, self.dt)};")
            vc = self._pre(f"{g}[{3 * H} + {j}]")
            w.line(f"const {self.ct} {c_} = {activation_c(prog, acts[1], vc, self.dt)};")
            cn = kc.tmp("cn")
            w.line(f"const {self.ct} {cn} = {f_} * {cp} + {i_} * {c_};")
            vo = self._pre(f"{g}[{H} + {j}]{peep(1, cn)}")
            w.line(f"const {self.ct} {o_} = {activation_c(prog, acts[0], vo, self.dt)};")
            hc = kc.tmp("hc")
            w.line(f"const {self.ct} {hc} = {cn};")
            w.line(f"{cb}[{j}] = {cn};")
            w.line(f"{hb}[{j}] = {o_} * {activation_c(prog, acts[2], hc, self.dt)};")
            emit_y(f"{hb}[{j}]")
