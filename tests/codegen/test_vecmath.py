"""The inline float32 exp, log, tanh, sigmoid and softplus (``codegen/vecmath.py``) against
NumPy in float64, over the whole float range; their use in generated kernels (no libm call
left in a float32 elementwise loop or epilogue, every such loop vectorised); and NaN/inf
propagation through every activation as in the NumPy reference."""
from __future__ import annotations

import ctypes
import math
import re
import subprocess

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen.threadpool import POOL_C
from opfuse.codegen import generate, vecmath
from opfuse.ir.plan import FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime.toolchain import Toolchain, ToolchainError

SWEEP_STRIDE = 4099  # every 4099th positive float32 bit pattern (about 520k values), both signs
DENSE_RANGE = 110.0  # plus a uniform grid over [-110, 110]: exp's whole finite range and more
DENSE_POINTS = 400_001
SUBNORMAL_ATOL = 2.0 ** -140
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.2e-38, -1.2e-38,
                    3.4e38, -3.4e38, 88.72, 88.73, -87.3, -103.9, -104.5, 1e6, -1e6], np.float32)


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


# helper -> (float64 reference, max ulp: the measured maximum, rounded up, plus a margin)
HELPERS = {
    vecmath.EXP: (np.exp, 1.5),
    vecmath.EXPM1: (np.expm1, 2.0),
    vecmath.LOG: (np.log, 1.5),
    vecmath.TANH: (np.tanh, 2.0),
    vecmath.SIGMOID: (_sigmoid, 3.0),
    vecmath.SOFTPLUS: (_softplus, 3.0),
}


EXP_NONPOS_ULP = 1.5  # opfuse_expf_nonpos on x <= 0: measured 0.88 (FMA) and 1.16 (plain C99), plus a margin


def _toolchain() -> Toolchain:
    try:
        return Toolchain.detect(threads=False)
    except ToolchainError:
        pytest.skip("no C compiler")


@pytest.fixture(scope="module", params=["auto", "none"])
def helpers_c(tmp_path_factory, request):
    """Every helper compiled with the backend's flags, as ``{name: f(float32 array) -> array}``,
    plus the compiler's vectorisation report of the loops calling them; once with the
    ``OPFUSE_FMAF`` of ``simd="auto"`` (fused multiply-adds where this CPU has them) and once
    with the plain C99 build's (a multiply and an add)."""
    tc = _toolchain()
    d = tmp_path_factory.mktemp("vecmath")
    src = d / "vecmath.c"
    loops = "".join(f"void many_{h}(const float* restrict x, float* restrict y, long n) {{\n"
                    f"  for (long i = 0; i < n; ++i) y[i] = {h}(x[i]);\n}}\n" for h in HELPERS)
    src.write_text("#include <math.h>\n#include <stdint.h>\n" + vecmath.all_helpers_text(request.param) + loops)
    lib = d / "vecmath.so"
    proc = subprocess.run([tc.cc, *tc.flags, "-fopt-info-vec-optimized", "-o", str(lib), str(src), "-lm"],
                          check=True, capture_output=True, text=True)
    dll = ctypes.CDLL(str(lib))
    fns = {}
    for h in HELPERS:
        fn = getattr(dll, f"many_{h}")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]

        def run(x: np.ndarray, fn=fn) -> np.ndarray:
            x = np.ascontiguousarray(x, dtype=np.float32)
            y = np.empty_like(x)
            fn(x.ctypes.data, y.ctypes.data, x.size)
            return y
        fns[h] = run
    return fns, src.read_text(), proc.stderr, tc


def ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in ulps of the float32-rounded exact result (2^-149 for subnormals); 0 where
    both are NaN or both the same infinity; inf where only one is NaN."""
    with np.errstate(all="ignore"):
        e32 = exact.astype(np.float32)
        err = np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(e32)).astype(np.float64)
        same = (np.isnan(got) & np.isnan(exact)) | (np.isinf(got) & (got == e32))
        err = np.where(same, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def sweep() -> np.ndarray:
    pos = np.arange(0, 0x7F800000, SWEEP_STRIDE, dtype=np.uint32).view(np.float32)
    grid = np.linspace(-DENSE_RANGE, DENSE_RANGE, DENSE_POINTS, dtype=np.float32)
    return np.concatenate([pos, -pos, grid, SPECIAL])


@pytest.mark.parametrize("helper", list(HELPERS))
def test_helper_within_stated_ulp_over_float_range(helpers_c, helper):
    fns = helpers_c[0]
    ref, bound = HELPERS[helper]
    x = sweep()
    with np.errstate(all="ignore"):
        err = ulp_error(fns[helper](x), ref(x.astype(np.float64)))
    worst = int(np.argmax(err))
    assert err[worst] <= bound, f"{helper}({x[worst]!r}) off by {err[worst]:.2f} ulp"


@pytest.mark.parametrize("helper", list(HELPERS))
def test_helper_special_values_as_numpy(helpers_c, helper):
    fns = helpers_c[0]
    ref = HELPERS[helper][0]
    got = fns[helper](SPECIAL)
    with np.errstate(all="ignore"):
        want = ref(SPECIAL.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (SPECIAL, got, want)
    finite = ~np.isnan(want)
    assert np.all(ulp_error(got[finite], want[finite].astype(np.float64)) <= 1.0), (SPECIAL, got, want)
    zeros = finite & (want == 0)
    assert np.array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))  # tanh(-0) = -0


@pytest.mark.parametrize("simd", ["auto", "none"])
def test_fma_macro_follows_simd_mode(simd):
    """The generated program defines ``OPFUSE_FMAF`` once, before the helpers: ``fmaf`` behind the
    target's FMA macros for ``simd="auto"``, a plain multiply and add for the C99 build."""
    from opfuse.codegen.options import CodegenOptions
    g = _activation_graph("Sigmoid", {}, 16)
    src = generate(g, FusionPlan.unfused(g), options=CodegenOptions(simd=simd)).source
    assert src.count(f"#define {vecmath.FMA}(") == (2 if simd == "auto" else 1)
    exp = vecmath.EXP_NONPOS  # the exp the Sigmoid calls (exp(-|x|))
    assert src.index(f"#define {vecmath.FMA}(") < src.index(f"static inline float {exp}(")
    assert ("fmaf(" in src) == (simd == "auto")
    assert f"{vecmath.FMA}(" in src.split(f"static inline float {exp}(")[1].split("}")[0]


