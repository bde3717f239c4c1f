"""The fuzzer's cases: a random valid ONNX model, hostile inputs for it, and how to compile it.

A case starts as a float32 graph of ``random_graphs.graphs()`` (every op family, patterns
included) and may then be

* *retyped* to float64, or to an integer type (int8 to int64, uint8 to uint64) when it was
  drawn from the ops that take integers (``INTEGER_OPS``); float constants become the new type
  (integers scaled by ``INT_SCALE`` and rounded, divisors kept away from 0); shape operands,
  indices, masks and Resize's scales keep theirs;
* given *extra* nodes on drawn values: a Cast of an output, ``Where(Equal(a, b), a, b)``, a
  Cast in front of an integer input, and (integers) a Div or Mod by a raw graph input or a
  Gather with run-time indices, the ops that can fail at run time, and an integer op whose second
  operand is a raw input (``INT_OPS_BY_INPUT``: wrap-around, shifts, exponents over the whole range),
  and a constant operand an op also takes at run time made a graph input (``RUNTIME_OPERANDS``), and a
  float input quantized to an integer type and back as an imported QuantizeLinear -> DequantizeLinear
  pair is, or cast bare (NaN, infinities, values beyond the type: ``ops.elementwise.float_to_int``), and a
  QDQ model's 8-bit Conv, Gemm or MatMul, or a chain of two (``quantized_product``: what the fused build runs
  on the integer kernels; its 8-bit outputs are the case's ``quantized`` ones, within one step of the
  reference's, a chain's end within what one step of its middle moves it by);
* fed *hostile* inputs: ``normal`` (the generator's range, [-2, 2]; small integers), ``special``
  (that plus NaN, +-Inf, -0.0, subnormals; integers over their whole range with INT_MIN, INT_MAX,
  0, -1), ``extreme`` (that plus huge finite floats up to FLT_MAX, only for graphs made of ops
  that round each element once, ``EXTREME_SAFE_OPS``: a float32 sum of huge values overflows
  where the float64 reference does not, a float32 limit, not a bug);
* built with a *code-generation profile* (``fuzz_check.CODEGEN_PROFILES``, drawn from
  ``CODEGEN_DRAW``): the host's defaults or the size thresholds lowered (the kernels of large tensors
  on these small ones) two times in seven each, else the AVX2 kernels, the plain C99 build or the
  thresholds' kernels built with UBSan (undefined behaviour in the C is a crash).

Every model is checked by ``onnx.checker`` (full check, with type constraints) before use. All
choices are Hypothesis draws, so a failing case shrinks towards fewer nodes, float32, no extras
and normal inputs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from opfuse.errors import OpfuseError
from opfuse.ir.graph import Graph, Value
from opfuse.ops.builder import GraphBuilder
from opfuse.ops.registry import infer_node
from opfuse.testing.fuzz_check import QUANTIZED_STEPS
from opfuse.testing.random_graphs import ALL_OPS, DEFAULT_OPS, SEED_MAX, graphs

# Ops the generator can emit that ONNX (and opfuse) also define for integer tensors.
INTEGER_OPS = frozenset({
    "Relu", "Neg", "Abs", "Clip", "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Where",
    "ReduceSum", "ReduceMax", "ReduceMean", "MaxPool", "MatMul", "Gemm", "Reshape", "Flatten",
    "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather", "Expand", "Pad",
    "Tile", "Trilu", "DepthToSpace", "SpaceToDepth", "GatherElements", "GatherND", "ScatterElements", "ScatterND",
    "ReverseSequence", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal", "And", "Or", "Xor", "Not",
    "ArgMax", "ArgMin", "TopK", "OneHot", "Sign", "ReduceMin", "ReduceProd", "CumSum"})
INTEGER_TYPES = (np.int32, np.int64, np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64)
# Ops whose float32 C result is each element rounded once from the same float32 operands as
# the reference: huge finite inputs cannot make the two differ by more than rounding.
EXTREME_SAFE_OPS = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu", "Softplus", "Erf", "Exp",
    "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Clip", "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Where",
    "Equal", "Cast", "Round", "Identity", "ReduceMax", "MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze",
    "Unsqueeze", "Concat", "Split", "Slice", "Gather", "Expand", "Pad"})
MAX_PRODUCT_ELEMENTS = 4096  # a quantized product's output
INT_SCALE = 4  # float constants in [-2, 2] become integers in [-8, 8]
# Known failures left to their owners, each with its reproducer under tests/e2e/repro/: the
# generator steers clear of them so that a run finds what is new.
KNOWN_ISSUES: dict[str, str] = {
}
INPUT_MODES = ("normal", "special", "extreme")
THREADS_DRAW = (1, 2, 1, 2, 3)  # three threads on two cores: uneven splits of every parallel loop
# profiles drawn, by weight (``ubsan``: the thresholds' kernels built with UBSan)
CODEGEN_DRAW = ("default", "thresholds", "default", "thresholds", "avx2", "portable", "ubsan")
FLOAT_SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 1e-40, -1e-45, 1e-38)
FLOAT_HUGE = (1e4, -3e8, 1e20, -1e30, 3e38, -3.4028235e38, 3.4028235e38)
# Input roles the extras create; their values are drawn to mostly make sense.
DIVISOR, INDICES = "divisor", "indices"


@dataclass
class FuzzCase:
    """One generated case: the graph (inputs named as in ``feeds``), its inputs, and how to build it."""

    graph: Graph
    feeds: dict[str, np.ndarray]
    dtype: str                      # the graph's main element type
    inputs: str                     # input mode: normal | special | extreme
    planner: str = "auto"           # the fused build's planner: auto (cost model) | rules (maximal plan)
    threads: int = 1
    extras: list[str] = field(default_factory=list)
    codegen: str = "default"        # the builds' code-generation profile (``fuzz_check.CODEGEN_PROFILES``)
    # outputs of an 8-bit quantization of a float product (``quantized_product``) and how many steps from the
    # reference's is agreement: one (``fuzz_check.QUANTIZED_STEPS``), where the product lies at a rounding tie, or
    # more at the end of a chain of products (``quantized_steps``)
    quantized: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        ops = sorted({n.op_type for n in self.graph.nodes})
        extra = f", extras {'+'.join(self.extras)}" if self.extras else ""
        return (f"{len(self.graph.nodes)} nodes {ops}, {self.dtype}, {self.inputs} inputs, "
                f"planner {self.planner}, {self.threads} thread{'s' if self.threads > 1 else ''}{extra}"
                + (f", codegen {self.codegen}" if self.codegen != "default" else ""))


# Retyping -------------------------------------------------------------------------------------

def _const_as(node_op: str, index: int, data: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float32 constant of the float32 graph as the constant of the retyped one."""
    if data.dtype != np.float32 or (node_op == "Resize" and index in (1, 2)):
        return data  # shapes, axes, indices, masks; Resize's roi and scales stay float
    if dtype.kind == "f":
        return data.astype(dtype)
    if node_op == "Pow" and index == 1:
        return data.astype(dtype)  # the exponent (2 or 3) as is
    info = np.iinfo(dtype)
    scaled = np.round(data.astype(np.float64) * INT_SCALE)
    if node_op == "Div" and index == 1:  # generated divisors are >= 0.5 in magnitude: never 0
        scaled = np.where(scaled == 0, 1, np.abs(scaled) if info.min == 0 else scaled)
    return np.clip(scaled, info.min, info.max).astype(dtype)


