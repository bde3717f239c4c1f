"""The GEMM core's choices that need no compiler, against values worked out by hand from the docstrings of
``codegen/gemm.py``: panel packing of constant operands, K blocks, the transposed tile's leading dimension, the
register block, the cache blocking of each kind of problem (which operand is packed per tile) and the
balancing's comparison of efficiencies. The options are AVX2's (6 x 16 register block) whatever the host:
``gemm_mc`` 96, ``gemm_nc`` 256, ``gemm_kc`` 1024, ``gemm_wide`` 512, ``gemm_tile_floats`` 32768,
``gemm_min_tiles`` 4; ``balance_threads=()`` keeps the balancing out where the cache blocking is checked."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.codegen import CodegenOptions
from opfuse.codegen.gemm import (
    BALANCE_MIN_GAIN, Blocking, ColAccess, GemmProblem, Operand, balance_efficiency, balance_gain, balance_tiles,
    choose_blocking, k_blocks, microkernel_bodies, pack_a_panels, pack_b_panels, register_block, tile_costs,
    transposed_ld,
)

AVX2 = CodegenOptions(vector_isa="avx2").resolved("avx2")
AVX512 = CodegenOptions(vector_isa="avx512").resolved("avx512")
NEON = CodegenOptions(vector_isa="neon").resolved("neon")
NO_BALANCE = AVX2.with_(balance_threads=())


def _load(ev, b, i, j):
    return "0"


def _problem(M: int, N: int, K: int, *, a_static: bool, b_static: bool, b_in_place: bool = False, nb: int = 1,
             **kw) -> GemmProblem:
    a = Operand(_load, static=np.zeros((nb, M, K), np.float32) if a_static else None)
    b = Operand(_load, static=np.zeros((nb, K, N), np.float32) if b_static else None,
                cols=ColAccess(lambda b, k, n: "x", N) if b_in_place else None)
    return GemmProblem("p", nb, M, N, K, a, b, None, None, **kw)  # type: ignore[arg-type]


def test_options_are_the_ones_worked_out_below():
    o = NO_BALANCE
    assert (o.gemm_mr, o.gemm_nr, o.gemm_mc, o.gemm_nc, o.gemm_kc, o.gemm_wide, o.gemm_tile_floats,
            o.gemm_min_tiles) == (6, 16, 96, 256, 1024, 512, 32768, 4)


def test_pack_a_panels_interleaves_mr_rows_per_k_and_pads_with_zeros():
    a = np.arange(1, 7, dtype=np.float32).reshape(1, 3, 2)  # rows [1 2] [3 4] [5 6]
    got = pack_a_panels(a.astype(np.float64), 2)
    assert got.shape == (1, 2, 2, 2) and got.flags.c_contiguous and got.dtype == np.float32
    assert got[0, 0].tolist() == [[1, 3], [2, 4]]  # panel 0: rows 0 and 1, k = 0 then k = 1
    assert got[0, 1].tolist() == [[5, 0], [6, 0]]  # panel 1: row 2 and a zero row


def test_pack_b_panels_interleaves_nr_columns_per_k_and_pads_with_zeros():
    b = np.arange(1, 7, dtype=np.float32).reshape(1, 2, 3)  # rows [1 2 3] [4 5 6]
    got = pack_b_panels(b.astype(np.float64), 2)
    assert got.shape == (1, 2, 2, 2) and got.flags.c_contiguous and got.dtype == np.float32
    assert got[0, 0].tolist() == [[1, 2], [4, 5]]  # columns 0 and 1 per k
    assert got[0, 1].tolist() == [[3, 0], [6, 0]]  # column 2 and a zero column


def test_k_blocks_are_as_even_as_possible_and_at_most_kc():
    assert k_blocks(10, 1024) == 10
    assert k_blocks(1024, 512) == 512
    assert k_blocks(1000, 512) == 500      # two blocks of 500, not 512 + 488
    assert k_blocks(1025, 512) == 342      # three blocks: 342 + 342 + 341
    assert k_blocks(513, 512) == 257


def test_transposed_ld_pads_rows_that_are_a_multiple_of_1_kib():
    assert transposed_ld(96) == 96         # 384 bytes
    assert transposed_ld(256) == 272       # 1 KiB: one 64-byte line more
    assert transposed_ld(512) == 528
    assert transposed_ld(258) == 258


def test_register_block():
    assert register_block(_problem(5, 20, 3, a_static=True, b_static=False, register_block=(4, 8)), AVX2) == (4, 8)
    # one row: 1 x gemm_gemv_nr (48), or N rounded up to whole 8-float vectors where narrower
    assert register_block(_problem(1, 20, 3, a_static=False, b_static=True), AVX2) == (1, 24)
    assert register_block(_problem(1, 100, 3, a_static=False, b_static=True), AVX2) == (1, 48)
    assert register_block(_problem(1, 8, 3, a_static=False, b_static=True), AVX2) == (1, 8)
    assert register_block(_problem(2, 100, 3, a_static=False, b_static=True), AVX2) == (6, 16)
    assert register_block(_problem(1, 100, 3, a_static=False, b_static=True), AVX2.with_(gemm_gemv_nr=0)) == (6, 16)
    assert register_block(_problem(1, 100, 3, a_static=False, b_static=True), AVX2.with_(simd="none")) == (6, 16)
    # 1 x 200 needs 25 + 25 + 1 ymm registers: not an AVX2 block, so the options' one
    assert register_block(_problem(1, 300, 3, a_static=False, b_static=True), AVX2.with_(gemm_gemv_nr=200)) == (6, 16)


def test_single_row_register_block_of_each_isa():
    """1 x 128 is too wide for AVX2 (16 + 16 + 1 ymm) and fits AVX-512 (8 accumulators + 8 + 1 zmm); 1 x 12 is not
    whole ymm vectors but 3 NEON q registers (3 + 3 + 1 of 32). Elsewhere the options' block."""
    wide = _problem(1, 128, 3, a_static=False, b_static=True)
    assert register_block(wide, AVX512.with_(gemm_gemv_nr=128)) == (1, 128)
    assert register_block(wide, AVX2.with_(gemm_gemv_nr=128)) == (6, 16)
    assert register_block(wide, NEON.with_(gemm_gemv_nr=128)) == (6, 16)
    narrow = _problem(1, 20, 3, a_static=False, b_static=True)
    assert register_block(narrow, NEON.with_(gemm_gemv_nr=12)) == (1, 12)
    assert register_block(narrow, AVX2.with_(gemm_gemv_nr=12)) == (6, 16)
    assert register_block(narrow, AVX512.with_(gemm_gemv_nr=12)) == (8, 32)
    # 1 x 64 is 4 zmm accumulators, fewer than MIN_ZMM_ACCUMULATORS (8): the options' block (2 rows would fit)
    assert register_block(_problem(1, 64, 3, a_static=False, b_static=True), AVX512.with_(gemm_gemv_nr=64)) == (8, 32)
    # 1 x 60 on NEON: 15 + 15 + 1 q registers of 32 (2 rows would need 46)
    assert register_block(_problem(1, 60, 3, a_static=False, b_static=True), NEON.with_(gemm_gemv_nr=60)) == (1, 60)