@pytest.mark.parametrize("simd", ["auto", "none"])
def test_exp_of_nonpositive_within_its_bound_next_to_exp(simd, tmp_path):
    """``opfuse_expf_nonpos`` (Sigmoid's and Softplus's exp(-|x|): no overflow select, its own degree-6
    polynomial) on every input it gets, x <= 0 (-0 and -inf too) and NaN: within ``EXP_NONPOS_ULP`` of float64
    exp, within 1 ulp of ``opfuse_expf`` (not its bits: another polynomial), 1 at -0, 0 from -104 down and at
    -inf, NaN kept; and on (0, 89], Silu's (``opfuse_siluf`` clamps there): the same bound, inf from 88.73. It
    does differ above 89 (where exp overflows): it is not a general exp."""
    tc = _toolchain()
    src = tmp_path / "e.c"
    src.write_text("#include <math.h>\n#include <stdint.h>\n" + vecmath.all_helpers_text(simd) +
                   "".join(f"void many_{h}(const float* restrict x, float* restrict y, long n) {{\n"
                           f"  for (long i = 0; i < n; ++i) y[i] = {h}(x[i]);\n}}\n"
                           for h in (vecmath.EXP, vecmath.EXP_NONPOS)))
    lib = tmp_path / "e.so"
    subprocess.run([tc.cc, *tc.flags, "-o", str(lib), str(src), "-lm"], check=True, capture_output=True)
    dll = ctypes.CDLL(str(lib))
    neg = np.arange(0x80000000, 0xFF800001, 997, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([-0.0, -np.inf, np.nan, -104.0, -104.5, -1e6, -103.99, -87.3], np.float32)
    x = np.concatenate([special, neg, -np.abs(np.linspace(-110, 110, 200_001, dtype=np.float32))])
    ys = {}
    for h in (vecmath.EXP, vecmath.EXP_NONPOS):
        fn = getattr(dll, f"many_{h}")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
        ys[h] = np.empty_like(x)
        fn(x.ctypes.data, ys[h].ctypes.data, x.size)
    y = ys[vecmath.EXP_NONPOS]
    with np.errstate(all="ignore"):
        err = ulp_error(y, np.exp(x.astype(np.float64)))
        near = ulp_error(y, ys[vecmath.EXP].astype(np.float64))
    worst = int(np.argmax(err))
    assert err[worst] <= EXP_NONPOS_ULP, f"expf_nonpos({x[worst]!r}) off by {err[worst]:.2f} ulp"
    assert np.max(near) <= 1.0
    assert y[0] == 1.0 and y[1] == 0.0 and np.isnan(y[2]) and np.all(y[3:6] == 0.0)
    big = np.array([100.0], np.float32)  # the select it leaves out: a general exp would say inf
    out = np.empty_like(big)
    getattr(dll, f"many_{vecmath.EXP}")(big.ctypes.data, out.ctypes.data, 1)
    assert out[0] == np.inf
    # Silu's exp(-max(x, -89)) takes it up to 89: within the same bound there, inf from 88.73 (as exp rounds).
    pos = np.concatenate([np.arange(1, 0x42B20000, 997, dtype=np.uint32).view(np.float32),
                          np.linspace(0, 89, 100_001, dtype=np.float32), np.float32([88.72, 88.73, 89.0])])
    y = np.empty_like(pos)
    getattr(dll, f"many_{vecmath.EXP_NONPOS}")(pos.ctypes.data, y.ctypes.data, pos.size)
    with np.errstate(all="ignore"):
        err = ulp_error(y, np.exp(pos.astype(np.float64)))
    worst = int(np.argmax(err))
    assert err[worst] <= EXP_NONPOS_ULP, f"expf_nonpos({pos[worst]!r}) off by {err[worst]:.2f} ulp"
    assert y[-3] < np.inf and y[-2] == np.inf and y[-1] == np.inf


SILU_ULP = 3.0  # opfuse_siluf from -88.7 up (normal results): measured 2.31 (FMA) and 2.38 (plain C99), plus a margin
SILU_ULP_FROM = -88.7
SILU_FLUSH = 2.7e-37  # below, -0 where exp(-x) overflows: |x sigmoid(x)| < 88.73 exp(-88.73) there


@pytest.mark.parametrize("simd", ["auto", "none"])
def test_silu_within_its_bound(simd, tmp_path):
    """``opfuse_siluf`` (Silu as ``x / (1 + exp(-max(x, -89)))``, ``CodegenOptions.silu_direct``): within
    ``SILU_ULP`` of float64 ``x sigmoid(x)`` from -88.7 up, within ``SILU_FLUSH`` of it below (where it is -0), NaN
    where NumPy's is (x = -inf too: -inf * 0), +-0 and +inf kept; tighter than ``x * sigmoid(x)`` (2.97 ulp from
    -87.3, 4.05 down to -88.7); and gcc vectorises a loop calling it."""
    tc = _toolchain()
    src = tmp_path / "silu.c"
    src.write_text("#include <math.h>\n#include <stdint.h>\n" + vecmath.all_helpers_text(simd) +
                   f"void many(const float* restrict x, float* restrict y, long n) {{\n"
                   f"  for (long i = 0; i < n; ++i) y[i] = {vecmath.SILU}(x[i]);\n}}\n")
    lib = tmp_path / "silu.so"
    proc = subprocess.run([tc.cc, *tc.flags, "-fopt-info-vec-optimized", "-o", str(lib), str(src), "-lm"],
                          check=True, capture_output=True, text=True)
    fn = ctypes.CDLL(str(lib)).many
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    edges = np.float32([-89.5, -89.0, -88.73, -88.72, -88.7, -87.3, 103.9, 104.0, 104.5, 1e6, -1e6])
    x = np.concatenate([sweep(), np.linspace(-90, 105, 400_001, dtype=np.float32), edges])
    got = np.empty_like(x)
    fn(x.ctypes.data, got.ctypes.data, x.size)
    with np.errstate(all="ignore"):
        exact = x.astype(np.float64) * _sigmoid(x.astype(np.float64))
        err = ulp_error(got, exact)
    normal = (x >= SILU_ULP_FROM) & (np.abs(exact) >= 2.0 ** -126)
    worst = int(np.argmax(np.where(normal, err, 0.0)))
    assert err[worst] <= SILU_ULP, f"siluf({x[worst]!r}) off by {err[worst]:.2f} ulp"
    low = np.isfinite(x) & ~normal
    assert np.max(np.abs(got[low].astype(np.float64) - exact[low])) <= SILU_FLUSH
    assert np.array_equal(np.isnan(got), np.isnan(exact))
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan])
    out = np.empty_like(special)
    fn(special.ctypes.data, out.ctypes.data, special.size)
    assert out[0] == 0 and not np.signbit(out[0]) and out[1] == 0 and np.signbit(out[1])
    assert out[2] == np.inf and np.isnan(out[3]) and np.isnan(out[4])
    if "gcc" in tc.identity.lower() or "cc (" in tc.identity:
        loop = next(i + 1 for i, ln in enumerate(src.read_text().splitlines()) if f"{vecmath.SILU}(x[i])" in ln)
        vectorised = {int(ln.split(":")[1]) for ln in proc.stderr.splitlines() if "loop vectorized" in ln}
        assert loop in vectorised or loop - 1 in vectorised, "the loop calling opfuse_siluf is not vectorised"


