"""The AVX2 micro-kernel's k loop unrolled (``CodegenOptions.gemm_k_unroll``): the pragma sits on that loop only,
the name says so, the portable and AVX-512 bodies stay as they were, and results are the same bits."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.codegen.microkernel import microkernel
from opfuse.errors import OpfuseError
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(5)


def _bodies(text: str) -> dict[str, str]:
    """The micro-kernel's bodies by their guard: "avx512", "avx2" and "plain"."""
    parts = re.split(r"^#(?:el)?if (.*)$|^#else$", text, flags=re.M)
    out, guard = {}, None
    for chunk in parts:
        if chunk is None:
            guard = "plain"
        elif chunk.startswith("defined(__AVX512F__)"):
            guard = "avx512"
        elif chunk.startswith("defined(__AVX2__)"):
            guard = "avx2"
        elif guard is not None and guard not in out:
            out[guard] = chunk
    return out


@pytest.mark.parametrize("a, b", [("packed", "packed"), ("koff", "packed"), ("packed", "strided")])
@pytest.mark.parametrize("mr, nr", [(6, 16), (8, 32)])  # 8 x 32: an AVX-512 body, and AVX2 by sub-blocks
def test_every_avx2_k_loop_carries_the_pragma_and_the_name_says_so(a, b, mr, nr):
    name, text = microkernel(mr, nr, a, b, "auto", 32, False, avx512=True, k_unroll=4)
    assert name.endswith("_u4")
    bodies = _bodies(text)
    assert set(bodies) == ({"avx512", "avx2", "plain"} if mr == 8 else {"avx2", "plain"})
    loops = re.findall(r"^ *for \(long k = 0; k < kc; \+\+k\) \{", bodies["avx2"], re.M)
    pragmas = re.findall(r"OPFUSE_PRAGMA\(GCC unroll 4\)\n *for \(long k = 0; k < kc; \+\+k\) \{", bodies["avx2"])
    assert len(loops) == len(pragmas) == (1 if mr == 6 else 4)
    assert "GCC unroll 4" not in bodies["plain"] and "GCC unroll 4" not in bodies.get("avx512", "")
    rolled_name, rolled = microkernel(mr, nr, a, b, "auto", 32, False, avx512=True)
    assert "GCC unroll 4" not in rolled and rolled_name + "_u4" == name


def test_no_unroll_where_there_is_no_avx2_body():
    name, text = microkernel(6, 16, "packed", "packed", "none", 0, False, k_unroll=4)
    assert "_u4" not in name and "unroll 4" not in text
    name, text = microkernel(6, 12, "packed", "packed", "auto", 0, False, k_unroll=4)  # no vector width divides 12
    assert "_u4" not in name and "unroll 4" not in text


def test_a_negative_unroll_is_refused():
    with pytest.raises(OpfuseError, match="gemm_k_unroll"):
        CodegenOptions(gemm_k_unroll=-1)


@pytest.mark.parametrize("k, hw", [(1, 14), (3, 9)])
def test_unrolled_and_rolled_give_the_same_bits(cache_dir, k, hw):
    b = GraphBuilder("unroll")
    x = b.input("x", (1, 37, hw, hw))  # K = 37 * k * k: not a multiple of the unroll
    w = b.const("w", (rng.standard_normal((40, 37, k, k)) / np.sqrt(37 * k * k)).astype(np.float32))
    y = b.op("Conv", x, w, b.const("bias", rng.standard_normal(40).astype(np.float32)), pads=[k // 2] * 4, name="c")
    g = b.build(b.op("Relu", y, name="r"))
    plan = group_by_names(g, [("conv_epilogue", ["c", "r"])])
    got4, want, m4 = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_k_unroll=4))
    got0, _, m0 = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_k_unroll=0))
    assert_close(got4, want)
    assert "GCC unroll 4" in m4.program.source and "GCC unroll 4" not in m0.program.source
    for name in got4:
        assert np.array_equal(got4[name], got0[name])