def test_microkernel_bodies():
    assert microkernel_bodies(6, 16, "none", True) == "plain C"
    assert microkernel_bodies(6, 16, "auto", False) == "AVX2 / plain C by the compiler's target"
    assert microkernel_bodies(6, 12, "auto", False) == "plain C by the compiler's target"
    assert microkernel_bodies(8, 32, "auto", True) == "AVX-512F / AVX2 / plain C by the compiler's target"
    assert microkernel_bodies(1, 16, "auto", True) == "AVX2 / plain C by the compiler's target"  # 1 zmm: too few
    assert microkernel_bodies(6, 16, "auto", False, neon=True) == "NEON / AVX2 / plain C by the compiler's target"
    assert microkernel_bodies(6, 6, "auto", False, neon=True) == "plain C by the compiler's target"


def test_blocking_when_the_problem_gives_the_tile_rows():
    """``mc`` given (108): MC 108; NC from 32768 // 108 = 303: 288 columns, lowered to 240, a divisor of N = 720
    within a quarter (272 and 256 are not); 3 tiles, so halved while fewer than 4: 120 -> 112 (neither 112 nor 96
    divides 720): 7 tiles. K 2000 in two blocks of 1000. (Without the divisor: 288, then 144: 5 tiles.)"""
    p = _problem(108, 720, 2000, a_static=True, b_static=False, mc=108)
    assert choose_blocking(p, NO_BALANCE) == Blocking(108, 112, 1000)


