"""Elementwise rules by dtype: float64 takes libm's double functions (not the float32 helpers), float32 the float
ones (never a double function or a double constant), and int64 values beyond 2^53 stay exact through a fold's
temporaries (never through a double)."""
from __future__ import annotations

import re

import numpy as np

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.ir.plan import FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

# libm's double functions the elementwise rules call for float64 (``rules._vec``, ``_libm_call``, ``_expm1``, ...)
DOUBLE_CALL = re.compile(r"\b(exp|expm1|log|tanh|erf|tan|sinh|cosh|asin|acos|atan|asinh|acosh|atanh)\(")


def test_erf_and_gelu_of_doubles_use_the_double_functions(cache_dir):
    """Erf and Gelu (erf form) over float64 against the reference within 1e-13: the float32 helper, or a libm call
    of another name, would be ~1e-7 off or not compile."""
    b = GraphBuilder("erf_wide")
    d = b.input("d", (4, 33), np.float64)
    g = b.build(b.op("Erf", d, name="erf"), b.op("Gelu", d, name="gelu"))
    feeds = {"d": np.random.default_rng(3).uniform(-4.0, 4.0, (4, 33))}
    got, want = build(g, None, cache_dir=cache_dir).run(feeds), reference.run(g, feeds)
    for name in ("erf", "gelu"):
        assert got[name].dtype == np.float64, name
        assert np.allclose(got[name], want[name], rtol=1e-13, atol=1e-15), name


def test_max_min_sum_of_int64_beyond_2_53_are_exact(cache_dir):
    """Max, Min and Sum of three int64 inputs near 2^61 (odd low bits): every partial result is an int64
    temporary; a double one would drop the low bits."""
    b = GraphBuilder("fold_wide")
    xs = [b.input(n, (2, 9), np.int64) for n in "abc"]
    g = b.build(b.op("Max", *xs, name="max"), b.op("Min", *xs, name="min"), b.op("Sum", *xs, name="sum"))
    rng = np.random.default_rng(11)
    feeds = {n: (rng.integers(-(1 << 61), 1 << 61, (2, 9)) | 1).astype(np.int64) for n in "abc"}
    got, want = build(g, None, cache_dir=cache_dir).run(feeds), reference.run(g, feeds)
    for name in ("max", "min", "sum"):
        assert not np.array_equal(want[name].astype(np.float64).astype(np.int64), want[name])  # beyond a double
        assert got[name].dtype == np.int64 and np.array_equal(got[name], want[name]), name


def test_float32_activations_call_no_double_function(cache_dir):
    """Elu, Selu, Celu (the float expm1 helper), Tanh, Exp, Log, Erf and libm's float functions (tanf, sinhf, ...)
    in float32: no double function in the C (one would compute in double: within every tolerance, but slower and
    not the helpers' bits)."""
    b = GraphBuilder("f32_calls")
    x = b.input("x", (2, 16), np.float32)
    ops = ["Elu", "Selu", "Celu", "Tanh", "Exp", "Log", "Erf", "Tan", "Sinh", "Cosh", "Asinh", "Atan"]
    g = b.build(*[b.op(op, x, name=op.lower()) for op in ops])
    code = re.sub(r"/\*.*?\*/", "", generate(g, FusionPlan.unfused(g)).source, flags=re.S)  # the helpers' comments
    assert DOUBLE_CALL.findall(code) == []
    feeds = {"x": np.random.default_rng(2).uniform(0.1, 0.9, (2, 16)).astype(np.float32)}
    got, want = build(g, None, cache_dir=cache_dir).run(feeds), reference.run(g, feeds)
    for op in ops:
        assert np.allclose(got[op.lower()], want[op.lower()], rtol=1e-5, atol=1e-6), op


def test_hard_sigmoid_and_hard_swish_are_float32_arithmetic_bit_for_bit(cache_dir):
    """HardSigmoid (alpha 0.1 and beta 0.3, not exact in binary) and HardSwish over float32 are the float32
    operations ``min(max(alpha x + beta, 0), 1)`` (times x), without contraction: the same bits as NumPy's float32
    arithmetic. A constant in double (0.1 instead of 0.1f) changes some of them. Both the vector chain (default) and
    the rules' C expression (the plain C99 build, ``simd="none"``)."""
    b = GraphBuilder("hard")
    x = b.input("x", (4, 256), np.float32)
    g = b.build(b.op("HardSigmoid", x, name="hs", alpha=0.1, beta=0.3), b.op("HardSwish", x, name="hw"))
    xs = np.random.default_rng(8).uniform(-12.0, 12.0, (4, 256)).astype(np.float32)
    f32 = np.float32

    def hard(alpha, beta):
        return np.minimum(np.maximum(f32(alpha) * xs + f32(beta), f32(0)), f32(1))
    for simd in ("auto", "none"):
        got = build(g, None, cache_dir=cache_dir, options=CodegenOptions(simd=simd)).run({"x": xs})
        assert got["hs"].view(np.uint32).tolist() == hard(0.1, 0.3).view(np.uint32).tolist(), simd
        assert got["hw"].view(np.uint32).tolist() == (xs * hard(1 / 6, 0.5)).view(np.uint32).tolist(), simd


def test_elu_and_selu_scale_the_float32_expm1_by_float32_constants(cache_dir):
    """Elu with alpha 0.1 and Selu below 0 are float32 products of the same expm1 (Elu with alpha 1 gives it):
    ``f32(0.1) * e`` and ``f32(gamma) * (f32(alpha) * e)``, bit for bit (a constant in double would round once from
    the double product instead). Above 0, Elu is x and Selu ``f32(gamma) * x``."""
    b = GraphBuilder("elus")
    x = b.input("x", (4, 64), np.float32)
    alpha, gamma = 1.6732632423543772, 1.0507009873554805
    g = b.build(b.op("Elu", x, name="e1", alpha=1.0), b.op("Elu", x, name="e01", alpha=0.1),
                b.op("Selu", x, name="selu", alpha=alpha, gamma=gamma))
    xs = np.random.default_rng(4).uniform(-6.0, 6.0, (4, 64)).astype(np.float32)
    f32 = np.float32
    for simd in ("auto", "none"):
        got = build(g, None, cache_dir=cache_dir, options=CodegenOptions(simd=simd)).run({"x": xs})
        e = got["e1"]
        neg = xs <= 0
        assert (got["e01"][~neg] == xs[~neg]).all(), simd
        assert got["e01"][neg].view(np.uint32).tolist() == (f32(0.1) * e[neg]).view(np.uint32).tolist(), simd
        want = np.where(neg, f32(gamma) * (f32(alpha) * e), f32(gamma) * xs)
        assert got["selu"].view(np.uint32).tolist() == want.view(np.uint32).tolist(), simd