def test_fma_and_plain_paths_agree(tmp_path):
    """Both builds of each helper, on the same inputs: within the sum of their stated bounds
    (each is checked against float64 above; this pins the two against each other directly)."""
    tc = _toolchain()
    runs = {}
    for simd in ("auto", "none"):
        src = tmp_path / f"v_{simd}.c"
        src.write_text("#include <math.h>\n#include <stdint.h>\n" + vecmath.all_helpers_text(simd) +
                       "".join(f"void many_{h}(const float* restrict x, float* restrict y, long n) {{\n"
                               f"  for (long i = 0; i < n; ++i) y[i] = {h}(x[i]);\n}}\n" for h in HELPERS))
        lib = tmp_path / f"v_{simd}.so"
        subprocess.run([tc.cc, *tc.flags, "-o", str(lib), str(src), "-lm"], check=True, capture_output=True)
        runs[simd] = ctypes.CDLL(str(lib))
    x = sweep()
    for h, (_ref, bound) in HELPERS.items():
        ys = []
        for dll in runs.values():
            fn = getattr(dll, f"many_{h}")
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
            y = np.empty_like(x)
            fn(x.ctypes.data, y.ctypes.data, x.size)
            ys.append(y)
        with np.errstate(all="ignore"):
            err = ulp_error(ys[0], ys[1].astype(np.float64))
        assert np.max(err) <= 2 * bound, f"{h}: the FMA and plain builds differ by {np.max(err):.2f} ulp"


def test_helper_loops_vectorise(helpers_c):
    _, src, report, tc = helpers_c
    if "gcc" not in tc.identity.lower() and "cc (" not in tc.identity:
        pytest.skip("vectorisation report needs gcc")
    vectorised = {int(ln.split(":")[1]) for ln in report.splitlines() if "loop vectorized" in ln}
    lines = src.splitlines()
    for h in HELPERS:
        loop = next(i + 1 for i, ln in enumerate(lines) if f"y[i] = {h}(x[i])" in ln)
        assert loop in vectorised or loop - 1 in vectorised, f"the loop calling {h} is not vectorised"