def retype(graph: Graph, dtype) -> Graph:
    """A copy of a float32 graph computing in ``dtype`` (``_const_as`` converts its constants)."""
    dt = np.dtype(dtype)
    b = GraphBuilder(graph.name)
    env: dict[int, Value] = {}
    for x in graph.inputs:
        env[id(x)] = b.input(x.name, x.shape, dt if x.dtype == np.float32 else x.dtype)
    for n in graph.nodes:
        ins: list[Value | None] = []
        for i, u in enumerate(n.inputs):
            if u is None:
                ins.append(None)
            elif u.const is not None:
                ins.append(b.const(u.name, _const_as(n.op_type, i, u.const, dt)))
            else:
                ins.append(env[id(u)])
        attrs = dict(n.attrs)
        out = b.op(n.op_type, *ins, name=n.name, num_outputs=len(n.outputs), **attrs)
        for v, w in zip(n.outputs, out if isinstance(out, tuple) else (out,), strict=True):
            env[id(v)] = w
    b.graph.outputs = [env[id(v)] for v in graph.outputs]
    return b.graph


# Extras ---------------------------------------------------------------------------------------

CAST_TYPES = (np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_)


def _onnx_type(dtype) -> int:
    from onnx import helper
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _values(g: Graph) -> list[Value]:
    return [v for n in g.nodes for v in n.outputs] + list(g.inputs)


def _add(g: Graph, op_type: str, inputs: list[Value], index: int | None = None, *, node_name: str | None = None,
         **attrs) -> Value:
    """Add a node (at ``index``, default last; named after ``node_name``, its output too) with its output type
    inferred; its output."""
    node = g.add_node(op_type, inputs, attrs=attrs, index=index, name=node_name)
    for v, t in zip(node.outputs, infer_node(node), strict=True):
        v.type = t
    return node.outputs[0]


def _cast_output(draw, g: Graph) -> None:
    """Cast an output to another type: any from integers and bool; float to float only (float to an
    integer type truncates, so the rounding differences of a computed value near an integer, far inside
    the tolerance, become a difference of 1; float to bool turns those of a value near 0 into True/False;
    ``quantize_input`` casts floats the C code reads exactly as the reference does)."""
    v = draw(st.sampled_from(g.outputs))
    kinds = "f" if v.dtype.kind == "f" else "fbiu"
    to = draw(st.sampled_from([t for t in CAST_TYPES if np.dtype(t).kind in kinds and np.dtype(t) != v.dtype]))
    w = _add(g, "Cast", [v], to=_onnx_type(to))
    g.outputs = [w if u is v else u for u in g.outputs]


