"""Depthwise convolution's three ways against the reference, and the portable C99 against AVX2:

* direct (AVX2): a stride-1 plane that keeps its size, of at most ``DIRECT_MAX_VECTORS`` vectors,
  read in place with masked loads at the edges, no padded copy;
* direct rows (AVX2): other planes of column stride 1 or 2, a row at a time (rows up to
  ``DIRECT_MAX_ROW_VECTORS`` vectors), stride 2 from the even or odd floats of two loads;
* wide: the padded copy computed as one row (stride 1, small planes), epilogue row by row;
* rows: one pass per output row (large or strided planes), epilogue over the dense plane.

Each with a fused epilogue (bias, Clip, and a residual Add read at the output's index), odd sizes,
a batch of two (planes of two images in one chunk), and chunks that do not divide the planes."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.depthwise import DIRECT_MAX_ROW_VECTORS, DIRECT_MAX_VECTORS, VECTOR, plane_chunk
from opfuse.ops import GraphBuilder

def _rng(*key) -> np.random.Generator:
    """A generator seeded by ``key`` (a constant's name and shape): the same constants whatever ran before, so a
    mutation run's fork builds the C the unmutated run built (a module-level generator made them depend on the
    order of the tests)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _c(b, name, *shape):
    return b.const(name, (_rng(name, shape).standard_normal(shape) / 3).astype(np.float32))


def dw_graph(c, h, w, k, stride, pads, dilation=1, prologue=False, residual=False, n=2):
    b = GraphBuilder("dw")
    x = b.input("x", (n, c, h, w))
    src = b.op("Relu", x, name="pre") if prologue else x
    y = b.op("Conv", src, _c(b, "w", c, 1, k, k), _c(b, "bias", c), kernel_shape=[k, k], strides=[stride, stride],
             pads=pads, dilations=[dilation, dilation], group=c, name="dw")
    names = (["pre"] if prologue else []) + ["dw"]
    if residual:
        y = b.op("Add", y, b.input("r", y.shape), name="res")
        names.append("res")
    g = b.build(b.op("Clip", y, b.const("lo", np.float32(0)), b.const("hi", np.float32(6)), name="clip"))
    return g, group_by_names(g, [("conv_epilogue", [*names, "clip"])])


DIRECT = [  # stride 1, output the size of the input, at most DIRECT_MAX_VECTORS vectors
    (8, 6, 6, 3, 1, [1, 1, 1, 1], 1),
    (5, 3, 3, 3, 1, [1, 1, 1, 1], 1),       # 9 floats: one full vector and one lane
    (3, 7, 9, 3, 1, [1, 1, 1, 1], 1),       # odd sizes
    (4, 16, 16, 3, 1, [1, 1, 1, 1], 1),     # exactly DIRECT_MAX_VECTORS vectors
    (3, 9, 11, 5, 1, [2, 2, 2, 2], 1),      # 5x5: 25 taps
    (3, 10, 12, 3, 1, [2, 2, 2, 2], 2),     # dilated
    (3, 8, 7, 3, 1, [0, 2, 2, 0], 1),       # asymmetric pads, still "same"
]
DIRECT_ROWS = [  # the same, larger, rows of at most DIRECT_MAX_ROW_VECTORS vectors
    (3, 16, 17, 3, 1, [1, 1, 1, 1], 1),     # one vector too many for the whole plane
    (8, 13, 21, 3, 1, [1, 1, 1, 1], 1),
    (2, 50, 50, 3, 1, [1, 1, 1, 1], 1),
    (2, 12, 33, 5, 1, [2, 2, 2, 2], 1),     # 5x5: two rows at each edge leave kernel rows out
    (2, 11, 30, 3, 1, [2, 2, 2, 2], 2),     # dilated
    (2, 4, 128, 3, 1, [1, 1, 1, 1], 1),     # rows of exactly DIRECT_MAX_ROW_VECTORS vectors
    (6, 17, 19, 3, 2, [1, 1, 1, 1], 1),     # stride 2: even and odd floats of two loads
    (4, 12, 12, 3, 2, [0, 0, 1, 1], 1),     # mobilenet's stride-2 padding
    (3, 28, 28, 3, 2, [1, 1, 1, 1], 1),
    (2, 9, 40, 5, 2, [2, 1, 2, 2], 2),      # 5x5, dilated, asymmetric
    (3, 9, 9, 3, 1, [0, 0, 0, 0], 1),       # valid: the output is smaller than the input
    (2, 40, 40, 3, 1, [0, 0, 0, 0], 1),
]
COPIED = [
    (2, 5, 130, 3, 1, [1, 1, 1, 1], 1),     # rows too long: the wide copy
    (1, 20, 140, 3, 1, [1, 1, 1, 1], 1),    # 3124 padded floats: one pass per row
    (5, 11, 12, 5, 3, [2, 1, 2, 2], 1),     # 5x5 stride 3, asymmetric pads: three column phases
    (2, 9, 300, 3, 2, [1, 1, 1, 1], 1),     # stride 2, rows too long: two column phases
]


