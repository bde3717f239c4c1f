"""The compile-time parts of ``codegen/winograd.py`` without a compiler, each expectation worked out by hand:
the transforms built from their points (F(2x2) against the matrices derived below, another size against
the 1-D correlation), the exact solver, the filter transform, the refusals not covered by
test_winograd.py, the register block of the batched GEMMs, the tiles per block and the band's rows."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from opfuse.codegen import CodegenOptions
from opfuse.codegen.winograd import (F2, _block_rows, _register_block, _solve, _tiles_per_block, direct_flops,
                                     filter_transform, legality, toom_cook)
from opfuse.ops import GraphBuilder
from opfuse.targets.calibrate import full_width_fma_of

H = Fraction(1, 2)


def test_f2_from_the_points_0_1_minus_1():
    """``AT[i][j] = a_j^i`` plus the point at infinity; ``G[j] = (1, a_j, a_j^2) / prod_{l != j} (a_j - a_l)``
    (a_0 = 0: prod (0 - 1)(0 + 1) = -1; a_1 = 1: 2; a_2 = -1: 2) and infinity's (0, 0, 1); ``BT`` then makes
    y_0 = g0 d0 + g1 d1 + g2 d2 and y_1 = g0 d1 + g1 d2 + g2 d3 (Lavin & Gray's first and last rows negated, as
    G's first row and AT's last column are)."""
    t = toom_cook(2, (0, 1, -1))
    assert t.AT == ((1, 1, 1, 0), (0, 1, -1, 1))
    assert t.G == ((-1, 0, 0), (H, H, H), (H, -H, H), (0, 0, 1))
    assert t.BT == ((-1, 0, 1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, -1, 0, 1))
    assert t == F2 and t.alpha == 4 and t.name == "F(2x2,3x3)"


def test_another_size_computes_the_1d_correlation_exactly():
    """F(3, 3) on 0, 1, -1, 2 (not used by the code generator: the construction is general):
    ``AT [(G g) * (BT d)] == (sum_k g_k d_{i+k})_i`` in exact arithmetic."""
    t = toom_cook(3, (0, 1, -1, 2))
    assert len(t.AT) == 3 and len(t.G) == 5 and len(t.BT) == 5 and t.alpha == 5
    rng = np.random.default_rng(3)
    for _ in range(3):
        g = [Fraction(int(v)) for v in rng.integers(-9, 10, 3)]
        d = [Fraction(int(v)) for v in rng.integers(-9, 10, 5)]
        u = [sum((row[k] * g[k] for k in range(3)), Fraction(0)) for row in t.G]
        v = [sum((row[j] * d[j] for j in range(5)), Fraction(0)) for row in t.BT]
        y = [sum((row[j] * u[j] * v[j] for j in range(5)), Fraction(0)) for row in t.AT]
        assert y == [sum(g[k] * d[i + k] for k in range(3)) for i in range(3)]


def test_solve_is_exact_and_refuses_an_inconsistent_system():
    # x + 2y = 5 with a zero first pivot (rows swapped), 3x = 3, and a third equation that agrees
    rows = [[Fraction(0), Fraction(1)], [Fraction(1), Fraction(2)], [Fraction(3), Fraction(0)]]
    assert _solve(rows, [Fraction(2), Fraction(5), Fraction(3)]) == [1, 2]
    assert _solve([[Fraction(2), Fraction(0)], [Fraction(0), Fraction(3)]], [Fraction(1), Fraction(1)]) == \
        [H, Fraction(1, 3)]
    with pytest.raises(AssertionError, match="inconsistent"):
        _solve(rows, [Fraction(2), Fraction(5), Fraction(4)])


def test_filter_transform_is_g_w_gt():
    """One-hot filters: ``U[i * 4 + k] = G[i, a] G[k, b] w`` for a weight w at tap (a, b); F(2x2)'s G columns
    are (-1, 1/2, 1/2, 0), (0, 1/2, -1/2, 0), (0, 1/2, 1/2, 1)."""
    w = np.zeros((2, 1, 3, 3))
    w[0, 0, 1, 1] = 1.0
    w[1, 0, 0, 2] = 2.0
    u = filter_transform(w, F2)
    assert u.shape == (16, 2, 1)
    g1, g0, g2 = np.array([0, .5, -.5, 0]), np.array([-1, .5, .5, 0]), np.array([0, .5, .5, 1])
    np.testing.assert_array_equal(u[:, 0, 0], np.outer(g1, g1).reshape(-1))
    np.testing.assert_array_equal(u[:, 1, 0], 2 * np.outer(g0, g2).reshape(-1))


def _conv(shape, dtype=np.float32, const_weights=True):
    b = GraphBuilder("w")
    x = b.input("x", shape, dtype)
    wshape = (4, shape[1]) + (3,) * (len(shape) - 2)
    wt = b.const("w", np.ones(wshape, dtype)) if const_weights else b.input("wt", wshape, dtype)
    g = b.build(b.op("Conv", x, wt, name="conv"))
    node = g.nodes[0]
    return node, {id(v): v.const for v in g.values.values() if v.const is not None}


def test_legality_refusals():
    assert legality(*_conv((1, 2, 9))) == "1-D convolution (Winograd: 2-D only)"
    assert legality(*_conv((1, 2, 5, 5, 5))) == "3-D convolution (Winograd: 2-D only)"
    assert legality(*_conv((1, 2, 9, 9), np.float64)) == "dtype float64 (Winograd: float32 only)"
    assert legality(*_conv((1, 2, 9, 9), const_weights=False)) == \
        "weights computed at run time (Winograd transforms them at build time)"
    assert legality(*_conv((1, 2, 9, 9))) is None


def test_register_block_of_the_batched_gemms():
    """AVX2: the options' block. AVX-512 without ``winograd_avx512``: AVX2's 6 x 16. With it, the 8 x 32
    block only where it pads no more, else MR x 16 in zmm (``winograd_zmm_panels``): 64 -> 64 channels, F(4x4)
    (alpha 6, 36 x 128 floats a tile).
    16 tiles (14x14): 8 x 32 takes one block of 16 tiles padded to 32, 32 x 64 = 2048 products per xi;
    6 x 16 one block of 16, 16 x 66 = 1056: not 8 x 32, but 16 x 16 in zmm (16 x 64). 64 tiles (32x32):
    8 x 32 two blocks of 32, 64 x 64 = 4096; 6 x 16 four blocks (``gemm_min_tiles``) of 16, 64 x 66 = 4224:
    AVX-512."""
    avx2 = CodegenOptions(vector_isa="avx2").resolved("avx2")
    assert _register_block(avx2, 64, 64, 64, 1, 6) == (6, 16, False)
    avx512 = CodegenOptions(vector_isa="avx512").resolved("avx512")
    assert _register_block(avx512, 64, 64, 64, 1, 6) == (6, 16, False)
    wide = avx512.with_(winograd_avx512=True)
    assert _register_block(wide, 64, 64, 16, 1, 6) == (16, 16, True)   # one zmm of tiles, 16 rows (64 channels)
    assert _register_block(wide, 64, 24, 16, 1, 6) == (12, 16, True)   # the rows that pad 24 channels least
    assert _register_block(wide.with_(winograd_zmm_panels=False), 64, 64, 16, 1, 6) == (6, 16, False)
    assert _register_block(wide, 64, 64, 64, 1, 6) == (8, 32, True)


def test_avx512_block_follows_the_hosts_fma_width():
    """``winograd_avx512`` None (the default) resolves to whether the host's FMA pipes are zmm-wide (Zen 5 on,
    ``full_width_fma_of``); an explicit value wins; the plain C and the AVX2 block never take it."""
    o = CodegenOptions(vector_isa="avx512")
    assert o.winograd_avx512 is None
    assert o.resolved("avx512", full_width_fma=True).winograd_avx512 is True
    assert o.resolved("avx512").winograd_avx512 is False
    assert o.with_(winograd_avx512=False).resolved("avx512", full_width_fma=True).winograd_avx512 is False
    assert o.with_(winograd_avx512=True).resolved("avx512").winograd_avx512 is True
    assert _register_block(o.resolved("avx512", True), 64, 64, 64, 1, 6) == (8, 32, True)
    assert _register_block(CodegenOptions(vector_isa="avx2").resolved("avx2", True), 64, 64, 64, 1, 6)[2] is False
    assert full_width_fma_of("AuthenticAMD", "26", "fma avx2 avx512f avx512bw")       # Zen 5
    assert not full_width_fma_of("AuthenticAMD", "25", "fma avx2 avx512f avx512bw")   # Zen 4: two halves
    assert not full_width_fma_of("AuthenticAMD", "26", "fma avx2")                    # no AVX-512F
    assert not full_width_fma_of("GenuineIntel", "6", "fma avx2 avx512f")             # not known here
    assert full_width_fma_of("GenuineIntel", "6", "fma avx2 avx512f amx_tile")        # Sapphire Rapids on
    assert full_width_fma_of("GenuineIntel", "6", "fma avx2 avx512f avx512_fp16")
    assert not full_width_fma_of("GenuineIntel", "6", "fma avx2 amx_tile")           # no AVX-512F
    assert not full_width_fma_of("AuthenticAMD", "25", "fma avx2 avx512f amx_tile")  # the flags are Intel's rule
    assert not full_width_fma_of("", "", "")


def test_tiles_per_block():
    """64 -> 64 channels, F(4x4): 36 x 128 = 4608 floats a tile, 2^18 / 4608 = 56 tiles, 32 in whole panels.
    100 tiles, 4 images: 4 blocks of 25 -> 32 tiles each (16 blocks of equal cost: nothing to balance);
    one image: the same. 16 tiles: one block, at least NR (32). 16 -> 16 channels (36 x 32 = 1152 floats,
    227 -> 224 tiles), 100 tiles: one block a image, 100 -> 128, where there are 4 images; with one image
    ``gemm_min_tiles`` (4) blocks of 25 -> 32. Every case's blocks cost alike: the balancing keeps them."""
    o = CodegenOptions(vector_isa="avx512").resolved("avx512")
    assert _tiles_per_block(o, 64, 64, 100, 4, 6, 32) == 32
    assert _tiles_per_block(o, 64, 64, 16, 1, 6, 32) == 32
    assert _tiles_per_block(o, 64, 64, 100, 1, 6, 32) == 32
    assert _tiles_per_block(o, 16, 16, 100, 4, 6, 32) == 128
    assert _tiles_per_block(o, 16, 16, 100, 1, 6, 32) == 32


def test_block_rows_and_direct_flops():
    # 20 tiles, 5 a row, blocks of 8: tiles 0-7 (rows 0-1), 8-15 (rows 1-3), 16-19 (row 3)
    assert _block_rows(20, 8, 5) == 3
    assert _block_rows(20, 5, 5) == 1 and _block_rows(20, 6, 5) == 2
    node, _ = _conv((2, 3, 6, 7))
    assert direct_flops(node) == 2 * (2 * 4 * 4 * 5) * (3 * 3 * 3)