def test_blocking_when_the_problem_caps_the_tile_columns():
    """``nc`` given (100): MC spans gemm_wide (M = 30: 30 rows), NC = min(100, 32768 // 30) -> 96, not a
    divisor of N = 160, but 80 is (within a quarter of 96): 2 tiles, so halved: 40 -> 32 (160 = 5 x 32):
    5 tiles."""
    p = _problem(30, 160, 8, a_static=False, b_static=True, nc=100)
    assert choose_blocking(p, NO_BALANCE) == Blocking(30, 32, 8)


def test_blocking_b_packed_per_tile():
    """A constant (weights), B packed per tile: MC spans gemm_wide (512, M = 64 rounds to 66, 11 panels);
    NC = min(32768 // 66, 256) -> the 208 columns of N = 200, then halved for 4 tiles: 104 -> 96 (3
    tiles), 48 (5 tiles)."""
    p = _problem(64, 200, 100, a_static=True, b_static=False)
    assert choose_blocking(p, NO_BALANCE) == Blocking(66, 48, 100)


def test_blocking_b_packed_per_tile_caps_the_columns_at_gemm_nc():
    """As above with N = 1000: NC = min(496, gemm_nc 256) -> 256 (no multiple of 16 divides 1000): 4 tiles, no cut.
    (Without the cap: 496, then 240.)"""
    p = _problem(64, 1000, 100, a_static=True, b_static=False)
    assert choose_blocking(p, NO_BALANCE) == Blocking(66, 256, 100)


def test_blocking_takes_a_divisor_three_quarters_down():
    """``nc`` 64 and N = 144: 64 does not divide 144, 48 (= 64 x 3 / 4, the last candidate) does: 3 tiles, and 48
    is fewer than 4 panels, so no cut."""
    p = _problem(30, 144, 8, a_static=False, b_static=True, nc=64)
    assert choose_blocking(p, NO_BALANCE) == Blocking(30, 48, 8)


def test_blocking_a_packed_per_tile():
    """B constant, A packed per tile: NC spans gemm_wide (N = 40: one 48-column tile), MC = min(32768 // 48,
    96) -> the 30 rows; 1 tile, but 48 columns are fewer than 4 panels: not cut."""
    p = _problem(30, 40, 8, a_static=False, b_static=True)
    assert choose_blocking(p, NO_BALANCE) == Blocking(30, 48, 8)


def test_blocking_constant_a_and_b_read_in_place():
    """Weights (A) and B read in place, nothing packed per tile: each weight panel serves all it can, MC spans
    gemm_wide (M = 200: 204 rows), NC = 32768 // 204 = 160 (no divisor of N = 200 among 160, 144, 128), 2 tiles,
    halved: 80 (80 and 64 do not divide 200; 3 tiles), 40 -> 32: 7 tiles. (As the default branch, gemm_mc: MC
    96 and NC 96.)"""
    p = _problem(200, 200, 100, a_static=True, b_static=False, b_in_place=True)
    assert choose_blocking(p, NO_BALANCE) == Blocking(204, 32, 100)


def test_blocking_sizes_are_whole_numbers():
    for p in (_problem(200, 200, 100, a_static=True, b_static=False, b_in_place=True),
              _problem(100, 1000, 8, a_static=False, b_static=True),
              _problem(64, 200, 100, a_static=True, b_static=False),
              _problem(100, 64, 10, a_static=False, b_static=False),
              _problem(100, 1000, 10, a_static=False, b_static=False),
              _problem(30, 2000, 8, a_static=False, b_static=True, nc=4000)):
        blk = choose_blocking(p, NO_BALANCE)
        assert all(type(v) is int for v in (blk.MC, blk.NC, blk.KC)), blk


def test_blocking_both_packed():
    """Both operands at run time (a MatMul of two activations): MC = gemm_mc (96), NC = 32768 // 96 -> the 64
    columns; 2 tiles, so NC is halved to 32 (a divisor): 4 tiles."""
    p = _problem(100, 64, 10, a_static=False, b_static=False)
    assert choose_blocking(p, NO_BALANCE) == Blocking(96, 32, 10)


