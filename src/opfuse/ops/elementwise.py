"""Elementwise and broadcast ops: activations, rounding, trigonometry, arithmetic, casts, BatchNorm.

Comparisons and logic (Equal, Greater, ..., And, Or, Xor, Not) are in ``logic``.

All of them are DNNFusion one-to-one ops. Unary ops are TVM ``ELEMWISE``; ops that
broadcast several inputs are ``BROADCAST``. ``flops_per_element`` is what one output element
costs the C backend, in operations: used only to rank fusions, never to judge correctness.
For the transcendental activations it is ``OPS_PER_ELEMENT`` below, measured on the
vectorised implementations (``codegen/vecmath.py``, ``codegen/erf.py``), not a guess of "a
few FLOPs": an exp costs about 7 operations' time, a softplus 46.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from opfuse.errors import InputError, UnsupportedOpError
from opfuse.ir.dtypes import BFLOAT16, FLOAT8S, is_floating
from opfuse.ir.graph import TensorType
from opfuse.ops.common import broadcast_shapes, out_type, same_type, shape_error
from opfuse.ops.registry import Category, Mapping, OpSpec, register

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """Exact (libm) erf, elementwise, in the input's dtype."""
    x = np.asarray(x)
    return np.asarray(_erf(x.astype(np.float64))).astype(x.dtype)


# ONNX's type constraints of the unary ops (bfloat16 computed in float32, ``registry.run_node``).
FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64)) | {BFLOAT16}
SIGNED = FLOATS | frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
NUMERIC = SIGNED | frozenset(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))


# Operations per element of the float32 code the C backend emits for each op, measured: the one-op kernel's
# time per element over 16K floats in cache (so compute-bound; 1 thread, CPU time, best of 15) times the host
# profile's float32 peak (``benchmarks/bench_epilogues.py --op-costs``), the unit the cost model divides by that
# peak. Load, store and loop control are in the figures (an Add measures 2.7-3.0 there, where its price is 1:
# the cheap ops are as fast as their loads). Measured after the explicit-SIMD chains (``simdchain.py``)
# and exp_nonpos's degree-6 polynomial, Zen 5 host at load 20-26 (two runs, the lower kept, rounded): the
# vector instructions per element (``--op-counts``) run about 2.4 to a cycle where the peak assumes one, so the
# counts this table held before (Sigmoid 40, Exp 31, Softplus 146) priced the transcendental ops 2.5-5x high.
OPS_PER_ELEMENT = {
    "HardSigmoid": 3,  # max, min and a multiply-add: as fast as an Add
    "HardSwish": 3,
    "Exp": 7,
    "Log": 16,  # vector form (``vecmath.opfuse_v16_logf``) since 2026-12-02 night: 0.62 -> 0.27 ns per element
    "Sigmoid": 8,  # exp_nonpos, one division, a select
    "Silu": 9,
    "Tanh": 14,  # both pieces (polynomial, exp_nonpos form) computed, one selected (17 with exp(2a)'s form)
    "Erf": 20,  # three polynomials computed, one selected
    "Gelu": 11,  # the erf form, ``codegen/gelu.py``'s polynomial (0.185 ns; 21.4 with 0.5 x (1 + erf), load 8)
    "GeluTanh": 15,  # Gelu(approximate="tanh"): x * sigmoid(2z)
    "Softplus": 46,  # exp, log and a division; a vector form since 2026-12-02 night (gcc's loop: 1.24 -> 0.76 ns)
    "Elu": 16,  # expm1: a polynomial and an exp, one selected
    "Selu": 19,
    "Celu": 16,
    "Mish": 17,  # one exp and a division
    "Sin": 40,  # not measured: libm call per element (the float64 reduction is counted)
    "Cos": 40,
}


