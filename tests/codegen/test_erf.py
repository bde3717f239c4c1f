"""The inline float erf (``codegen/erf.py``) against math.erf in float64, and its use in
generated kernels (Erf, GELU epilogue) in place of libm's erff."""
from __future__ import annotations

import ctypes
import math
import re
import subprocess

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import generate
from opfuse.codegen.erf import ERF_HELPER, erf_text
from opfuse.ir.plan import FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime.toolchain import Toolchain, ToolchainError

MAX_ULP = 2.0          # the brief's bound; measured at most 0.95
SWEEP_STRIDE = 4099    # every 4099th positive float32 bit pattern (about 520k values), both signs
DENSE_RANGE = 4.5      # plus a uniform grid over [-4.5, 4.5], where erf is not yet +-1
DENSE_POINTS = 200_001


@pytest.fixture(scope="module", params=["auto", "none"])
def erf_c(tmp_path_factory, request):
    """The helper compiled with the backend's flags, as ``f(x: float32 array) -> array``; with the
    ``OPFUSE_FMAF`` of ``simd="auto"`` (fused where the CPU has FMA) and of the plain C99 build."""
    try:
        tc = Toolchain.detect(threads=False)
    except ToolchainError:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("erf")
    src = d / "erf.c"
    src.write_text("#include <math.h>\n#include <stdint.h>\n" + erf_text(request.param) +
                   f"void erf_many(const float* x, float* y, long n) {{\n"
                   f"  for (long i = 0; i < n; ++i) y[i] = {ERF_HELPER}(x[i]);\n}}\n")
    lib = d / "erf.so"
    subprocess.run([tc.cc, *tc.flags, "-o", str(lib), str(src), "-lm"], check=True, capture_output=True)
    dll = ctypes.CDLL(str(lib))
    dll.erf_many.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty_like(x)
        dll.erf_many(x.ctypes.data, y.ctypes.data, x.size)
        return y
    return run


def _ulp_error(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|got - erf(x)| in ulps of float32 at the correctly rounded result."""
    exact = np.array([math.erf(float(v)) for v in x.astype(np.float64)])
    ulp = np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / ulp


def test_erf_within_2_ulp_over_float_range(erf_c):
    pos = np.arange(0, 0x7F800000, SWEEP_STRIDE, dtype=np.uint32).view(np.float32)
    grid = np.linspace(-DENSE_RANGE, DENSE_RANGE, DENSE_POINTS, dtype=np.float32)
    edges = np.array([0.75, 1.75, 3.92], np.float32)
    near = np.concatenate([np.nextafter(edges, np.float32(0)), edges, np.nextafter(edges, np.float32(9))])
    x = np.concatenate([pos, -pos, grid, near, -near])
    err = _ulp_error(erf_c(x), x)
    worst = int(np.argmax(err))
    assert err[worst] <= MAX_ULP, f"erf({x[worst]!r}) off by {err[worst]:.2f} ulp"


def test_erf_special_values(erf_c):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38], np.float32)
    y = erf_c(x)
    assert np.isnan(y[0])
    assert y[1] == 1.0 and y[2] == -1.0
    assert y[3] == 0.0 and not np.signbit(y[3]) and y[4] == 0.0 and np.signbit(y[4])
    assert y[5] == np.float32(1e-45) and y[6] == -np.float32(1e-45)  # erf(x) ~ 1.128x rounds to x
    assert y[7] == 1.0 and y[8] == -1.0
    assert np.array_equal(erf_c(x[1:]), y[1:])  # deterministic


def test_erf_is_odd(erf_c):
    x = np.linspace(0, 5, 10_001, dtype=np.float32)
    assert np.array_equal(erf_c(-x), -erf_c(x))


def _gelu_graph(n: int):
    b = GraphBuilder("gelu")
    x = b.input("x", (4, n))
    w = b.const("w", np.random.default_rng(3).standard_normal((n, n)).astype(np.float32) * 0.5)
    y = b.op("Gelu", b.op("MatMul", x, w, name="mm"), name="gelu")
    e = b.op("Erf", b.input("z", (4, n)), name="erf")
    return b.build(y, e)


def test_gelu_epilogue_and_erf_use_inline_helper(cache_dir):
    g = _gelu_graph(24)
    plan = group_by_names(g, [("gemm_epilogue", ["mm", "gelu"]), ("single", ["erf"])])
    src = generate(g, plan).source
    assert re.search(r"(?<!\w)erff\(", src) is None  # no libm erff: the helper (and its vector forms) only
    assert src.count(f"static inline float {ERF_HELPER}(") == 1
    got, want, _ = run_both(g, plan, cache_dir)
    assert_close(got, want)


def test_unfused_gelu_matches_reference(cache_dir):
    g = _gelu_graph(16)
    got, want, _ = run_both(g, FusionPlan.unfused(g), cache_dir)
    assert_close(got, want)


def test_double_erf_keeps_libm(cache_dir):
    b = GraphBuilder("erf64")
    y = b.op("Erf", b.input("x", (3, 5), np.float64), name="erf")
    g = b.build(y)
    src = generate(g, FusionPlan.unfused(g)).source
    assert ERF_HELPER not in src and "erf(" in src
    got, want, _ = run_both(g, FusionPlan.unfused(g), cache_dir)
    assert_close(got, want)


def test_erf_text_is_the_fma_macro_of_the_build_then_the_helper():
    """What the compiled sweeps above test (their fixture compiles ``erf_text`` of both builds)."""
    from opfuse.codegen.erf import ERF_HELPER_TEXT
    from opfuse.codegen.vecmath import FMA_TEXT
    assert erf_text("none") == FMA_TEXT["none"] + ERF_HELPER_TEXT
    assert erf_text() == erf_text("auto") == FMA_TEXT["auto"] + ERF_HELPER_TEXT
    assert "a < 0x1.8p-1f ?" in ERF_HELPER_TEXT  # SMALL_END = 0.75 as an exact float literal
