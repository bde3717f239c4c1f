"""The vector log and softplus (``vecmath.opfuse_v16_logf``/``opfuse_v8_logf`` and the softplus on them, which make
Softplus and Log vector ops: ``simdchain.VECTOR_OPS``, so GEMM epilogues too): against NumPy in float64 at the scalar
helpers' stated bounds over a sweep of bit patterns, the special values as NumPy (0 -> -inf, subnormals, inf, NaN,
negatives -> NaN), and bitwise the scalar helpers of the same (FMA) build, lane by lane."""
from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from cg_support import bit_sweep, same_bits
from opfuse.codegen import vecmath
from opfuse.runtime.toolchain import Toolchain, ToolchainError
from test_vecmath import HELPERS, ulp_error

SWEEP_STRIDE = 4099
SPECIAL = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754942e-38, 1.1754944e-38, -1.2e-38, np.inf, -np.inf,
                    np.nan, -np.nan, 1.0, -1.0, 0.5, 1.4142135, 1.4142137, 2.0, 3.4e38, -3.4e38, 88.7, -103.9, -104.5,
                    1e6, -1e6, 1e-7, -1e-7], np.float32)
ISAS = {"avx512": vecmath.AVX512_FLOAT, "avx2": vecmath.AVX2_FLOAT}
NAMES = (vecmath.LOG, vecmath.SOFTPLUS)


@pytest.fixture(scope="module")
def vector_c(tmp_path_factory):
    """Per ISA this CPU runs: ``{helper: (vector f, scalar f)}`` over float32 arrays (the scalar helpers of the FMA
    build, ``simd="auto"``)."""
    try:
        tc = Toolchain.detect(threads=False)
    except ToolchainError:
        pytest.skip("no C compiler")
    parts = ["#include <math.h>\n#include <stdint.h>\n", vecmath.all_helpers_text("auto"),
             f"#if {vecmath.AVX2_FLOAT.guard}\n#include <immintrin.h>\n#endif\n"]
    for isa in ISAS.values():
        body = [vecmath.VECTOR_HELPERS[h][1](isa) for h in (vecmath.EXP_NONPOS, vecmath.LOG, vecmath.SOFTPLUS)]
        calls = "".join(f"void vec_{isa.name}_{h}(const float* x, float* y, long n) {{\n"
                        f"  for (long i = 0; i < n; i += {isa.lanes}) "
                        f"{isa.p}_storeu_ps(y + i, {vecmath.vector_name(h, isa)}({isa.p}_loadu_ps(x + i)));\n}}\n"
                        for h in NAMES)
        parts.append(f"#if {isa.guard}\nint has_{isa.name}(void) {{ return 1; }}\n{''.join(body)}{calls}#else\n"
                     f"int has_{isa.name}(void) {{ return 0; }}\n#endif\n")
    parts += [f"void one_{h}(const float* x, float* y, long n) {{ for (long i = 0; i < n; ++i) y[i] = {h}(x[i]); }}\n"
              for h in NAMES]
    d = tmp_path_factory.mktemp("veclog")
    src, lib = d / "veclog.c", d / "veclog.so"
    src.write_text("".join(parts))
    subprocess.run([tc.cc, *tc.flags, "-o", str(lib), str(src), "-lm"], check=True, capture_output=True)
    dll = ctypes.CDLL(str(lib))

    def wrap(fn, lanes: int):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]

        def run(x: np.ndarray) -> np.ndarray:
            n = x.size
            xp = np.zeros(-(-n // lanes) * lanes, np.float32)
            xp[:n] = x
            y = np.empty_like(xp)
            fn(xp.ctypes.data, y.ctypes.data, xp.size)
            return y[:n]
        return run
    out = {}
    for name, isa in ISAS.items():
        if getattr(dll, f"has_{name}")():
            out[name] = {h: (wrap(getattr(dll, f"vec_{name}_{h}"), isa.lanes), wrap(getattr(dll, f"one_{h}"), 1))
                         for h in NAMES}
    if not out:
        pytest.skip("this CPU has neither AVX-512F nor AVX2 with FMA")
    return out


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("helper", NAMES)
def test_vector_form_is_the_scalar_bits_and_within_bound(vector_c, isa, helper):
    if isa not in vector_c:
        pytest.skip(f"no {isa} on this CPU")
    vec, one = vector_c[isa][helper]
    ref, bound = HELPERS[helper]
    x = np.concatenate([bit_sweep(SWEEP_STRIDE), SPECIAL])
    got = vec(x)
    assert same_bits(got, one(x))
    with np.errstate(all="ignore"):
        err = ulp_error(got, ref(x.astype(np.float64)))
    worst = int(np.argmax(err))
    assert err[worst] <= bound, f"{helper}({x[worst]!r}) off by {err[worst]:.2f} ulp"


@pytest.mark.parametrize("isa", list(ISAS))
def test_vector_log_special_values_as_numpy(vector_c, isa):
    if isa not in vector_c:
        pytest.skip(f"no {isa} on this CPU")
    got = vector_c[isa][vecmath.LOG][0](SPECIAL)
    with np.errstate(all="ignore"):
        want = np.log(SPECIAL.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (SPECIAL, got, want)
    assert np.all(np.isnan(got[(SPECIAL < 0) | np.isnan(SPECIAL)]))  # negatives (-inf too) and NaN -> NaN
    assert np.all(got[SPECIAL == 0] == -np.inf)  # log(+-0) = -inf
    assert got[SPECIAL == np.inf][0] == np.inf
    sub = (SPECIAL > 0) & (SPECIAL < np.float32(2.0 ** -126))
    assert sub.sum() >= 2 and np.all(np.isfinite(got[sub]))  # subnormals: scaled by 2^23 first, finite logs
    finite = np.isfinite(want)
    assert np.all(ulp_error(got[finite], want[finite].astype(np.float64)) <= 1.0), (SPECIAL, got, want)


@pytest.mark.parametrize("isa", list(ISAS))
def test_vector_softplus_special_values_as_numpy(vector_c, isa):
    if isa not in vector_c:
        pytest.skip(f"no {isa} on this CPU")
    got = vector_c[isa][vecmath.SOFTPLUS][0](SPECIAL)
    with np.errstate(all="ignore"):
        want = (np.maximum(SPECIAL.astype(np.float64), 0) + np.log1p(np.exp(-np.abs(SPECIAL.astype(np.float64))))
                ).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (SPECIAL, got, want)
    assert got[SPECIAL == np.inf][0] == np.inf and got[SPECIAL == -np.inf][0] == 0.0
    finite = ~np.isnan(want)
    assert np.all(ulp_error(got[finite], want[finite].astype(np.float64)) <= 3.0), (SPECIAL, got, want)
