"""``codegen/winograd.py`` where mutation testing (tests/mutation/mutW.md, issue 13) found no test: the block size's
balancing for the threads (``_tiles_per_block``), the last round's split where no thread count leaves one
(``last_round_split``), the whole-plane epilogue refused where an operand of the epilogue is computed inline from a
value broadcast along the rows (``_plane_operands``), the last round's parts and a single block's parts for a
thread count of ``balance_threads`` other than 2 (``lower_winograd``), and the portable transforms' float32
arithmetic (``_combo``, compiled alone against NumPy's float32, bit for bit)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cg_support import assert_close, group_by_names
from opfuse.codegen import CodegenOptions
from opfuse.codegen.program import generate
from opfuse.codegen.winograd import F2, F4, LANES, _lane_stage, _tiles_per_block, last_round_split
from opfuse.ops import GraphBuilder
from test_avx512 import _compile


def test_tiles_per_block_balances_the_threads():
    """16 -> 16 channels, F(2x2) (alpha 4: 16 x 32 = 512 floats a tile, far from the L2 bound), NR 16, one image.
    87 tiles in ``gemm_min_tiles`` (4) blocks are 22 -> 32 a block: 3 blocks (32, 32, 23 -> 32), the third alone
    on the second of 2 threads (efficiency 0.75); 6 blocks of 16 share them evenly (1.0): 16. On one thread
    (``balance_threads`` empty) the first count stands: 32. The same for 1 -> 6 channels and 81 tiles, whose loop
    is worth threads (2 x 6 x 1 x 9 x 81 x 2 x 2 = 34992 FLOPs, ``parallel_min_work`` 32768), but not with a
    minimum above that. 199 tiles on 2 and 4 threads: 4 blocks of 50 -> 64 (64, 64, 64, 7 -> 16: 0.81 on both, as
    many blocks as the 4 threads, so balanced); 5 of 48 give 2 threads 0.93 (4 the same 0.81), as do 7 of 32 and
    13 of 16: the fewest blocks, 48."""
    o = CodegenOptions(vector_isa="avx2").resolved("avx2").with_(balance_threads=(2,))
    assert o.parallel_min_work == 32768 and o.gemm_min_tiles == 4
    assert _tiles_per_block(o, 16, 16, 87, 1, 4, 16) == 16
    assert _tiles_per_block(o.with_(balance_threads=()), 16, 16, 87, 1, 4, 16) == 32
    assert _tiles_per_block(o, 1, 6, 81, 1, 4, 16) == 16
    assert _tiles_per_block(o.with_(parallel_min_work=34993), 1, 6, 81, 1, 4, 16) == 32
    assert _tiles_per_block(o.with_(balance_threads=(2, 4)), 16, 16, 199, 1, 4, 16) == 48


def test_no_last_round_split_where_no_thread_count_leaves_one():
    """``last_round_split``: 7 blocks on 2 threads leave the seventh alone (split in 2), on 3 threads one too (3
    parts, at most the panels); 2 or 4 blocks on 2 threads, or 3 on 3, leave none: 0, no split (the loop then
    splits blocks only where there are fewer than ``gemm_min_tiles``)."""
    o = CodegenOptions(vector_isa="avx2").resolved("avx2")
    work = o.parallel_min_work
    two, three = o.with_(balance_threads=(2,)), o.with_(balance_threads=(3,))
    assert last_round_split(two, 7, 8, work) == 2
    assert last_round_split(three, 7, 8, work) == 3 and last_round_split(three, 7, 2, work) == 2
    assert last_round_split(two, 2, 8, work) == 0
    assert last_round_split(two, 4, 8, work) == 0
    assert last_round_split(three, 3, 8, work) == 0
    assert last_round_split(two, 7, 1, work) == 0   # one panel: nothing to split
    assert last_round_split(two, 7, 8, work - 1) == 0  # the loop runs on one thread


@pytest.mark.parametrize(("oc", "parts"), [(12, 2), (24, 3)])
def test_the_last_round_on_three_threads_splits_into_at_most_the_panels(oc, parts, cache_dir):
    """112 F(2x2) tiles (28x16 outputs) in blocks of 16 (``winograd_block_floats=1``: one panel width, AVX2's 6 x
    16): 7 blocks, on 3 threads (``balance_threads``) the seventh alone in the last round, so it is split in up to
    3 parts, at most its panels of 6 output channels: 12 channels are 2 panels, 2 parts; 24 are 4, 3 parts. The
    recorded loop says so (``parts`` slots a block, the last one's split evenly, the others' extra slots empty); 12
    channels on 1 and 3 threads give the same bits, the reference's values."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    from test_winograd import conv_block
    g, plan = conv_block(1, 32, oc, 28, 16, [1, 1, 1, 1])
    o = CodegenOptions(vector_isa="avx2", winograd="on", winograd_f4=False, winograd_block_floats=1,
                       balance_threads=(3,))
    program = generate(g, plan, options=o)
    assert "in blocks of 16" in program.source
    loop = next(k for k in program.kernels if k.parallel).parallel[0]
    assert loop.iterations == 7 * parts and loop.schedule == "dynamic"
    whole = (16.0,) + (0.0,) * (parts - 1)
    assert loop.costs == whole * 6 + (16.0 / parts,) * parts
    if oc == 12:
        feeds = reference.random_inputs(g, 0)
        one = build(g, plan, cache_dir=cache_dir, options=o, threads=1).run(feeds)
        three = build(g, plan, cache_dir=cache_dir, options=o, threads=3).run(feeds)
        assert_close(one, reference.run(g, feeds))
        for k in one:
            np.testing.assert_array_equal(one[k], three[k])