# Generated kernels ---------------------------------------------------------------------------
ACTIVATIONS = [("Relu", {}), ("LeakyRelu", {}), ("Clip", {"min": -1.0, "max": 2.0}), ("HardSigmoid", {}),
               ("HardSwish", {}), ("Sigmoid", {}), ("Silu", {}), ("Tanh", {}), ("Softplus", {}), ("Exp", {}),
               ("Log", {}), ("Erf", {}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("Elu", {}), ("Selu", {}),
               ("Celu", {"alpha": 2.0}), ("Mish", {})]
LIBM_CALL = re.compile(r"(?<![\w])(expf|logf|tanhf|log1pf|erff|powf)\(")


def _activation_graph(op: str, attrs: dict, n: int):
    b = GraphBuilder(op.lower())
    x = b.input("x", (n,))
    if op == "Clip":
        y = b.op("Clip", x, b.const("lo", np.float32(attrs["min"])), b.const("hi", np.float32(attrs["max"])),
                 name="act")
    else:
        y = b.op(op, x, name="act", **attrs)
    return b.build(y)


@pytest.mark.parametrize("op,attrs", ACTIVATIONS, ids=[f"{o}{'_tanh' if a.get('approximate') else ''}"
                                                       for o, a in ACTIVATIONS])
def test_activation_propagates_nan_and_inf_as_numpy(op, attrs, cache_dir):
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g = _activation_graph(op, attrs, SPECIAL.size)
    src = generate(g, FusionPlan.unfused(g)).source
    assert not LIBM_CALL.search(src), f"{op} still calls libm: {LIBM_CALL.search(src)}"
    model = build(g, FusionPlan.unfused(g), cache_dir=cache_dir)
    got = model.run({"x": SPECIAL})[g.outputs[0].name]
    want = reference.run(g, {"x": SPECIAL})[g.outputs[0].name]
    assert np.array_equal(np.isnan(got), np.isnan(want)), (op, SPECIAL, got, want)
    # atol: subnormal results (SiLU below x = -82.5 is x * a subnormal exp) keep few bits.
    assert np.allclose(got, want, rtol=1e-5, atol=SUBNORMAL_ATOL, equal_nan=True), (op, SPECIAL, got, want)


def _conv_epilogue_graph(act: str, attrs: dict):
    rng = np.random.default_rng(5)
    b = GraphBuilder("conv_act")
    x = b.input("x", (1, 8, 6, 10))
    w = b.const("w", (rng.standard_normal((16, 8, 1, 1)) * 2).astype(np.float32))
    y = b.op("Conv", x, w, b.const("bias", rng.standard_normal(16).astype(np.float32)), name="conv")
    return b.build(b.op(act, y, name="act", **attrs))


@pytest.mark.parametrize("op,attrs", [a for a in ACTIVATIONS if a[0] not in ("Clip", "Log")],
                         ids=[f"{o}{'_tanh' if a.get('approximate') else ''}" for o, a in ACTIVATIONS
                              if o not in ("Clip", "Log")])
def test_conv_epilogue_uses_inline_helpers_and_matches_reference(op, attrs, cache_dir):
    g = _conv_epilogue_graph(op, attrs)
    plan = group_by_names(g, [("conv_epilogue", ["conv", "act"])])
    src = generate(g, plan).source
    assert not LIBM_CALL.search(src)
    got, want, _ = run_both(g, plan, cache_dir)
    assert_close(got, want)


def test_softmax_row_exp_is_inline(cache_dir):
    b = GraphBuilder("softmax")
    g = b.build(b.op("Softmax", b.input("x", (4, 37)), axis=-1, name="sm"))
    src = generate(g, FusionPlan.unfused(g)).source
    assert vecmath.EXP in src and not LIBM_CALL.search(src)
    got, want, _ = run_both(g, FusionPlan.unfused(g), cache_dir)
    assert_close(got, want)


def test_double_keeps_libm(cache_dir):
    b = GraphBuilder("f64")
    x = b.input("x", (3, 5), np.float64)
    g = b.build(b.op("Tanh", b.op("Sigmoid", b.op("Exp", x, name="e"), name="s"), name="t"))
    src = generate(g, FusionPlan.unfused(g)).source
    helpers = src.split("/* group")[0].replace(POOL_C, "").replace("opfuse_tid", "")  # no vector helpers
    assert "opfuse_" not in helpers and "tanh(" in src and "exp(" in src
    got, want, _ = run_both(g, FusionPlan.unfused(g), cache_dir)
    assert_close(got, want)


def test_gelu_tanh_has_no_cancellation(cache_dir):
    """GELU-tanh is emitted as x * sigmoid(2z): at x = -8, 0.5 x (1 + tanh z) rounds 1 + tanh z
    to 0 in float32 (and in float64); the sigmoid form keeps the tiny negative result."""
    from opfuse.runtime.native import build
    x = np.array([-8.0, -6.0, -4.0], np.float32)
    g = _activation_graph("Gelu", {"approximate": "tanh"}, x.size)
    got = build(g, FusionPlan.unfused(g), cache_dir=cache_dir).run({"x": x})[g.outputs[0].name]
    z = math.sqrt(2 / math.pi) * (x.astype(np.float64) + 0.044715 * x.astype(np.float64) ** 3)
    exact = x / (1 + np.exp(-2 * z))
    # Relative, not a few ulp: z's own float32 rounding is amplified by |2z| (47 at x = -8).
    assert np.all(got < 0) and np.allclose(got, exact, rtol=1e-5, atol=0), (got, exact)


# Activations as emitted (one-op kernels), against float64 NumPy: (attrs, reference, from x,
# max ulp for x >= from with a normal result, max |err| / |x| for the other finite x). The
# bounds are the measured maxima (``codegen/rules.py`` docstring) plus a margin.
def _f64_erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _hardsigmoid(x, alpha, beta):
    return np.clip(alpha * x + beta, 0.0, 1.0)


OP_ERRORS = {
    "Sigmoid": ({}, _sigmoid, -np.inf, 3.0, 1e-7),
    "Silu": ({}, lambda x: x * _sigmoid(x), -88.7, 3.0, 1e-7),  # x / (1 + exp(-x)): CodegenOptions.silu_direct
    "SiluProduct": ({}, lambda x: x * _sigmoid(x), -87.3, 3.5, 1e-7),  # x * sigmoid(x): silu_direct off (Cortex-M7)
    "Tanh": ({}, np.tanh, -np.inf, 1.5, 1e-7),
    "Softplus": ({}, _softplus, -np.inf, 3.0, 1e-7),
    "Exp": ({}, np.exp, -np.inf, 1.5, np.inf),
    "Erf": ({}, _f64_erf, -np.inf, 1.5, 1e-7),
    "Gelu": ({}, lambda x: 0.5 * x * (1 + _f64_erf(x / math.sqrt(2))), -1.0, 2.5, 2.5e-8),  # codegen/gelu.py
    "GeluTanh": ({"approximate": "tanh"},
                 lambda x: x * _sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)), -3.0, 16.0, 1e-7),
    "HardSigmoid": ({}, lambda x: _hardsigmoid(x, 0.2, 0.5), -2.0, 3.0, 1e-8),
    "HardSwish": ({}, lambda x: x * _hardsigmoid(x, 1 / 6, 0.5), 0.0, 2.0, 5e-8),
    "LeakyRelu": ({}, lambda x: np.where(x >= 0, x, x * np.float64(np.float32(0.01))), -np.inf, 0.5, 1e-7),
    "Elu": ({}, lambda x: np.where(x > 0, x, np.expm1(x)), -np.inf, 3.0, 1e-7),
    "Mish": ({}, lambda x: x * np.tanh(_softplus(x)), -87.0, 4.0, 1e-7),
}
# The plain C99 build ("none") computes GELU as 0.5 x (1 + erf(x / sqrt 2)) unless
# CodegenOptions.scalar_gelu_table asks for gelu.py's polynomial there too (the loops gcc vectorises
# by itself would read the table lane by lane): its own, looser bounds.
SCALAR_ERRORS = {
    "Gelu": ({}, OP_ERRORS["Gelu"][1], -1.0, 3.0, 6e-8),  # 0.5 x (1 + erf) cancels below -1
}