QUANT_TYPES = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)


def _quantize_input(draw, g: Graph) -> None:
    """A float graph input ``x`` (exact: the C code reads the very value the reference does) cast to an
    integer type, then back to float and scaled, as a QuantizeLinear -> DequantizeLinear pair is imported
    (``Div(s) -> Round -> Add(z) -> Clip -> Cast(T) -> Cast(float) -> Sub(z) -> Mul(s)``; ``T`` any integer
    type), or a bare ``Cast(T)``: NaN, infinities and values beyond ``T``'s range in the special and extreme
    input modes (opfuse defines those conversions, ``ops.elementwise.float_to_int``; a fused kernel had the
    conversion pair dropped by GCC). The integer tensor is an output too, sometimes."""
    floats = [v for v in g.inputs if v.dtype.kind == "f" and v.uses]
    assume(floats)
    x = draw(st.sampled_from(floats))
    to = np.dtype(draw(st.sampled_from(QUANT_TYPES)))
    ft = x.dtype
    if draw(st.booleans()):
        q = _add(g, "Cast", [x], to=_onnx_type(to))
        scale, zero = 1.0, 0
    else:
        info = np.iinfo(to)
        scale = draw(st.sampled_from((0.0107, 0.25, 1.0, 3.0)))
        zero = draw(st.integers(int(max(info.min, -200)), int(min(info.max, 200))))
        y = _add(g, "Div", [x, g.add_const("scale", np.array(scale, ft))])
        y = _add(g, "Add", [_add(g, "Round", [y]), g.add_const("zero", np.array(zero, ft))])
        lo, hi = (np.array(b, ft) for b in (info.min, info.max))  # the type's range as ft holds it
        if draw(st.booleans()):
            y = _add(g, "Clip", [y, g.add_const("lo", lo), g.add_const("hi", hi)])
        q = _add(g, "Cast", [y], to=_onnx_type(to))
    back = _add(g, "Cast", [q], to=_onnx_type(ft))
    dq = _add(g, "Mul", [_add(g, "Sub", [back, g.add_const("zero", np.array(zero, ft))]),
                         g.add_const("scale", np.array(scale, ft))])
    g.outputs.append(dq)
    if draw(st.booleans()):
        g.outputs.append(q)


# The 8-bit products ``quantized_product`` draws: scales (powers of two, whose float arithmetic is exact, and
# others), an input's float values over a few steps' range.
QUANT_SCALES = (0.0107, 0.04, 0.25, 1 / 64, 3.0)
EIGHT_BIT = (np.uint8, np.int8)
QUANT_MAX_OUT = 20  # output channels or columns (past the integer kernels' blocks of 8 and 16)
QUANTIZED_OUTPUT = "quantized_y"  # the name of each 8-bit output of ``quantized_product`` (``FuzzCase.quantized``)
QUANT_CHAIN = 3  # one quantized product in this many (of those quantized to 8 bits) feeds a second
QUANT_ACTIVATED = 3  # one quantized product in this many (not chained) has an activation before its quantization


def _quantize(g: Graph, x: Value, scale: float, zero: int, to, name: str | None = None) -> Value:
    """``QuantizeLinear(x, scale, zero)`` to the 8-bit ``to`` as the importer writes it:
    ``Div -> Round -> Add -> Clip -> Cast`` (the Cast named after ``name``)."""
    info = np.iinfo(to)
    y = _add(g, "Round", [_add(g, "Div", [x, g.add_const("scale", np.array(scale, np.float32))])])
    y = _add(g, "Add", [y, g.add_const("zero", np.array(zero, np.float32))])
    y = _add(g, "Clip", [y, g.add_const("lo", np.array(info.min, np.float32)),
                         g.add_const("hi", np.array(info.max, np.float32))])
    return _add(g, "Cast", [y], node_name=name, to=_onnx_type(to))


def _dequantize(g: Graph, q: Value, scale, zero) -> Value:
    """``DequantizeLinear`` as the importer writes it: ``Cast -> [Sub(zero)] -> Mul(scale)``, the parameters
    in a shape that broadcasts against ``q`` (one value, or one per index of an axis); zero None: no Sub."""
    y = _add(g, "Cast", [q], to=_onnx_type(np.float32))
    if zero is not None:
        y = _add(g, "Sub", [y, g.add_const("zero", np.asarray(zero, np.float32))])
    return _add(g, "Mul", [y, g.add_const("scale", np.asarray(scale, np.float32))])