@pytest.mark.parametrize(("threads", "parts"), [((3,), 3), ((2, 3), 2), ((), 2)])
def test_a_single_shared_block_records_its_parts_for_the_first_thread_count(threads, parts):
    """8x8 outputs in F(2x2), 40 output channels: one block of 16 tiles, split by output channels into up to
    ``gemm_min_tiles`` (4) parts that share one input transform (``winograd_shared_transform``); the parts' loop
    runs min(threads, 4) of them, recorded at the first of ``balance_threads`` (2 where it is empty), each a part's
    share of the block's 16 tiles."""
    from test_winograd import conv_block
    g, plan = conv_block(1, 32, 40, 8, 8, [1, 1, 1, 1])
    o = CodegenOptions(winograd="on", winograd_shared_transform=True, balance_threads=threads)
    program = generate(g, plan, options=o)
    transform, split = next(k for k in program.kernels if k.parallel).parallel
    assert (transform.iterations, transform.schedule) == (32, "static")
    assert (split.iterations, split.schedule, split.costs) == (parts, "dynamic", (16.0 / parts,) * parts)


def _residual_scaled_along_rows(h: int = 10, w: int = 10, c: int = 32, oc: int = 48):
    """Conv (bias) -> Add(., res * rows) -> Relu, one group: ``res * rows`` (``rows`` of shape (1, 1, H, 1)) is
    computed inline in the epilogue, so its operand ``rows`` is indexed through it."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("wino_inline_rows")
    x = b.input("x", (1, c, h, w))
    wt = b.const("w", (rng.standard_normal((oc, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32))
    y = b.op("Conv", x, wt, b.const("bias", rng.standard_normal(oc).astype(np.float32)), kernel_shape=[3, 3],
             pads=[1, 1, 1, 1], name="conv")
    s = b.op("Mul", b.input("res", (1, oc, h, w)), b.input("rows", (1, 1, h, 1)), name="scaled")
    g = b.build(b.op("Relu", b.op("Add", y, s, name="add"), name="relu"))
    return g, group_by_names(g, [("conv_epilogue", ["conv", "scaled", "add", "relu"])])


@pytest.mark.parametrize("threads", [1, 2])
def test_an_operand_computed_inline_keeps_the_row_by_row_epilogue(threads, cache_dir):
    """10x10 outputs in F(2x2) are one block of whole-tile rows, where the epilogue may run over each plane as one
    row (``winograd_flat_epilogue``), but not here: the epilogue reads ``res * rows`` computed inline, whose
    ``rows`` would be indexed ``(0, 0, 0, p)`` over the flat plane (the first row's factor for every row). Row by
    row, with the reference's values."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, plan = _residual_scaled_along_rows()
    feeds = reference.random_inputs(g, 0)
    model = build(g, plan, cache_dir=cache_dir, threads=threads)
    notes = [n for k in model.program.kernels for n in k.notes]
    assert any("Winograd F(2x2,3x3)" in n for n in notes), notes
    assert not any("one row" in n for n in notes), notes
    assert_close(model.run(feeds), reference.run(g, feeds))


class _Lines:
    def __init__(self) -> None:
        self.text: list[str] = []

    def line(self, s: str) -> None:
        self.text.append(s)


def _combo_f32(coeffs, xs: list[np.ndarray]) -> np.ndarray:
    """``_combo``'s sum in float32: zero terms left out, +-1 without a multiply, every product and sum rounded to
    float32, left to right."""
    out = None
    for c, x in zip(coeffs, xs, strict=True):
        if c == 0:
            continue
        term = x if abs(c) == 1 else np.float32(float(abs(c))) * x
        out = (term if c > 0 else -term) if out is None else (out + term if c > 0 else out - term)
    return out if out is not None else np.zeros_like(xs[0])


@pytest.mark.parametrize("t", [F2, F4], ids=["F2", "F4"])
def test_portable_transform_stage_rounds_in_float32(t, tmp_path):
    """The plain C99 stage (``_lane_stage`` with ``simd="none"``: the portable build's transforms) of each row of
    ``B^T`` and ``A^T``, compiled alone (no FMA contraction), gives the bits of the same sums in NumPy's float32:
    its constants are float literals (a double one would make the whole sum double, one rounding at the end)."""
    rows = [*t.BT, *t.AT]
    n = t.alpha
    items = [(f"out + {i * LANES}", row, [f"src + {j * LANES}" for j in range(n)]) for i, row in enumerate(rows)]
    w = _Lines()
    _lane_stage(w, "none", "l", items)
    assert not any("#if" in ln for ln in w.text)
    lib = _compile(tmp_path, "void stage(const float* src, float* out) {\n" + "\n".join(w.text) + "\n}\n", [],
                   f"stage_{t.m}")
    fp = ctypes.POINTER(ctypes.c_float)
    rng = np.random.default_rng(11)
    for _ in range(4):
        src = (rng.standard_normal((n, LANES)) * rng.choice([1e-3, 1.0, 1e3], (n, LANES))).astype(np.float32)
        out = np.full((len(rows), LANES), np.nan, np.float32)
        lib.stage(src.ctypes.data_as(fp), out.ctypes.data_as(fp))
        want = np.stack([_combo_f32(row, list(src)) for row in rows])
        np.testing.assert_array_equal(out, want)


def test_the_report_names_the_gemm_bodies_and_the_epilogue_isas():
    """The kernel's notes (its comment and ``opfuse compile``'s report) say which micro-kernel bodies the batched
    GEMMs have and in which ISAs the epilogue runs: AVX2's body and ``#if`` chain on an AVX2 target, and the
    epilogue in AVX-512 then AVX2 intrinsics on an AVX-512 one (``winograd_avx512`` off: the GEMMs' 6 x 16)."""
    from test_winograd import _conv_with
    g, plan = _conv_with("silu")
    gemm = "Winograd GEMMs 'conv': 6x16 micro-kernel, AVX2 / plain C by the compiler's target; U (96 KiB) "
    for o, isas in ((CodegenOptions(vector_isa="avx2"), "avx2"),
                    (CodegenOptions(vector_isa="avx512", winograd_avx512=False), "avx512 / avx2")):
        notes = [n for k in generate(g, plan, options=o).kernels for n in k.notes]
        assert len(notes) == 4 and notes[1].startswith(gemm), notes
        assert notes[0] == "Conv 'conv': Winograd F(2x2,3x3) (32 -> 48 channels, output 10x10)"
        assert notes[2] == ("Winograd 'conv': infinite or NaN outputs of the transforms recomputed directly (the 3x3 "
                            "weights kept beside U: 54 KiB)")
        assert notes[3] == f"Winograd 'conv': epilogue in {isas} intrinsics"