# What an op costs in a compute-bound anchor's epilogue (Conv, MatMul: ``Category.OUT_ELEMWISE_FUSABLE``), as a
# multiple of the time the host profile streams its tensor once in and once out (the unfused kernel's memory time,
# ``2 x bytes / B``). Fused, the anchor's own arithmetic leaves the epilogue's nothing to hide behind: it adds to
# the kernel's time; unfused, it runs in its own kernel at max(its stream, its arithmetic). So whether fusing pays
# turns on this ratio (below 1 it does), and it is priced as one: as operations per element at the profile's peak
# (``OPS_PER_ELEMENT``, ns x 60 GFLOP/s) against the nominal 22 GB/s stream, Tanh's 17 came out below its stream
# (0.36 ns per element) where this host streams at ~41 GB/s (0.195 ns) and Tanh took 0.27: the planner fused
# Tanh, Gelu and Softplus, which measured 1-5% slower. Priced so, in the nominal stream's units, a refused fusion's
# predicted loss is overstated (by that ~1.9x) but the choice follows the measurement. Measured
# (``benchmarks/bench_epilogues.py``: Conv 1x1 32 -> 64 on 200x152 + each op, 1 thread, CPU time, medians of 31
# rounds each from cold caches, two runs at load 2-4, 2026-12-02; their mean, rounded): (fused - the same Conv with
# a Relu) / (unfused Relu's kernel). Ops not listed keep their FLOPs. The same ratio prices the op in a kernel
# without an anchor (``GroupAnalysis.arithmetic_stream_bytes``: the unfused side of the decision), where its own
# stream overlaps it: measured there the same way (the unfused build's kernel, ``bench_epilogues.py``'s ``alone``
# column, two runs at load 4-5 and 8): Tanh 1.69, 1.25, Gelu 2.29, 1.94, GeluTanh 1.43, 1.45, Softplus 4.03, 4.61,
# Sigmoid 1.03, 1.18 (its stream, a little more).
EPILOGUE_STREAM_RATIO = {
    "HardSwish": 0.25,  # 0.34, 0.18
    "Sigmoid": 0.6,  # 0.66, 0.58
    "Silu": 0.6,  # x / (1 + exp(-x)) (``CodegenOptions.silu_direct``): 0.54, 0.52, 0.67, 0.65 (2026-12-03, load 0.7-1)
    "Tanh": 1.25,  # exp_nonpos's form: 1.36, 1.11 at load 12 (before, exp(2a)'s: 1.37, 1.42)
    "Gelu": 0.9,  # gelu.py's table form in the micro-kernel: 0.48, 0.86, 1.19, 0.98 (2026-12-03, load 0.7-1;
    # the erf form, 0.5 x (1 + erf), measured 1.97, 1.94)
    "GeluTanh": 1.15,  # Gelu(approximate="tanh"), x * sigmoid(2z): 1.05, 1.27
    "Softplus": 4.3,  # its vector form: 4.1, 4.6 at load 9-10 (gcc's loop over the scalar helper before: 6.3, 7.4)
}


def epilogue_stream_ratio(node) -> float | None:
    """``EPILOGUE_STREAM_RATIO`` of ``node`` (Gelu's form by its ``approximate``), None for an op it does not list."""
    key = node.op_type
    if key == "Gelu" and node.attrs.get("approximate", "none") == "tanh":
        key = "GeluTanh"
    return EPILOGUE_STREAM_RATIO.get(key)


def _unary(name, fn, *, attrs=None, flops=1.0, flops_fn=None, tags=("activation",), dtypes=FLOATS, out_dtype=None):
    """A unary elementwise op ``y = fn(x, attrs)``, in ``x``'s dtype unless ``out_dtype`` says."""
    def compute(ins, a, node):
        x = ins[0]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # IEEE results (log 0 = -inf)
            return [np.asarray(fn(x, a)).astype(out_dtype or x.dtype, copy=False)]

    def infer(node, a):
        return same_type(node) if out_dtype is None else out_type(node.input(0).shape, out_dtype)

    register(OpSpec(name, Category.ELEMWISE, Mapping.ONE_TO_ONE, infer, compute,
                    attrs=dict(attrs or {}), flops_fn=flops_fn, flops_per_element=flops, dtypes=dtypes,
                    tags=frozenset(("unary",) + tuple(tags))))