def test_the_cases_cover_the_ways():
    for _c, h, w, *_ in DIRECT:
        assert -(-h * w // VECTOR) <= DIRECT_MAX_VECTORS
    for _c, _h, w, _k, stride, *_ in DIRECT_ROWS:
        assert stride in (1, 2) and -(-w // stride // VECTOR) <= DIRECT_MAX_ROW_VECTORS
    assert -(-130 // VECTOR) > DIRECT_MAX_ROW_VECTORS and -(-150 // VECTOR) > DIRECT_MAX_ROW_VECTORS


def _direct_rows_source(src: str) -> bool:
    return "_mm256_maskload_ps" in src and "const float* row" in src


@pytest.mark.parametrize("case", DIRECT + DIRECT_ROWS + COPIED)
@pytest.mark.parametrize("residual", [False, True])
def test_depthwise_against_reference_avx2_and_portable(case, residual, cache_dir):
    g, plan = dw_graph(*case, residual=residual)
    simd, want, m1 = run_both(g, plan, cache_dir)
    portable, _, m0 = run_both(g, plan, cache_dir, options=CodegenOptions(simd="none"))
    assert_close(simd, want)
    assert_close(portable, want)
    assert_close(simd, portable)
    assert "_mm256_" not in m0.program.source
    # The path taken, read from the AVX2 body's C (an AVX-512 host also has a zmm body, which runs the
    # rows path for the small planes too: test_depthwise_avx512).
    avx2 = generate(g, plan, options=CodegenOptions(vector_isa="avx2")).source
    assert ("_mm256_maskload_ps" in avx2) == (case not in COPIED)
    assert _direct_rows_source(avx2) == (case in DIRECT_ROWS)
    assert m1.report["kernels"] == 1


@pytest.mark.parametrize("case", [DIRECT[0], DIRECT_ROWS[0], DIRECT_ROWS[6]])
def test_a_computed_input_is_copied_through_its_prologue(case, cache_dir):
    """A prologue (Relu before the conv, in the group) is not in memory: no direct path."""
    g, plan = dw_graph(*case, prologue=True)
    got, want, model = run_both(g, plan, cache_dir)
    assert_close(got, want)
    assert "_mm256_maskload_ps" not in model.program.source


@pytest.mark.parametrize("case", [DIRECT[0], DIRECT_ROWS[2], DIRECT_ROWS[6], COPIED[0], COPIED[2]])
def test_threads_do_not_change_depthwise_results(case, cache_dir):
    g, plan = dw_graph(*case, n=3)
    one, _, _ = run_both(g, plan, cache_dir, threads=1)
    two, _, _ = run_both(g, plan, cache_dir, threads=2)
    for k in one:
        np.testing.assert_array_equal(one[k], two[k])


def test_plane_chunks():
    o = CodegenOptions()
    assert plane_chunk(512, o) == o.depthwise_chunk_planes  # many planes: whole chunks
    assert plane_chunk(64, o) == 64 // o.depthwise_min_chunks  # enough chunks for the threads
    assert plane_chunk(8, o) == 1
    with pytest.raises(Exception, match="depthwise_chunk_planes"):
        CodegenOptions(depthwise_chunk_planes=0)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the reference's 0 * inf
@pytest.mark.parametrize("case", [DIRECT[0], DIRECT_ROWS[1], DIRECT_ROWS[6]])
def test_an_infinite_weight_next_to_padding_gives_nan_as_in_the_reference(case, cache_dir):
    """The in-place paths leave out taps that fall wholly in the padding; 0 * inf is NaN in the
    reference, so weights that are not all finite take the padded copy."""
    g, plan = dw_graph(*case)
    w = next(v for v in g.constants if v.name == "w")
    w.const = w.const.copy()
    w.const[1, 0, 0, 0] = np.inf
    got, want, model = run_both(g, plan, cache_dir)
    assert np.isnan(next(iter(want.values()))).any()
    assert_close(got, want)
    assert "_mm256_maskload_ps" not in model.program.source


def test_an_output_vector_whose_taps_all_fall_in_the_padding(cache_dir):
    """A 1x2 plane, a 3x3 kernel dilated by 2 with pads (1, 0, 3, 4): output row 0 reads input
    rows -1, 1 and 3, all padding, so no tap reaches the only vector of the direct AVX2 path.
    The vector is zero (the weights are finite); before, the generated C named an undeclared
    variable and did not compile (found by the random end-to-end test)."""
    b = GraphBuilder("dw_all_padding")
    x = b.input("x", (1, 1, 1, 2), np.float32)
    w = b.const("w", np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3))
    y = b.op("Relu", b.op("Conv", x, w, dilations=[2, 2], pads=[1, 0, 3, 4], name="dw"), name="relu")
    g = b.build(y)
    plan = group_by_names(g, [("dw", ["dw", "relu"])])
    simd, want, m1 = run_both(g, plan, cache_dir)
    portable, _, _ = run_both(g, plan, cache_dir, options=CodegenOptions(simd="none"))
    assert "_mm256_setzero_ps" in m1.program.source
    assert_close(simd, want)
    assert_close(portable, want)


# The register epilogue (``depthwise.register_epilogue``): the in-place paths finish bias, Relu and
# Clips with constant bounds on the vectors and store them, the last vector of a row (or of a direct
# plane) lane by lane. The same operations in the same order as the scalar epilogue: same bits.
REGISTER_OFF = CodegenOptions(depthwise_register_epilogue=False)
NOTE = "epilogue finished in registers"


def act_graph(c, h, w, stride, acts, *, bias=True, n=1, weights=None, pads=(1, 1, 1, 1)):
    """Depthwise 3x3 then ``acts`` (``"relu"``, ``("clip", lo, hi)``, ``"clip_input"``: a Clip whose
    maximum is a model input, ``"add"``: a residual, or an ONNX op of one input by its name), all in one group."""
    b = GraphBuilder("dw_act")
    x = b.input("x", (n, c, h, w))
    wt = b.const("w", weights if weights is not None else
                 (_rng("w", c, h, w).standard_normal((c, 1, 3, 3)) / 3).astype(np.float32))
    ins = [x, wt] + ([_c(b, "bias", c)] if bias else [])
    y = b.op("Conv", *ins, kernel_shape=[3, 3], strides=[stride, stride], pads=list(pads), group=c, name="dw")
    names = ["dw"]
    for i, a in enumerate(acts):
        name = f"a{i}"
        if a == "relu":
            y = b.op("Relu", y, name=name)
        elif a == "add":
            y = b.op("Add", y, b.input("r", y.shape), name=name)
        elif isinstance(a, str) and a[:1].isupper():  # an ONNX op of one input: "Softplus", "Tanh", ...
            y = b.op(a, y, name=name)
        elif a == "clip_input":
            y = b.op("Clip", y, b.const(f"lo{i}", np.float32(0)), b.input("hi", ()), name=name)
        else:
            _, lo, hi = a
            y = b.op("Clip", y, *(b.const(f"{k}{i}", np.float32(v)) if v is not None else None
                                  for k, v in (("lo", lo), ("hi", hi))), name=name)
        names.append(name)
    g = b.build(y)
    return g, group_by_names(g, [("conv_epilogue", names)])


# (C, H, W, stride), the rows path with rows of at least PLANE_EPILOGUE_MAX_ROW floats: the last
# vector of a row keeps 1 to 7 lanes.
TAILS = [
    (2, 16, 17, 1),   # 17 a row: a last vector of 1 lane (272 floats: too many for the direct plane)
    (2, 15, 18, 1),   # 2 lanes
    (2, 11, 27, 1),   # 3 lanes
    (3, 28, 28, 1),   # mobilenet_v1's dw5, 4 lanes
    (2, 12, 29, 1),   # 5 lanes
    (2, 9, 30, 1),    # 6 lanes
    (2, 10, 31, 1),   # 7 lanes
    (2, 9, 50, 2),    # stride 2: 25 a row, 1 lane
    (2, 13, 45, 2),   # 23 a row, 7 lanes
    (3, 56, 56, 2),   # dw4: 28 a row, 4 lanes
]
# In place, but the epilogue is one loop over the dense plane: the direct plane, and rows shorter
# than PLANE_EPILOGUE_MAX_ROW.
DENSE_EPILOGUE = [(3, 5, 5, 1), (2, 7, 9, 1), (2, 14, 14, 1), (2, 13, 14, 2), (2, 12, 12, 2)]
ACTS = [(), ("relu",), (("clip", 0.0, 6.0),), (("clip", None, 0.5), "relu"), (("clip", -0.25, None),)]


@pytest.mark.parametrize("case", TAILS + DENSE_EPILOGUE)
@pytest.mark.parametrize("acts", ACTS)
def test_register_epilogue_matches_the_scalar_one_bitwise(case, acts, cache_dir):
    g, plan = act_graph(*case, acts, n=2)
    on, want, m_on = run_both(g, plan, cache_dir)
    off, _, m_off = run_both(g, plan, cache_dir, options=REGISTER_OFF)
    portable, _, _ = run_both(g, plan, cache_dir, options=CodegenOptions(simd="none"))
    assert_close(on, want)
    assert_close(portable, want)
    for k in on:
        np.testing.assert_array_equal(on[k], off[k])
    assert "_mm256_maskload_ps" in m_on.program.source  # in place
    assert any(NOTE in note for k in m_on.program.kernels for note in k.notes) == (case in TAILS)
    assert not any(NOTE in note for k in m_off.program.kernels for note in k.notes)
    if case in TAILS and ((case[2] - 1) // case[3] + 1) % VECTOR:  # the row's last vector lane by lane
        assert any(f"{store}(" in m_on.program.source for store in ("_mm_store_ss", "_mm_storel_pi", "_mm_storeu_ps"))
    if case in DENSE_EPILOGUE:  # AVX2's body keeps the dense pass (the AVX-512 rows body finishes short rows too)
        on_src, off_src = (generate(g, plan, options=o.with_(vector_isa="avx2")).source
                           for o in (CodegenOptions(), REGISTER_OFF))
        assert on_src == off_src


@pytest.mark.parametrize("case", [TAILS[0], TAILS[4], TAILS[8]])
def test_register_epilogue_keeps_nan_and_negative_zero(case, cache_dir):
    """``max(0, y)`` is ``y`` where ``y`` is NaN or -0, as ``y < 0 ? 0 : y``: an input with NaNs, and
    a zero input through negative weights and no bias (every sum -0), give the scalar epilogue's
    bits."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    c = case[0]
    for nan in (True, False):
        weights = -np.abs(_rng("negative", case).standard_normal((c, 1, 3, 3))).astype(np.float32) - 0.1
        g, plan = act_graph(*case, ("relu", ("clip", -1.0, 1.0)), bias=nan, weights=weights)
        feeds = reference.random_inputs(g, 0)
        if nan:
            feeds["x"].reshape(-1)[::7] = np.nan
        else:
            feeds["x"][...] = 0.0
        outs = [build(g, plan, cache_dir=cache_dir, options=o).run(feeds) for o in (CodegenOptions(), REGISTER_OFF)]
        want = reference.run(g, feeds)
        y, y_off = (next(iter(o.values())) for o in outs)
        np.testing.assert_array_equal(y, y_off)
        np.testing.assert_array_equal(np.signbit(y), np.signbit(y_off))
        assert_close(outs[0], want)
        if nan:
            assert np.isnan(y).any()
        else:
            assert np.signbit(y).all() and not y.any()


@pytest.mark.parametrize("acts, why", [
    (("add",), "a residual Add reads a second input"),
    (("clip_input",), "a Clip bound read at run time"),
    (("relu", "add"), "an Add after the Relu"),
])
def test_register_epilogue_refused_where_the_epilogue_is_not_relu_or_constant_clip(acts, why, cache_dir):
    g, plan = act_graph(*TAILS[1], acts, n=2)
    got, want, m = run_both(g, plan, cache_dir)
    assert_close(got, want)
    assert not any(NOTE in note for k in m.program.kernels for note in k.notes), why
    assert "_mm256_maskload_ps" in m.program.source  # still the in-place path


def test_register_epilogue_refused_on_the_copy_path(cache_dir):
    """The padded copy (rows longer than DIRECT_MAX_ROW_VECTORS vectors) keeps the scalar epilogue."""
    g, plan = act_graph(2, 5, 140, 1, ("relu",))
    got, want, m = run_both(g, plan, cache_dir)
    assert_close(got, want)
    assert "_mm256_maskload_ps" not in m.program.source
    assert not any(NOTE in note for k in m.program.kernels for note in k.notes)


@pytest.mark.parametrize("case", [TAILS[0], TAILS[6], TAILS[9]])
def test_register_epilogue_two_threads_equal_one(case, cache_dir):
    g, plan = act_graph(*case, ("relu",), n=3)
    one, _, _ = run_both(g, plan, cache_dir, threads=1)
    two, _, _ = run_both(g, plan, cache_dir, threads=2)
    for k in one:
        np.testing.assert_array_equal(one[k], two[k])


@pytest.mark.parametrize("row_block, block_group", [(1, 1), (3, 2), (4, 16)])
def test_row_and_vector_blocking_change_no_bit(row_block, block_group, cache_dir):
    """``depthwise_row_block`` and ``depthwise_block_group`` only reorder independent chains: each
    element's taps are summed in the same order, so the bits are the default's."""
    for case in (TAILS[3], TAILS[9], DIRECT_ROWS[3]):
        g, plan = act_graph(*case[:4], ("relu",), n=2) if len(case) == 4 else dw_graph(*case)
        base, want, _ = run_both(g, plan, cache_dir)
        other, _, m = run_both(g, plan, cache_dir, options=CodegenOptions(depthwise_row_block=row_block,
                                                                           depthwise_block_group=block_group))
        assert_close(other, want)
        for k in base:
            np.testing.assert_array_equal(base[k], other[k])


def test_bad_blocking_is_refused():
    for field in ("depthwise_row_block", "depthwise_block_group"):
        with pytest.raises(Exception, match=field):
            CodegenOptions(**{field: 0})


@pytest.mark.parametrize("case", [TAILS[1], TAILS[3], TAILS[9]])
def test_the_else_branch_of_the_vector_source_without_avx2(case, cache_dir):
    """The same "auto" source compiled without ``-march=native`` (no AVX2 macros) takes the ``#else``
    branch of the in-place paths: the padded copy and the scalar epilogue, as the plain C99 build."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, plan = act_graph(*case, (("clip", 0.0, 6.0),), n=2)
    feeds = reference.random_inputs(g, 0)
    generic = build(g, plan, cache_dir=cache_dir, native=False)
    assert "_mm256_maskload_ps" in generic.program.source and "-march=native" not in generic.toolchain.flags
    portable = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(simd="none"))
    got, plain = generic.run(feeds), portable.run(feeds)
    assert_close(got, reference.run(g, feeds))
    for k in got:
        np.testing.assert_array_equal(got[k], plain[k])


VECTOR_NOTE = "epilogue over the plane or its rows in"
VECTOR_OFF = CodegenOptions(depthwise_vector_epilogue=False)


@pytest.mark.parametrize("case", DENSE_EPILOGUE + [TAILS[0], TAILS[8], TAILS[9]])
@pytest.mark.parametrize("acts", [("Softplus",), ("Sigmoid", "relu"), ("Tanh",), ("Exp", "Log"), ("Silu",)])
def test_exp_and_log_epilogues_run_in_vectors_bit_for_bit(case, acts, cache_dir):
    """An epilogue with an exp- or log-based op over the dense plane or the rows runs in intrinsics (gcc left the
    scalar loop lane by lane: Softplus fused after a depthwise 3x3 ran 1.29x its ops unfused), the scalar
    operations in their order: the same bits as the scalar loop, in the AVX-512 and the AVX2 builds."""
    g, plan = act_graph(*case, acts, n=2)
    on, want, m_on = run_both(g, plan, cache_dir)
    off, _, m_off = run_both(g, plan, cache_dir, options=VECTOR_OFF)
    assert_close(on, want)
    for k in on:
        np.testing.assert_array_equal(on[k], off[k])
    assert any(VECTOR_NOTE in note for k in m_on.program.kernels for note in k.notes)
    assert not any(VECTOR_NOTE in note for k in m_off.program.kernels for note in k.notes)
    avx2, _, m2 = run_both(g, plan, cache_dir, options=CodegenOptions(vector_isa="avx2"))
    avx2_off, _, _ = run_both(g, plan, cache_dir, options=VECTOR_OFF.with_(vector_isa="avx2"))
    for k in on:
        np.testing.assert_array_equal(avx2[k], avx2_off[k])
    assert "_mm512" not in m2.program.source


@pytest.mark.parametrize("acts", [(), ("relu",), (("clip", 0.0, 6.0),), ("Abs",)])
def test_epilogues_gcc_vectorises_keep_their_scalar_loop(acts, cache_dir):
    """Relu, Clip and affine or sign ops: gcc vectorises the scalar loop itself, which stays (the zoo's C unchanged)."""
    g, plan = act_graph(*DENSE_EPILOGUE[2], acts, n=2)
    got, want, m = run_both(g, plan, cache_dir)
    assert_close(got, want)
    assert not any(VECTOR_NOTE in note for k in m.program.kernels for note in k.notes)
    assert generate(g, plan, options=CodegenOptions()).source == generate(g, plan, options=VECTOR_OFF).source


@pytest.mark.parametrize("acts, overlap", [(("Softplus",), True), (("Softplus", "add"), False)])
def test_a_plane_ends_in_a_vector_that_overlaps_the_last_one_unless_it_reads_another_operand(acts, overlap, cache_dir):
    """25 results a plane: AVX2 takes 3 vectors and then the vector of the last 8 (recomputing 7: the same values)
    instead of a scalar element; not where the epilogue also reads an operand along the plane (a residual), which an
    output stored in place may have overwritten. The same bits either way."""
    import re
    g, plan = act_graph(3, 5, 5, 1, acts, n=2)
    on, want, m_on = run_both(g, plan, cache_dir, options=CodegenOptions(vector_isa="avx2"))
    off, _, _ = run_both(g, plan, cache_dir, options=VECTOR_OFF.with_(vector_isa="avx2"))
    assert_close(on, want)
    for k in on:
        np.testing.assert_array_equal(on[k], off[k])
    assert bool(re.search(r"= 25 - 8;", m_on.program.source)) == overlap
    assert any(VECTOR_NOTE in note for k in m_on.program.kernels for note in k.notes)


BATCH_OFF = CodegenOptions(depthwise_batch_epilogue_below=0)


@pytest.mark.parametrize("case, acts", [((37, 7, 7, 1), ("Softplus",)), ((20, 3, 3, 1), ("Sigmoid", "relu")),
                                        ((64, 14, 14, 1), ("Exp", "Log"))])
def test_small_planes_run_their_epilogue_once_over_the_chunk(case, acts, cache_dir):
    """Planes of fewer than ``depthwise_batch_epilogue_below`` floats (a 7 x 7 plane is three AVX-512 vectors, each
    exp chain waiting on its latency) are biased one by one into the chunk's scratch and finished by one vector loop
    over the chunk: the same bits as plane by plane, at 1 and 2 threads, in the AVX-512 and AVX2 builds, the
    chunk of 3 images x 37 channels ending short. The direct plane's path: where the host's FMA pipes are zmm wide
    (``depthwise_avx512`` on) the zmm bodies run these planes by rows instead, so it is pinned off here."""
    g, plan = act_graph(*case, acts, n=3)
    direct = CodegenOptions(depthwise_avx512=False)
    on, want, m_on = run_both(g, plan, cache_dir, options=direct)
    assert_close(on, want)
    assert "dplane" in m_on.program.source
    for options in (BATCH_OFF.with_(depthwise_avx512=False), direct.with_(vector_isa="avx2"),
                    BATCH_OFF.with_(vector_isa="avx2")):
        got, _, m = run_both(g, plan, cache_dir, options=options)
        assert ("dplane" in m.program.source) == (options.depthwise_batch_epilogue_below > 0)
        for k in on:
            np.testing.assert_array_equal(got[k], on[k])
    two, _, _ = run_both(g, plan, cache_dir, threads=2, options=direct)
    for k in on:
        np.testing.assert_array_equal(two[k], on[k])


def test_an_epilogue_reading_a_channel_operand_stays_plane_by_plane(cache_dir):
    """A per-channel scale in the epilogue varies along the chunk's flat range: no batch, the vectors per plane."""
    b = GraphBuilder("dw_scale")
    c = 24
    x = b.input("x", (2, c, 7, 7))
    y = b.op("Conv", x, _c(b, "w", c, 1, 3, 3), _c(b, "bias", c), kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=c,
             name="dw")
    y = b.op("Sigmoid", b.op("Mul", y, _c(b, "scale", 1, c, 1, 1), name="scale"), name="act")
    g = b.build(y)
    plan = group_by_names(g, [("conv_epilogue", ["dw", "scale", "act"])])
    got, want, m = run_both(g, plan, cache_dir)
    assert_close(got, want)
    assert "dplane" not in m.program.source
    assert any(VECTOR_NOTE in note for k in m.program.kernels for note in k.notes)