def _weight_scales(draw, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """Per tensor (one value) or per output channel (``shape``: n along one axis) weight scales."""
    if draw(st.booleans()):
        return np.array(draw(st.sampled_from((0.003, 0.0078125, 0.011))), np.float32)
    seed = draw(st.integers(0, SEED_MAX))
    values: np.ndarray = np.random.default_rng(seed).uniform(0.002, 0.02, n)
    if draw(st.booleans()):
        values = 2.0 ** np.round(np.log2(values))  # powers of two: an exact float path
    return values.astype(np.float32).reshape(shape)


def _product(draw, g: Graph, xd: Value, xs: float) -> tuple[Value, float, float]:
    """A QDQ model's 8-bit product of the dequantized 8-bit ``xd`` (scale ``xs``): a Conv (1-D or 2-D,
    strided, padded, grouped or depthwise), Gemm (``transB``) or MatMul (a batch of matrices) with an int8 (or
    uint8, zero point 128) constant weight dequantized per tensor or per output channel, an optional int32 bias
    (scale ``xs * ws``), residual (an 8-bit input dequantized) and Relu. The float product, the output scale a
    quantization of it takes (a few dozen steps for a typical accumulator), and how many output steps one step
    of ``xd`` moves it by at most (the weight's largest sum of absolute steps over an output, times
    ``xs * ws / ys``)."""
    from opfuse.ops.quantized import fixed_point_multiplier
    rank = len(xd.shape)
    kind = draw(st.sampled_from(("Conv", "MatMul") if rank >= 3 else ("Gemm", "MatMul")))
    w_type = np.dtype(draw(st.sampled_from((np.int8, np.int8, np.uint8))))
    wz = 128 if w_type == np.uint8 else 0
    rng = np.random.default_rng(draw(st.integers(0, SEED_MAX)))
    attrs: dict = {}
    if kind == "Conv":
        cin, spatial = xd.shape[1], xd.shape[2:]
        group = draw(st.sampled_from([1, cin] + [d for d in range(2, cin) if cin % d == 0]))
        cout = group * draw(st.integers(1, max(1, QUANT_MAX_OUT // group))) if group > 1 else \
            draw(st.integers(1, QUANT_MAX_OUT))
        kernel = [draw(st.integers(1, min(3, n + 2))) for n in spatial]
        pads = [draw(st.integers(0, k - 1)) for k in kernel]
        pads = pads + [draw(st.integers(0, k - 1)) for k in kernel]
        dims_n = len(spatial)
        kernel = [min(k, n + pads[i] + pads[i + dims_n]) for i, (k, n) in enumerate(zip(kernel, spatial, strict=True))]
        attrs = dict(kernel_shape=kernel, pads=pads, strides=[draw(st.integers(1, 2)) for _ in spatial],
                     group=group)
        w_shape: tuple[int, ...] = (cout, cin // group, *kernel)
        n_out, per_shape, k_sum = cout, (cout,) + (1,) * (len(w_shape) - 1), int(np.prod(w_shape[1:]))
    else:
        k = xd.shape[-1]
        n_out = draw(st.integers(1, QUANT_MAX_OUT))
        trans_b = kind == "Gemm" and draw(st.booleans())
        if trans_b:
            attrs = dict(transB=1)
        w_shape = (n_out, k) if trans_b else (k, n_out)
        per_shape, k_sum = ((n_out, 1) if trans_b else (1, n_out)), k
    w_q = rng.integers(-127 if w_type == np.int8 else 0, 128 if w_type == np.int8 else 256, w_shape).astype(w_type)
    ws = _weight_scales(draw, n_out, per_shape)
    inputs = [xd, _dequantize(g, g.add_const("w_q", w_q), ws, np.array(wz, np.float32).reshape(
        (1,) * len(per_shape)) if ws.ndim else wz)]
    bias_scale = (np.float32(xs) * ws.reshape(-1)).astype(np.float32)
    bias = None
    if draw(st.booleans()):
        b_q = rng.integers(-3000, 3001, n_out).astype(np.int32)
        bias = _dequantize(g, g.add_const("b_q", b_q), bias_scale if bias_scale.size > 1 else bias_scale[0], None)
        if kind != "MatMul":
            inputs.append(bias)
    try:
        y = _add(g, kind, inputs, **attrs)
    except OpfuseError:
        assume(False)
        raise
    assume(y.size <= MAX_PRODUCT_ELEMENTS)
    if bias is not None and kind == "MatMul":
        y = _add(g, "Add", [y, bias])
    # a residual: an 8-bit tensor of the product's shape, dequantized
    if draw(st.booleans()):
        r_type = np.dtype(draw(st.sampled_from(EIGHT_BIT)))
        r = g.add_input(g.unique_name("quantized_residual"), y.shape, r_type)
        rs = draw(st.sampled_from(QUANT_SCALES))
        y = _add(g, "Add", [y, _dequantize(g, r, rs, draw(st.integers(-20, 20)) + (128 if r_type == np.uint8
                                                                                      else 0))])
    if draw(st.booleans()):
        y = _add(g, "Relu", [y])
    # the output scale: a few dozen steps for a typical accumulator (sqrt(k) products of ~70 x ~70 steps)
    typical = xs * float(np.mean(ws)) * np.sqrt(k_sum) * 70 * 70
    ys = typical / 40 * draw(st.sampled_from((0.25, 1.0, 4.0)))
    if draw(st.booleans()):  # a power of two: with such input and weight scales, products exactly at rounding ties
        ys = 2.0 ** round(np.log2(ys))
    ys = float(np.float32(ys))
    try:
        fixed_point_multiplier(xs * float(np.min(ws)) / ys)
        fixed_point_multiplier(xs * float(np.max(ws)) / ys)
    except OpfuseError:
        assume(False)
    # one step of xd moves output n's accumulator by at most sum_k |w_q[n, k] - wz| weight steps
    w_steps = np.abs(w_q.astype(np.int64) - wz)
    per_out = w_steps.reshape(n_out, -1).sum(axis=1) if kind == "Conv" or attrs.get("transB") else \
        w_steps.sum(axis=0)
    gain = float(np.max(per_out * ws.reshape(-1).astype(np.float64))) * xs / ys
    return y, ys, gain


def _quantized_product(draw, g: Graph) -> None:
    """A QDQ model's 8-bit product (``_product``), as ``opfuse quantize`` or onnxruntime's quantizer writes one,
    of a float32 input ``x`` quantized to uint8 or int8 and dequantized, then quantized to 8 bits (an output;
    one step apart where the float product lies at a rounding tie: ``FuzzCase.quantized``) or not (a float
    output); or a chain of two, the second reading the first's 8-bit output dequantized (``QUANT_CHAIN``: the
    fused build runs both on the integer kernels, the first's ``Requantize`` feeding the second's 8-bit
    input), through a QDQ MaxPool and a Flatten at times; its output within one step plus what one step of the
    first's moves it by: named
    ``QUANTIZED_OUTPUT`` + ``_within_<steps>``). The fused build runs the products on the integer kernels
    (``rules/integer_ops``), the unfused one in float; the export writes the weight's dequantization as a
    DequantizeLinear (``onnx_export.dequantize_chains``)."""
    shaped = [v for v in g.inputs if v.dtype == np.float32 and len(v.shape) in (2, 3, 4)
              and all(d >= 1 for d in v.shape)]
    if shaped and draw(st.booleans()):
        x = draw(st.sampled_from(shaped))
    else:  # (M, K), (N, C, L) or (N, C, H, W)
        rank = draw(st.sampled_from((2, 3, 4)))
        lead = (draw(st.integers(1, 2)),) if rank > 2 else ()
        wide = draw(st.sampled_from((8, 8, 24)))  # rows past 16 take the integer depthwise kernel's position vectors
        rest = tuple(draw(st.integers(1, wide)) for _ in range(rank - 1 - len(lead)))
        dims = lead + (draw(st.integers(1, 12)),) + rest
        x = g.add_input(g.unique_name("quantized_x"), dims, np.float32)
    act = np.dtype(draw(st.sampled_from(EIGHT_BIT)))
    xs = draw(st.sampled_from(QUANT_SCALES))
    info = np.iinfo(act)
    xz = draw(st.sampled_from((0, int(info.min) + 128, draw(st.integers(int(info.min), int(info.max))))))
    y, ys, _ = _product(draw, g, _dequantize(g, _quantize(g, x, xs, xz, act), xs, xz), xs)
    if draw(st.integers(0, 3)) == 0:  # a product read as float: its logits
        g.outputs.append(y)
        return
    out_type = np.dtype(draw(st.sampled_from(EIGHT_BIT)))
    yz = draw(st.integers(-10, 10)) + (128 if out_type == np.uint8 else 0)
    chain = draw(st.integers(0, QUANT_CHAIN - 1)) == 0
    if not chain and draw(st.integers(0, QUANT_ACTIVATED - 1)) == 0:
        # an activation the quantizer leaves in float between the product and its quantization (YOLO's SiLU):
        # the product is then the dequantized integer one (``integer_conv_dequantized``, ``_matmul_dequantized``),
        # the activation and the quantization in float after it; its slope is at most 1.5 (HardSwish's, near 3), so
        # float rounding before it still moves the 8-bit output by one step at most
        act = draw(st.sampled_from(("Sigmoid", "Tanh", "HardSwish", "SiLU")))
        y = _add(g, "Mul", [y, _add(g, "Sigmoid", [y])]) if act == "SiLU" else _add(g, act, [y])
    read = not chain or draw(st.booleans())  # the end of a chain, or its middle read too
    q = _quantize(g, y, ys, yz, out_type, QUANTIZED_OUTPUT if read else None)
    if read:
        g.outputs.append(q)
    if not chain:
        return
    # the second product reads the first's 8-bit output; its own 8-bit output is never left float (one step
    # of the first's moves a float output by more than the comparison's tolerance)
    mid = _dequantize(g, q, ys, yz)
    if len(mid.shape) == 4 and draw(st.booleans()):
        # a QDQ MaxPool between them: DQ -> MaxPool -> Q -> DQ at the one scale, exact (the 8-bit maximum), and
        # at most one step apart where its input is (a maximum moves by no more than its operands)
        k = draw(st.integers(1, min(2, *mid.shape[2:])))
        mid = _add(g, "MaxPool", [mid], kernel_shape=[k, k], strides=[draw(st.integers(1, 2))] * 2)
        mid = _dequantize(g, _quantize(g, mid, ys, yz, out_type), ys, yz)
    if len(mid.shape) >= 3 and draw(st.integers(0, 2)) == 0:  # flattened, as before a classifier's Gemm
        mid = _add(g, "Flatten", [mid], axis=1)
    y2, ys2, gain = _product(draw, g, mid, ys)
    steps = QUANTIZED_STEPS + int(np.ceil(gain * QUANTIZED_STEPS * (1 + 1e-6)))
    out_type = np.dtype(draw(st.sampled_from(EIGHT_BIT)))
    yz2 = draw(st.integers(-10, 10)) + (128 if out_type == np.uint8 else 0)
    g.outputs.append(_quantize(g, y2, ys2, yz2, out_type, f"{QUANTIZED_OUTPUT}_within_{steps}"))


def quantized_steps(name: str) -> int:
    """How many steps an 8-bit output of ``quantized_product`` named ``name`` may differ from the reference's:
    one (``QUANTIZED_STEPS``), or the ``_within_<steps>`` its name carries (the end of a chain)."""
    m = re.match(rf"{QUANTIZED_OUTPUT}_within_(\d+)", name)
    return int(m.group(1)) if m else QUANTIZED_STEPS


def _equal_where(draw, g: Graph) -> None:
    """``Where(Equal(a, b), a, b)`` for two values of one type and shape. Computed floats are only
    compared with themselves (false where NaN): two of them may differ by rounding alone."""
    a = draw(st.sampled_from(_values(g)))
    exact = a.dtype.kind != "f" or a.producer is None
    same = [v for v in _values(g) if v.shape == a.shape and v.dtype == a.dtype and (exact or v is a)]
    if exact:
        same = [v for v in same if v.dtype.kind != "f" or v.producer is None]
    b = draw(st.sampled_from(same))
    g.outputs.append(_add(g, "Where", [_add(g, "Equal", [a, b]), a, b]))


def _by_divisor_input(draw, g: Graph, op: str, **attrs) -> None:
    """``op(a, d)`` for an integer value ``a`` and a new input ``d`` (whose zeros the check must catch)."""
    ints = [v for v in _values(g) if v.dtype.kind in "iu"]
    assume(ints)
    a = draw(st.sampled_from(ints))
    d = g.add_input(g.unique_name(DIVISOR), a.shape, a.dtype)
    g.outputs.append(_add(g, op, [a, d], **attrs))


def _div_by_input(draw, g: Graph) -> None:
    """``a / d``."""
    _by_divisor_input(draw, g, "Div")


def _mod_by_input(draw, g: Graph) -> None:
    """``Mod(a, d)``, Python's % or C's fmod (the C code gave 0 for a zero divisor where the reference refuses it)."""
    _by_divisor_input(draw, g, "Mod", fmod=draw(st.sampled_from((0, 1))))


# Integer ops whose second operand the extra ``int_op_by_input`` takes from a raw input, over the
# input mode's whole range: wrap-around, shifts by negative or too many bits, negative and huge
# exponents, bit patterns with the sign bit (each op's C form against the reference's).
INT_OPS_BY_INPUT: dict[str, tuple[dict, ...]] = {
    "Add": ({},), "Sub": ({},), "Mul": ({},), "Max": ({},), "Min": ({},), "Pow": ({},),
    "BitShift": ({"direction": "LEFT"}, {"direction": "RIGHT"}),
    "BitwiseAnd": ({},), "BitwiseOr": ({},), "BitwiseXor": ({},),
}
INT_UNARY_OPS = ("BitwiseNot", "Neg", "Abs", "Sign")


def _int_op_by_input(draw, g: Graph) -> None:
    """``op(a, y)`` for an integer value ``a`` (or ``y op a``) and a new input ``y``, or a unary
    integer op of ``a``; the ONNX checker refuses what a schema does not take (BitShift on signed)."""
    ints = [v for v in _values(g) if v.dtype.kind in "iu"]
    assume(ints)
    a = draw(st.sampled_from(ints))
    if draw(st.integers(0, 3)) == 0:
        op, attrs, pair = draw(st.sampled_from(INT_UNARY_OPS)), {}, [a]
    else:
        op = draw(st.sampled_from(sorted(INT_OPS_BY_INPUT)))
        attrs = draw(st.sampled_from(INT_OPS_BY_INPUT[op]))
        # the input broadcasts against a: its own shape, a trailing piece of it, or a scalar
        shape = a.shape[draw(st.integers(0, len(a.shape))):]
        y = g.add_input(g.unique_name("operand"), shape, a.dtype)
        pair = [a, y] if op in ("Pow", "BitShift") or draw(st.booleans()) else [y, a]
    try:
        g.outputs.append(_add(g, op, pair, **attrs))
    except OpfuseError:  # the op does not take a's type (Neg of uint8, ...)
        assume(False)


def _gather_by_input(draw, g: Graph) -> None:
    """``Gather(a, i, axis)`` with run-time indices ``i`` (some may be out of range)."""
    ranked = [v for v in _values(g) if v.shape]
    assume(ranked)
    a = draw(st.sampled_from(ranked))
    axis = draw(st.integers(0, len(a.shape) - 1))
    idx_type = draw(st.sampled_from((np.int64, np.int32)))
    i = g.add_input(g.unique_name(f"{INDICES}_{a.shape[axis]}"), (draw(st.integers(1, 3)),), idx_type)
    g.outputs.append(_add(g, "Gather", [a, i], axis=axis - len(a.shape) if draw(st.booleans()) else axis))


def _cast_input(draw, g: Graph) -> None:
    """An integer input becomes ``Cast(x)`` of an input of another integer type (or bool)."""
    ints = [v for v in g.inputs if v.dtype.kind in "iu" and v.uses]
    assume(ints)
    x = draw(st.sampled_from(ints))
    src = draw(st.sampled_from([t for t in CAST_TYPES if np.dtype(t).kind in "iub" and np.dtype(t) != x.dtype]))
    raw = g.add_input(g.unique_name(f"{x.name}_raw"), x.shape, src)
    cast = _add(g, "Cast", [raw], index=0, to=_onnx_type(x.dtype))
    g.replace_all_uses(x, cast)
    g.inputs.remove(x)
    del g.values[x.name]


# Operands opfuse takes at run time as well as constant: (op, input positions). Shapes, axes,
# pads, K and the like must stay constants (opfuse compiles static shapes) and are not listed.
RUNTIME_OPERANDS: dict[str, tuple[int, ...]] = {
    "Gather": (1,), "GatherElements": (1,), "GatherND": (1,), "ScatterElements": (1, 2), "ScatterND": (1, 2),
    "ReverseSequence": (1,), "Trilu": (1,), "OneHot": (0, 2), "RoiAlign": (1, 2), "GridSample": (1,),
    "MaxUnpool": (1,), "DeformConv": (1, 2, 3, 4), "Where": (0, 1, 2), "Clip": (1, 2), "PRelu": (1,),
    "MatMul": (0, 1), "Gemm": (0, 1, 2), "Conv": (1, 2), "ConvTranspose": (1, 2),
    "BatchNormalization": (1, 2, 3, 4), "LayerNormalization": (1, 2), "Pad": (2,),
    "Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1), "Div": (0, 1), "Pow": (0, 1), "Max": (0, 1), "Min": (0, 1),
    "Mod": (0, 1), "Sum": (0, 1, 2), "Mean": (0, 1, 2), "Concat": (0, 1, 2), "Equal": (0, 1), "Greater": (0, 1),
    "Less": (0, 1), "LSTM": (1, 2, 3, 4, 5, 6, 7), "GRU": (1, 2, 3, 4, 5), "RNN": (1, 2, 3, 4, 5),
}
RUNTIME = "runtime"  # the name prefix of a constant made a graph input (``hostile_inputs`` feeds its value)


def _const_as_input(draw, g: Graph) -> dict[str, np.ndarray]:
    """A constant operand an op also takes at run time (``RUNTIME_OPERANDS``: indices, lengths, k,
    boxes, grids, weights, bounds, ...) becomes a graph input fed with the constant's value, in
    ``special`` and ``extreme`` modes sometimes with one element made hostile (``hostile_inputs``):
    the C code's run-time path of each such operand against the reference's."""
    spots = [(n, i) for n in g.nodes for i in RUNTIME_OPERANDS.get(n.op_type, ())
             if i < len(n.inputs) and getattr(n.inputs[i], "const", None) is not None]
    assume(spots)
    node, i = draw(st.sampled_from(spots))
    c = node.input(i)
    assert c.const is not None
    x = g.add_input(g.unique_name(f"{RUNTIME}_{c.name}"), c.shape, c.dtype)
    g.set_input(node, i, x)
    g.remove_unused_values()
    return {x.name: np.array(c.const)}


# Each adds nodes or inputs to the graph; a few return fixed values for their new inputs.
Extra = Callable[..., "dict[str, np.ndarray] | None"]
EXTRAS: dict[str, Extra] = {"cast_output": _cast_output, "equal_where": _equal_where, "div_by_input": _div_by_input,
          "mod_by_input": _mod_by_input, "gather_by_input": _gather_by_input, "cast_input": _cast_input,
          "int_op_by_input": _int_op_by_input, "const_as_input": _const_as_input,
          "quantize_input": _quantize_input, "quantized_product": _quantized_product}
INTEGER_EXTRAS = ("div_by_input", "mod_by_input", "cast_input", "int_op_by_input")


# Inputs ---------------------------------------------------------------------------------------

def hostile_inputs(graph: Graph, mode: str, seed: int,
                   fixed: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Inputs for ``graph`` in input ``mode`` (see the module docstring), seeded; the inputs named in
    ``fixed`` (constants made inputs) get its values, outside ``normal`` mode sometimes one element
    changed: NaN for floats, an integer type's extremes or -1 or one past the largest value for
    integers (an index or a length out of range)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    fixed = fixed or {}
    for v in graph.inputs:
        if v.name in fixed:
            a = np.array(fixed[v.name], dtype=v.dtype)
            if mode != "normal" and a.size and rng.random() < 0.5:
                flat = a.reshape(-1)
                if a.dtype.kind == "f":
                    flat[rng.integers(a.size)] = np.nan
                elif a.dtype.kind in "iu":
                    info = np.iinfo(a.dtype)
                    top = int(flat.max())
                    picks = [info.min, info.max, max(info.min, -1), min(info.max, top + 1)]
                    flat[rng.integers(a.size)] = picks[rng.integers(len(picks))]
            feeds[v.name] = a
        elif v.dtype == np.bool_:  # first: a role's input cast from bool (``_cast_input``) keeps the role's name
            feeds[v.name] = rng.random(v.shape) < 0.5
        elif v.name.startswith(INDICES):  # mostly in [-dim, dim), sometimes just outside
            dim = int(v.name[len(INDICES) + 1:].split("_")[0])
            a = rng.integers(-dim, dim, v.shape)
            if rng.random() < 0.2:
                a.reshape(-1)[rng.integers(a.size)] = rng.choice([dim, -dim - 1, dim + 7])
            feeds[v.name] = a.astype(v.dtype)
        elif v.name.startswith(DIVISOR):  # mostly non-zero
            a = _integers(rng, v.dtype, mode, v.shape)
            a = np.where(a == 0, 1, a).astype(v.dtype)
            if rng.random() < 0.2:
                a.reshape(-1)[rng.integers(a.size)] = 0
            feeds[v.name] = a
        elif v.dtype.kind in "iu":
            feeds[v.name] = _integers(rng, v.dtype, mode, v.shape)
        else:
            feeds[v.name] = _floats(rng, v.dtype, mode, v.shape)
    return feeds


def _integers(rng, dtype, mode: str, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    if mode == "normal":
        return rng.integers(max(info.min, -8), 9, shape).astype(dtype)
    a = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    flat = a.reshape(-1)
    picks = rng.random(flat.size) < 0.3
    flat[picks] = rng.choice(np.array([info.min, info.max, 0, 1, max(info.min, -1)], dtype=dtype), picks.sum())
    return a


def _floats(rng, dtype, mode: str, shape) -> np.ndarray:
    a = rng.uniform(-2.0, 2.0, shape)
    if mode != "normal":
        flat = a.reshape(-1)
        picks = rng.random(flat.size) < 0.15
        pool = FLOAT_SPECIALS + (FLOAT_HUGE if mode == "extreme" else ())
        flat[picks] = rng.choice(np.array(pool), picks.sum())
    with np.errstate(over="ignore"):
        return a.astype(dtype)


# The strategy ---------------------------------------------------------------------------------

def _valid_onnx(graph: Graph) -> bool:
    import onnx

    from opfuse.frontend.onnx import export_model
    try:
        onnx.checker.check_model(export_model(graph), full_check=True)
    except Exception:  # noqa: BLE001  # onnx's checker raises several types; any means invalid
        return False
    return True


def _retyped(graph: Graph, dtype) -> Graph:
    """``retype``, or a rejected draw where an op does not take ``dtype`` (Relu on uint8, ...)."""
    try:
        return retype(graph, dtype)
    except OpfuseError:
        assume(False)
        raise AssertionError("unreachable") from None


@st.composite
def fuzz_cases(draw, ops: Iterable[str] = DEFAULT_OPS, max_nodes: int = 24) -> FuzzCase:
    """A strategy of ``FuzzCase``: see the module docstring."""
    ops = frozenset(ops)
    int_ops = ops & INTEGER_OPS
    kinds = ["float32", "float64"] + (["integer"] if int_ops & ALL_OPS else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "integer":
        graph = _retyped(draw(graphs(max_nodes, int_ops, patterns=False)), draw(st.sampled_from(INTEGER_TYPES)))
    else:
        graph = draw(graphs(max_nodes, ops))
        if kind == "float64":
            graph = _retyped(graph, np.float64)
    main = graph.outputs[0].dtype.name
    extras = [name for name in EXTRAS
              if (name not in INTEGER_EXTRAS or kind == "integer") and draw(st.integers(0, 5)) == 5]
    fixed: dict[str, np.ndarray] = {}
    for name in extras:
        fixed.update(EXTRAS[name](draw, graph) or {})
    graph.verify()
    assume(_valid_onnx(graph))
    op_types = {n.op_type for n in graph.nodes}
    modes = list(INPUT_MODES if op_types <= EXTREME_SAFE_OPS or kind == "integer" else INPUT_MODES[:2])
    mode = draw(st.sampled_from(modes))
    feeds = hostile_inputs(graph, mode, draw(st.integers(0, SEED_MAX)), fixed)
    quantized = {v.name: quantized_steps(v.name) for v in graph.outputs if v.name.startswith(QUANTIZED_OUTPUT)}
    return FuzzCase(graph, feeds, main, mode, draw(st.sampled_from(("auto", "rules"))),
                    draw(st.sampled_from(THREADS_DRAW)), extras, draw(st.sampled_from(CODEGEN_DRAW)), quantized)