@pytest.mark.parametrize("simd", ["auto", "none", "none-table"])
@pytest.mark.parametrize("name", list(OP_ERRORS))
def test_activation_within_stated_error(name, simd, cache_dir):
    """Each activation's kernel, with fused multiply-adds where this CPU has them ("auto") and as
    the plain C99 build ("none"; "none-table" with ``scalar_gelu_table``): within the same bounds,
    except GELU's plain erf form (``SCALAR_ERRORS``)."""
    from opfuse.codegen.options import CodegenOptions
    from opfuse.runtime.native import build
    attrs, ref, lo, max_ulp, max_rel_x = (SCALAR_ERRORS if simd == "none" else OP_ERRORS).get(name, OP_ERRORS[name])
    x = sweep()
    g = _activation_graph({"GeluTanh": "Gelu", "SiluProduct": "Silu"}.get(name, name), attrs, x.size)
    options = CodegenOptions(simd="none" if simd == "none-table" else simd, scalar_gelu_table=simd == "none-table",
                             silu_direct=name != "SiluProduct")
    model = build(g, FusionPlan.unfused(g), cache_dir=cache_dir, options=options)
    got = model.run({"x": x})[g.outputs[0].name]
    with np.errstate(all="ignore"):
        exact = ref(x.astype(np.float64))
        err = ulp_error(got, exact)
        in_range = (x >= lo) & (np.abs(exact) >= 2.0 ** -126)
        finite = np.isfinite(x) & np.isfinite(exact)
        rel_x = np.abs(got.astype(np.float64) - exact) / np.maximum(np.abs(x.astype(np.float64)), 1e-30)
    worst = int(np.argmax(np.where(in_range, err, 0.0)))
    assert err[worst] <= max_ulp or not in_range[worst], f"{name}({x[worst]!r}) off by {err[worst]:.2f} ulp"
    worst = int(np.argmax(np.where(finite & ~in_range, rel_x, 0.0)))
    assert rel_x[worst] <= max_rel_x, f"{name}({x[worst]!r}): |err| / |x| = {rel_x[worst]:.3g}"
    assert np.array_equal(np.isnan(got), np.isnan(exact))


def test_attention_exp_is_the_nonpositive_helper():
    """The attention kernel's softmax calls ``vecmath``'s exp for x <= 0 (its bound: ``EXP_NONPOS_ULP``, tested
    above), defined once, and no libm exp."""
    from opfuse.ir.plan import FusionGroup, FusionPlan
    b = GraphBuilder("att")
    q, k, v = b.input("q", (2, 8, 4)), b.input("k", (2, 4, 8)), b.input("v", (2, 8, 4))
    g = b.build(b.op("MatMul", b.op("Softmax", b.op("MatMul", q, k, name="s"), axis=-1, name="p"), v, name="o"))
    src = generate(g, FusionPlan(g, [FusionGroup("att", list(g.nodes), "attention")])).source
    kernel = src.split("attention [")[1]
    assert f"{vecmath.EXP_NONPOS}(" in kernel and src.count(f"static inline float {vecmath.EXP_NONPOS}(") == 1
    assert not LIBM_CALL.search(src)
