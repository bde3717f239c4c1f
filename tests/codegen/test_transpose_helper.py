"""``microkernel.transpose_helper`` (``opfuse_transpose``, the transposed GEMM tile turned back before its
epilogue) compiled alone, with its AVX2 8 x 8 blocks (``simd="auto"`` with -march=native) and as plain C
(no -march, and ``simd="none"``), against NumPy's transpose: sizes that are, and are not, whole 8 x 8 blocks,
leading dimensions past the block, nothing written outside it."""
from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest

from opfuse.codegen.microkernel import transpose_helper
from test_avx512 import _compile

SHAPES = [(8, 8), (19, 13), (16, 5), (3, 17), (24, 16)]


@pytest.mark.parametrize("way", ["avx2", "plain", "none"])
def test_transpose_helper_matches_numpy(way, tmp_path):
    if way == "avx2" and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("not an x86-64 host: no AVX2 to compile for")
    fn, text = transpose_helper("none" if way == "none" else "auto")
    lib = _compile(tmp_path, text.replace("static void", "void"), ["-march=native"] if way == "avx2" else [], way)
    f = getattr(lib, fn)
    f.restype = None
    fp = ctypes.POINTER(ctypes.c_float)
    rng = np.random.default_rng(8)
    for rows, cols in SHAPES:
        lds, ldd = cols + 3, rows + 5
        src = rng.standard_normal((rows, lds)).astype(np.float32)
        dst = np.full((cols + 1, ldd), 7.0, np.float32)
        f(ctypes.c_long(rows), ctypes.c_long(cols), src.ctypes.data_as(fp), ctypes.c_long(lds),
          dst.ctypes.data_as(fp), ctypes.c_long(ldd))
        np.testing.assert_array_equal(dst[:cols, :rows], src[:, :cols].T, err_msg=f"{way} {rows}x{cols}")
        assert (dst[:cols, rows:] == 7.0).all() and (dst[cols:] == 7.0).all(), f"{way} {rows}x{cols}"