def test_blocking_stops_cutting_at_gemm_min_tiles_counting_every_tile():
    """The tile count is batches x row tiles x column tiles, each rounded up, and cutting stops at 4 (not past it).
    Both packed, M = 384 (4 row tiles of 96), N = 128 (one tile of 128): 4 tiles, no cut. M = 100 (2 row tiles,
    the second 4 rows), N = 256: 2 tiles, then 128 columns: 4. A's packing per tile (B constant) with ``nc`` 64:
    M = 30 in one tile, N = 200 in 64-column tiles: 4 (the last 8 columns), no cut; in 64 rows of 100 (M = 100,
    N = 1000: NC 512, MC = 32768 // 512 = 64 -> 60 rows) 2 x 2 tiles."""
    assert choose_blocking(_problem(384, 128, 10, a_static=False, b_static=False), NO_BALANCE) == Blocking(96, 128, 10)
    assert choose_blocking(_problem(100, 256, 10, a_static=False, b_static=False), NO_BALANCE) == Blocking(96, 128, 10)
    assert choose_blocking(_problem(30, 200, 8, a_static=False, b_static=True, nc=64), NO_BALANCE) == \
        Blocking(30, 64, 8)
    assert choose_blocking(_problem(100, 1000, 8, a_static=False, b_static=True), NO_BALANCE) == Blocking(60, 512, 8)


def test_balance_gain_is_decided_at_the_first_thread_count_that_differs_enough():
    assert balance_gain((0.90,), (0.85,))
    assert not balance_gain((0.86,), (0.85,))           # below BALANCE_MIN_GAIN (0.02)
    assert balance_gain((BALANCE_MIN_GAIN,), (0.0,))    # exactly the minimum gain counts
    assert not balance_gain((0.80,), (0.85,))
    assert balance_gain((0.85, 0.90), (0.85, 0.80))     # equal at 2 threads: 4 decides
    assert not balance_gain((0.85, 0.70), (0.85, 0.80))
    assert balance_gain((0.90, 0.50), (0.85, 0.90))     # the first count that differs decides
    assert not balance_gain((0.85,), (0.85,))
    with pytest.raises(ValueError):
        balance_gain((0.85, 0.9), (0.85,))  # one efficiency per thread count, both sides


def test_balance_efficiency_hands_tiles_out_in_order():
    assert balance_efficiency([1.0, 1.0, 1.0], (2,)) == pytest.approx((0.75,))   # 3 tiles take 2 rounds
    assert balance_efficiency([2.0, 1.0, 1.0], (2,)) == pytest.approx((1.0,))    # 2 || 1 + 1
    assert balance_efficiency([1.0] * 4, (2, 3)) == pytest.approx((1.0, 2 / 3))  # 4 tiles on 3: 2 rounds


@pytest.mark.parametrize("bias, relu, what", [(False, False, "stored"), (True, False, "bias added and stored"),
                                              (False, True, "Relu applied and stored"),
                                              (True, True, "bias and Relu applied and stored")])
def test_the_report_says_what_the_micro_kernel_stores(bias, relu, what):
    """A 1x1 convolution (16 -> 32 channels, 8x8: 64 positions, whole 6 x 16 blocks along N) finished in the
    micro-kernel's registers: the kernel's notes (the report) and the C comment say what it applies before the
    store, with the node's name, and which micro-kernel bodies it has (AVX2's options: the AVX2 one)."""
    from cg_support import group_by_names
    from opfuse.codegen.program import generate
    from opfuse.ops import GraphBuilder
    rng = np.random.default_rng(0)
    b = GraphBuilder("g")
    args = [b.input("x", (1, 16, 8, 8)), b.const("w", rng.standard_normal((32, 16, 1, 1)).astype(np.float32))]
    if bias:
        args.append(b.const("bias", rng.standard_normal(32).astype(np.float32)))
    y = b.op("Conv", *args, kernel_shape=[1, 1], name="conv")
    if relu:
        y = b.op("Relu", y, name="relu")
    g = b.build(y)
    program = generate(g, group_by_names(g, [("k", ["conv", "relu"] if relu else ["conv"])]),
                       options=CodegenOptions(vector_isa="avx2"))
    note = f"GEMM 'conv': output {what} by the micro-kernel"
    notes = [n for k in program.kernels for n in k.notes]
    assert note in notes
    assert "GEMM 'conv': 6x16 micro-kernel, AVX2 / plain C by the compiler's target" in notes
    assert f"GEMM 'node_conv': output {what} by the micro-kernel" in program.source  # c_ident(name, "node")