def _sigmoid(x):
    # Split by sign so exp never overflows.
    x64 = x.astype(np.float64)
    out = np.empty_like(x64)
    pos = x64 >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x64[pos]))
    e = np.exp(x64[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def _softplus(x):
    x64 = x.astype(np.float64)
    return np.maximum(x64, 0) + np.log1p(np.exp(-np.abs(x64)))


def _gelu(x, a):
    x64 = x.astype(np.float64)
    if a["approximate"] == "tanh":
        return 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    if a["approximate"] != "none":
        raise UnsupportedOpError("Gelu", detail=f"approximate={a['approximate']!r}")
    return 0.5 * x64 * (1 + _erf(x64 / math.sqrt(2)).astype(np.float64))


def _hardsigmoid(x, alpha, beta):
    return np.clip(alpha * x.astype(np.float64) + beta, 0.0, 1.0)


_unary("Relu", lambda x, a: np.maximum(x, 0), dtypes=SIGNED)
_unary("LeakyRelu", lambda x, a: np.where(x >= 0, x, x * np.float32(a["alpha"])), attrs={"alpha": 0.01}, flops=2)
_unary("Sigmoid", lambda x, a: _sigmoid(x), flops=OPS_PER_ELEMENT["Sigmoid"])
_unary("HardSigmoid", lambda x, a: _hardsigmoid(x, a["alpha"], a["beta"]), attrs={"alpha": 0.2, "beta": 0.5},
       flops=OPS_PER_ELEMENT["HardSigmoid"])
_unary("HardSwish", lambda x, a: x.astype(np.float64) * _hardsigmoid(x, 1 / 6, 0.5),
       flops=OPS_PER_ELEMENT["HardSwish"])
_unary("Tanh", lambda x, a: np.tanh(x), flops=OPS_PER_ELEMENT["Tanh"])
_unary("Gelu", _gelu, attrs={"approximate": "none"},  # each form at its own price
       flops_fn=lambda node, a: OPS_PER_ELEMENT["GeluTanh" if a["approximate"] == "tanh" else "Gelu"]
       * sum(v.size for v in node.outputs))
_unary("Softplus", lambda x, a: _softplus(x), flops=OPS_PER_ELEMENT["Softplus"])
# SiLU is not an ONNX op; the recognition pass creates it from x * Sigmoid(x).
_unary("Silu", lambda x, a: x.astype(np.float64) * _sigmoid(x), flops=OPS_PER_ELEMENT["Silu"])
_unary("Erf", lambda x, a: erf(x), flops=OPS_PER_ELEMENT["Erf"], tags=(), dtypes=NUMERIC)
_unary("Exp", lambda x, a: np.exp(x), flops=OPS_PER_ELEMENT["Exp"], tags=())
_unary("Log", lambda x, a: np.log(x), flops=OPS_PER_ELEMENT["Log"], tags=())
_unary("Sqrt", lambda x, a: np.sqrt(x), flops=2, tags=())
_unary("Neg", lambda x, a: np.negative(x), tags=(), dtypes=SIGNED)
_unary("Abs", lambda x, a: np.abs(x), tags=(), dtypes=NUMERIC)
_unary("Reciprocal", lambda x, a: np.reciprocal(x), tags=())


# Activations with an exponential tail, all in float64 (expm1: no cancellation near 0).
def _elu(x, alpha):
    x64 = x.astype(np.float64)
    return np.where(x64 > 0, x64, alpha * np.expm1(x64))


def _mish(x):
    """x tanh(softplus(x))."""
    return x.astype(np.float64) * np.tanh(_softplus(x))


def _celu(x, alpha):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    x64 = x.astype(np.float64)
    return np.maximum(x64, 0) + np.minimum(0, alpha * np.expm1(x64 / alpha))


_unary("Elu", lambda x, a: _elu(x, a["alpha"]), attrs={"alpha": 1.0}, flops=OPS_PER_ELEMENT["Elu"])
# ONNX's defaults are the float32 roundings of SELU's constants.
_unary("Selu", lambda x, a: a["gamma"] * _elu(x, a["alpha"]),
       attrs={"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}, flops=OPS_PER_ELEMENT["Selu"])
_unary("Celu", lambda x, a: _celu(x, a["alpha"]), attrs={"alpha": 1.0}, flops=OPS_PER_ELEMENT["Celu"])
_unary("Mish", lambda x, a: _mish(x), flops=OPS_PER_ELEMENT["Mish"])
_unary("ThresholdedRelu", lambda x, a: np.where(x > a["alpha"], x, 0), attrs={"alpha": 1.0}, flops=2)
_unary("Softsign", lambda x, a: x.astype(np.float64) / (1 + np.abs(x.astype(np.float64))), flops=3)

# Rounding and sign.
_unary("Floor", lambda x, a: np.floor(x), tags=())
_unary("Ceil", lambda x, a: np.ceil(x), tags=())
_unary("Round", lambda x, a: np.round(x), tags=())  # halves to even, as ONNX
_unary("Sign", lambda x, a: np.sign(x), tags=(), dtypes=NUMERIC)

# Trigonometry (computed in float64, rounded once).
_unary("Sin", lambda x, a: np.sin(x.astype(np.float64)), tags=(), flops=OPS_PER_ELEMENT["Sin"])
_unary("Cos", lambda x, a: np.cos(x.astype(np.float64)), tags=(), flops=OPS_PER_ELEMENT["Cos"])
# The rest of the trigonometric and hyperbolic family (libm in C: rare in inference graphs).
for _name, _fn in (("Tan", np.tan), ("Asin", np.arcsin), ("Acos", np.arccos), ("Atan", np.arctan), ("Sinh", np.sinh),
                   ("Cosh", np.cosh), ("Asinh", np.arcsinh), ("Acosh", np.arccosh), ("Atanh", np.arctanh)):
    _unary(_name, lambda x, a, fn=_fn: fn(x.astype(np.float64)), tags=(), flops=OPS_PER_ELEMENT["Sin"])

# Classification of float values.
_BOOL = np.dtype(np.bool_)


def _isinf(x, a):
    return (np.isposinf(x) & bool(a["detect_positive"])) | (np.isneginf(x) & bool(a["detect_negative"]))


_unary("IsNaN", lambda x, a: np.isnan(x), tags=(), out_dtype=_BOOL)


# BitCast: the same bits read as another type of the same size.
def _bitcast_infer(node, a):
    x = node.input(0)
    try:
        dtype = _onnx_to_np(a["to"])
    except (KeyError, ValueError, TypeError):
        dtype = None
    if dtype not in CAST_TARGETS or dtype.itemsize != x.dtype.itemsize:
        raise UnsupportedOpError("BitCast", node.name, detail=f"to={a['to']}: a supported type of {x.dtype}'s size "
                                                              f"({x.dtype.itemsize} bytes) is needed")
    return out_type(x.shape, dtype)


register(OpSpec("BitCast", Category.ELEMWISE, Mapping.ONE_TO_ONE, _bitcast_infer,
                lambda ins, a, node: [np.array(ins[0], order="C").view(_onnx_to_np(a["to"]))],
                attrs={"to": None}, flops_per_element=0, tags=frozenset({"unary"})))
_unary("IsInf", _isinf, attrs={"detect_negative": 1, "detect_positive": 1}, tags=(), out_dtype=_BOOL)


# Clip: bounds are optional inputs (opset >= 11) or attributes (older opsets).
def clip_bounds(ins, a):
    lo = ins[1] if len(ins) > 1 and ins[1] is not None else a.get("min")
    hi = ins[2] if len(ins) > 2 and ins[2] is not None else a.get("max")
    return lo, hi


def _clip(ins, a, node):
    x = ins[0]
    lo, hi = clip_bounds(ins, a)
    y = x
    if lo is not None:
        y = np.maximum(y, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        y = np.minimum(y, np.asarray(hi, dtype=x.dtype))
    return [np.asarray(y, dtype=x.dtype)]


register(OpSpec("Clip", Category.ELEMWISE, Mapping.ONE_TO_ONE, lambda n, a: same_type(n), _clip,
                num_inputs=(1, 3), attrs={"min": None, "max": None}, flops_per_element=2,
                tags=frozenset({"unary", "activation"})))


# Cast ----------------------------------------------------------------------------------
# Element types opfuse computes with. Casting to others (float4, float8e8m0, int4, ...) through
# NumPy extension types would silently ignore ONNX's saturation and rounding rules; bfloat16 has
# neither (ml_dtypes rounds to nearest even and overflows to infinity, as ONNX's Cast does), and
# float8's saturation is applied here (``_cast``).
CAST_TARGETS = frozenset(np.dtype(t) for t in (
    np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)) | {BFLOAT16} | FLOAT8S


def _onnx_to_np(to) -> np.dtype:
    from onnx import helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))


def _cast_infer(node, a):
    from onnx import TensorProto
    try:
        dtype = _onnx_to_np(a["to"])
    except (KeyError, ValueError, TypeError):
        dtype = None
    if dtype not in CAST_TARGETS:
        name = TensorProto.DataType.Name(int(a["to"])) if int(a["to"]) in TensorProto.DataType.values() \
            else str(a["to"])
        raise UnsupportedOpError("Cast", node.name, detail=f"target element type {name} is not supported")
    return out_type(node.input(0).shape, dtype)


def float_to_int(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """Floats to the integer type ``to``, total: truncated toward zero, values beyond the type's range
    (infinities too) its nearest end, NaN 0. ONNX leaves a Cast of NaN or of an out-of-range float to
    an integer type undefined, and so do C (undefined behaviour: GCC may then fold ``(float)(uint8_t)x``
    to ``x`` in one kernel and not in another) and NumPy (the x86 conversion's 0x80000000, wrapped);
    opfuse defines it, in the reference and in C alike (``codegen.ctype.float_to_int_helper``), as
    the Arm FPU's conversion, WebAssembly's ``trunc_sat`` and Rust's ``as`` do."""
    info = np.iinfo(to)
    x = np.asarray(x)
    wide = x.astype(np.float64) if x.dtype.itemsize < 8 else x  # 2^63 and 2^64 are exact there
    with np.errstate(invalid="ignore"):
        low, high = wide <= float(info.min) - 1.0, wide >= float(info.max) + 1.0
        inside = ~(np.isnan(wide) | low | high)
        y = np.where(inside, wide, 0).astype(to)
    return np.where(low, info.min, np.where(high, info.max, y)).astype(to)


def _cast(ins, a, node):
    """``x.astype(to)``; a float to an integer type by ``float_to_int`` (NaN 0, beyond the range its
    nearest end); to a float8 type with ``saturate=1`` (the default), values beyond its range
    (infinities too) clamp to its largest finite value first, NaN staying NaN (ONNX's Cast, as
    ``onnx.numpy_helper.saturate_cast``); without, they overflow to infinity or NaN as the type has."""
    to = _onnx_to_np(a["to"])
    x = ins[0]
    if to in FLOAT8S and int(a["saturate"]):
        top = float(ml_dtypes.finfo(to).max)
        x = np.clip(x.astype(np.float64 if x.dtype == np.float64 else np.float32), -top, top)
    if to.kind in "iu" and is_floating(x.dtype):
        return [float_to_int(x, to)]
    return [x.astype(to)]


register(OpSpec("Cast", Category.ELEMWISE, Mapping.ONE_TO_ONE, _cast_infer, _cast,
                attrs={"to": 1, "saturate": 1, "round_mode": "up"}, flops_per_element=0, tags=frozenset({"unary"})))


# Identity and inference-mode Dropout (removed by the importer, kept here so any graph runs).
register(OpSpec("Identity", Category.ELEMWISE, Mapping.ONE_TO_ONE, lambda n, a: same_type(n),
                lambda ins, a, n: [ins[0].copy()], flops_per_element=0, tags=frozenset({"unary"})))


def _dropout_infer(node, a):
    t = node.input(0).type
    types = [TensorType(t.shape, t.dtype)]
    if len(node.outputs) > 1:
        types.append(TensorType(t.shape, np.bool_))
    return types


def _dropout(ins, a, node):
    outs = [ins[0].copy()]
    if len(node.outputs) > 1:
        outs.append(np.ones(ins[0].shape, dtype=np.bool_))
    return outs


register(OpSpec("Dropout", Category.ELEMWISE, Mapping.ONE_TO_ONE, _dropout_infer, _dropout,
                num_inputs=(1, 3), num_outputs=(1, 2), attrs={"ratio": 0.5, "seed": None},
                flops_per_element=0, tags=frozenset({"unary"})))


# Binary / n-ary broadcast ops ---------------------------------------------------------
def _broadcast_infer(dtype=None, *, one_type: bool = False):
    """Broadcast the inputs' shapes; with ``one_type`` every input must have the same dtype (ONNX's
    single type parameter ``T``: onnxruntime refuses ``Div(int32, float32)`` when it loads the model)."""
    def infer(node, a):
        ins = node.input_values()
        if one_type and any(v.dtype != ins[0].dtype for v in ins[1:]):
            raise shape_error(node, f"operand dtypes differ: {', '.join(str(v.dtype) for v in ins)}")
        shape = broadcast_shapes(node, *[v.shape for v in ins])
        return out_type(shape, dtype if dtype is not None else ins[-1 if node.op_type == "Where" else 0].dtype)
    return infer


def _binary(name, fn, *, flops=1.0, commutative=False, out_dtype=None, arity=(2, 2), with_node=False):
    def compute(ins, a, node):
        res = fn(*ins, node=node) if with_node else fn(*ins)
        dt = out_dtype if out_dtype is not None else ins[0].dtype
        return [np.asarray(res).astype(dt, copy=False)]

    tags = {"binary", "arith"} | ({"commutative"} if commutative else set())
    infer = _broadcast_infer(out_dtype, one_type=name != "Pow")  # Pow's exponent has its own type T1
    register(OpSpec(name, Category.BROADCAST, Mapping.ONE_TO_ONE, infer, compute,
                    num_inputs=arity, flops_per_element=flops, tags=frozenset(tags)))


def division_by_zero(node, what: str = "integer division by zero") -> InputError:
    return InputError(f"node '{node.name}' ({node.op_type}): {what}")


def _div(a, b, *, node):
    """``a / b``; for integers the quotient truncated toward zero, computed exactly (no float detour).

    Integer semantics, which every backend follows:

    * truncation toward zero, as ONNX, C99 and onnxruntime: ``-7 / 2 = -3``;
    * a zero divisor is an ``InputError`` naming the node (onnxruntime fails too; C would trap);
    * the one overflowing quotient, ``INT_MIN / -1``, wraps to ``INT_MIN`` (two's complement),
      where C would trap.
    """
    if not np.issubdtype(a.dtype, np.integer):
        return a / b
    a, b = np.broadcast_arrays(a, b)
    if np.any(b == 0):
        raise division_by_zero(node)
    with np.errstate(over="ignore"):  # INT_MIN // -1 wraps; NumPy would warn
        q = np.floor_divide(a, b)
        # floor and truncation differ when the remainder is non-zero and the signs differ
        q = q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
    return q


def _int_power(a: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``a ** e`` for integers and exponents >= 0, modulo 2^64 and then wrapped to ``a``'s type, by
    squaring (NumPy's power of an int32 and a uint64 goes through float64: INT_MIN for 3 ** (2^64 - 1))."""
    r = np.ones(a.shape, np.uint64)
    base = a.astype(np.uint64)
    e = e.astype(np.uint64)
    with np.errstate(over="ignore"):
        while np.any(e):
            r = np.where(e & np.uint64(1), r * base, r)
            base = base * base
            e = e >> np.uint64(1)
    return r.astype(a.dtype)


def _pow(a, b, *, node):
    """``a ** b``. A float base is computed in float64. An integer base with a negative integer
    exponent gives the truncated real result, as onnxruntime: ``1`` for base 1, ``+-1`` for base
    -1 (by the exponent's parity), ``0`` for any other base; base 0 is an integer division by
    zero (an ``InputError`` naming the node). Positive powers wrap like the C integer type."""
    if is_floating(a.dtype):
        return np.power(a.astype(np.float64), b.astype(np.float64))
    if not np.issubdtype(b.dtype, np.integer):
        return np.power(a, b)
    a, b = np.broadcast_arrays(a, b)
    neg = b < 0
    if np.any(neg & (a == 0)):
        raise division_by_zero(node, "integer 0 to a negative power (a division by zero)")
    pos = _int_power(a, np.where(neg, 0, b))
    if not np.any(neg):
        return pos
    odd = (b % 2) != 0
    small = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)).astype(a.dtype)
    return np.where(neg, small, pos)


_binary("Add", np.add, commutative=True)
_binary("Sub", np.subtract)
_binary("Mul", np.multiply, commutative=True)
_binary("Div", _div, with_node=True)
_binary("Pow", _pow, flops=4, with_node=True)
_binary("Max", lambda *xs: np.maximum.reduce(np.broadcast_arrays(*xs)) if len(xs) > 1 else xs[0],
        commutative=True, arity=(1, 2 ** 31))
_binary("Min", lambda *xs: np.minimum.reduce(np.broadcast_arrays(*xs)) if len(xs) > 1 else xs[0],
        commutative=True, arity=(1, 2 ** 31))
# Sum and Mean of any number of operands (left to right, as the C backend adds them).
_binary("Sum", lambda *xs: np.add.reduce([x.astype(np.float64) if x.dtype.kind == "f" else x
                                          for x in np.broadcast_arrays(*xs)]), commutative=True, arity=(1, 2 ** 31))
_binary("Mean", lambda *xs: np.add.reduce([x.astype(np.float64) for x in np.broadcast_arrays(*xs)]) / len(xs),
        commutative=True, arity=(1, 2 ** 31))


# PRelu: y = x for x >= 0, slope * x below; the slope broadcasts to x (one-directional).
def _prelu_infer(node, a):
    x, slope = node.input(0), node.input(1)
    if broadcast_shapes(node, x.shape, slope.shape) != x.shape:
        raise shape_error(node, f"slope of shape {slope.shape} does not broadcast to X {x.shape}")
    return same_type(node)


def _prelu(ins, a, node):
    x, slope = ins
    return [np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)]


register(OpSpec("PRelu", Category.BROADCAST, Mapping.ONE_TO_ONE, _prelu_infer, _prelu, num_inputs=(2, 2),
                flops_per_element=2, dtypes=SIGNED | NUMERIC, tags=frozenset({"binary", "activation"})))


def _mod(ins, a, node):
    """``fmod=0``: the remainder of the floored division, with the divisor's sign (Python's %);
    ``fmod=1``: of the truncated division, with the dividend's sign (C's fmod). A zero integer
    divisor is an ``InputError`` naming the node (as integer Div); a zero float divisor gives NaN."""
    x, y = ins
    if np.issubdtype(x.dtype, np.integer):
        if np.any(y == 0):
            raise division_by_zero(node, "integer modulo by zero")
        r = np.fmod(x, y) if int(a["fmod"]) else np.mod(x, y)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.fmod(x.astype(np.float64), y) if int(a["fmod"]) else np.mod(x.astype(np.float64), y)
    return [np.asarray(r).astype(x.dtype, copy=False)]


def _mod_infer(node, a):
    if int(a["fmod"]) not in (0, 1):
        raise UnsupportedOpError("Mod", node.name, detail=f"fmod={a['fmod']} (0 or 1)")
    return _broadcast_infer(one_type=True)(node, a)


register(OpSpec("Mod", Category.BROADCAST, Mapping.ONE_TO_ONE, _mod_infer, _mod, num_inputs=(2, 2),
                attrs={"fmod": 0}, flops_per_element=4, tags=frozenset({"binary", "arith"})))


def _where(ins, a, node):
    return [np.where(ins[0], ins[1], ins[2]).astype(ins[1].dtype, copy=False)]


def _where_infer(node, a):
    c, x, y = node.input(0), node.input(1), node.input(2)
    return out_type(broadcast_shapes(node, c.shape, x.shape, y.shape), x.dtype)


register(OpSpec("Where", Category.BROADCAST, Mapping.ONE_TO_ONE, _where_infer, _where,
                num_inputs=(3, 3), tags=frozenset({"ternary"})))


# BatchNormalization (inference): y = (x - mean) / sqrt(var + eps) * scale + bias, per channel.
def _bn(ins, a, node):
    x, scale, bias, mean, var = ins[:5]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # IEEE results (a negative variance: NaN)
        s = (scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + a["epsilon"])).reshape(shape)
        y = (x.astype(np.float64) - mean.reshape(shape)) * s + bias.reshape(shape)
    return [y.astype(x.dtype)]


def _bn_infer(node, a):
    if a.get("training_mode", 0):
        raise UnsupportedOpError("BatchNormalization", node.name, detail="training_mode=1")
    if len(node.outputs) != 1:
        raise UnsupportedOpError("BatchNormalization", node.name,
                                 detail="training outputs (running mean/var) are not supported")
    x = node.input(0)
    if len(x.shape) < 2:
        raise shape_error(node, f"X must be (N, C, ...), got shape {x.shape}")
    for i, what in enumerate(("scale", "B", "input_mean", "input_var"), start=1):
        if node.input(i).shape != (x.shape[1],):
            raise shape_error(node, f"{what} has shape {node.input(i).shape}, expected ({x.shape[1]},): one "
                                    f"value per channel of X {x.shape}")
    return same_type(node)


register(OpSpec("BatchNormalization", Category.BROADCAST, Mapping.ONE_TO_ONE, _bn_infer, _bn,
                num_inputs=(5, 5), num_outputs=(1, 3),
                attrs={"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0, "spatial": 1},
                flops_per_element=2, tags=frozenset({"normalization"})))