def test_tile_costs_count_every_tile_from_the_first_row_and_column():
    # 13 rows in tiles of 6: 6, 6 and 1 (rounded up to a 6-row block); the same for 13 columns
    assert tile_costs(13, 16, 6, 16, 6, 16) == [96.0, 96.0, 96.0]
    assert tile_costs(16, 13, 16, 6, 16, 6) == [96.0, 96.0, 96.0]


def test_balancing_starts_at_parallel_min_work():
    """A 1x1 convolution as the GEMM core sees it (weights A 16 x K, activations B packed per tile, N = 64) in
    one 18 x 64 tile. 2 x M x N x K flops: with K = 16 exactly ``parallel_min_work`` (32768), so it is balanced;
    every candidate of 4 tiles or more beats the blocking's 1, and of those only 18 x 16 (4 column tiles) does
    not cut M (B would be packed again per row tile): 18 x 16. With K = 15 (30720 flops) the blocking stays.
    Two batches (K = 8: 32768 again): 2 tiles, and the fewest that reach 4 in all, without cutting M, are
    18 x 32 (2 x 2 tiles, evenly loaded like 18 x 16's 2 x 4)."""
    o = AVX2
    assert o.parallel_min_work == 32768 and o.balance_threads == (2,)
    assert balance_tiles(_problem(16, 64, 16, a_static=True, b_static=False), o, 6, 16, 18, 64) == (18, 16)
    assert balance_tiles(_problem(16, 64, 15, a_static=True, b_static=False), o, 6, 16, 18, 64) == (18, 64)
    assert balance_tiles(_problem(16, 64, 8, a_static=True, b_static=False, nb=2), o, 6, 16, 18, 64) == (18, 32)


@pytest.mark.parametrize("isa, note", [("avx2", "6x16 micro-kernel, AVX2 / plain C by the compiler's target"),
                                       ("avx512", "8x32 micro-kernel, AVX-512F / AVX2 / plain C by the compiler's "
                                                  "target"),
                                       ("neon", "6x16 micro-kernel, NEON / AVX2 / plain C by the compiler's target")])
def test_the_report_names_the_micro_kernel_bodies_of_the_isa(isa, note):
    """Each ISA's register block (REGISTER_BLOCKS) and the bodies its micro-kernel has: AVX-512's 8 x 32 (16 zmm
    accumulators) also an AVX2 body (32 is whole ymm vectors), NEON's 6 x 16 a NEON body first."""
    from opfuse.codegen.program import generate
    from opfuse.ops import GraphBuilder
    b = GraphBuilder("g")
    w = b.const("w", np.ones((32, 16, 1, 1), np.float32))
    g = b.build(b.op("Conv", b.input("x", (1, 16, 8, 8)), w, kernel_shape=[1, 1], name="conv"))
    program = generate(g, None, options=CodegenOptions(vector_isa=isa))
    assert f"GEMM 'conv': {note}" in [n for k in program.kernels for n in k.notes]


def test_balancing_tries_tiles_that_give_each_thread_the_same_panels():
    """mobilenet_v1's 14x14 pointwise layers as the GEMM core sees them (activations A packed per tile, M = 196
    positions in 14 panels of MR = 14, weights B 512 x 512): the blocking's 4 tiles of 56 rows are 4, 4, 4 and 2
    panels, 8 + 6 on 2 threads (efficiency 0.875), and the cuts near it (5-7 tiles) leave 8 + 6 too. With
    ``balance_even_panels`` the candidates include the largest tile within the blocking's whose panels each
    thread count divides evenly, 1 panel (14 tiles, 7 + 7; 7 panels would be larger than 56 rows): taken, as M
    cut further repacks nothing. Without it, or where the blocking is balanced already (M = 224: 4 tiles of 4
    panels) or no tile divides the panels evenly (M = 182: 13 panels), the balancing chooses as before."""
    def tiles(m: int, even: bool) -> tuple[int, int]:
        problem = _problem(m, 512, 512, a_static=False, b_static=True)
        return balance_tiles(problem, AVX2.with_(balance_even_panels=even), 14, 32, 56, 512)
    assert balance_efficiency(tile_costs(196, 512, 56, 512, 14, 32), (2,)) == pytest.approx((0.875,))
    assert tiles(196, True) == (14, 512) and tiles(196, False) == (56, 512)
    assert tiles(224, True) == tiles(224, False) == (56, 512)
    assert tiles(182, True) == tiles(182, False) == (42, 512)
