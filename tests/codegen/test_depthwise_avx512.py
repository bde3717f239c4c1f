"""The AVX-512 bodies of depthwise convolution's in-place paths (``CodegenOptions(depthwise_avx512=True)``
with ``vector_isa="avx512"``): the rows path and the whole-plane path in zmm, 16 floats a vector,
``#if``-ed before the AVX2 bodies.

Each element sums its taps in the same order (kernel row, then column; a multiply, then
multiply-adds) in the zmm and the ymm bodies, so the two give the same bits: checked against
the AVX2 body built from the same options with ``depthwise_avx512=False`` and against the same
source compiled with ``-mno-avx512f`` (its ``#elif`` AVX2 branch), and within float32 rounding
against the reference and the plain C99 build. The cases cover stride 1 and 2, row widths that
are no multiple of 16 (tails of 1 to 15 lanes: masked stores; edge loads shifted by ``valignd``,
or masked where a row is narrower than 16), rows narrower than a vector, padding at every edge,
5x5 and dilated kernels, and each epilogue (none, Relu, Relu6, a Clip then a Relu, HardSwish and a
residual Add, the last two through the scalar epilogue). The generated text is checked on any
machine; the runs are skipped where the CPU has no AVX-512F. Several layers share one model (each
its own kernel) to keep the builds few."""
from __future__ import annotations

import dataclasses
import platform

import numpy as np
import pytest

from cg_support import assert_close, group_by_names
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.depthwise import DIRECT_MAX_VECTORS, VECTOR, ZMM
from opfuse.ops import GraphBuilder
from opfuse.targets import host_simd_isa

ZMM_ON = CodegenOptions(vector_isa="avx512", depthwise_avx512=True)
ZMM_OFF = CodegenOptions(vector_isa="avx512", depthwise_avx512=False)
PORTABLE = CodegenOptions(simd="none")
HOST_HAS_AVX512 = host_simd_isa() == "avx512" and platform.machine().lower() in ("x86_64", "amd64")
needs_avx512 = pytest.mark.skipif(not HOST_HAS_AVX512, reason="the CPU has no AVX-512F: the zmm bodies cannot run here")
ZMM_GUARD = "#if defined(__AVX512F__) && defined(__FMA__)"
AVX2_GUARD = "if defined(__AVX2__) && defined(__FMA__)"
AVX2_ELIF = "#el" + AVX2_GUARD

# (C, H, W, kernel, stride, pads, dilation): in place, rows path unless H * W <= 256 (whole plane).
CASES = [
    (3, 12, 8, 3, 1, [1, 1, 1, 1], 1),      # whole plane, 96 floats: 6 zmm
    (2, 14, 14, 3, 1, [1, 1, 1, 1], 1),     # whole plane, 196 floats: last zmm of 4 lanes
    (2, 7, 7, 3, 1, [1, 1, 1, 1], 1),       # whole plane, 49 floats: 1 lane
    (2, 16, 17, 3, 1, [1, 1, 1, 1], 1),     # rows of 17: 16 + 1
    (2, 20, 24, 3, 1, [1, 1, 1, 1], 1),     # rows of 24: 16 + 8
    (2, 11, 40, 3, 1, [1, 1, 1, 1], 1),     # rows of 40: 16 + 16 + 8
    (2, 4, 128, 3, 1, [1, 1, 1, 1], 1),     # rows of 128: 8 whole zmm
    (2, 12, 33, 5, 1, [2, 2, 2, 2], 1),     # 5x5, rows of 33
    (2, 11, 30, 3, 1, [2, 2, 2, 2], 2),     # dilated
    (2, 40, 40, 3, 1, [0, 0, 0, 0], 1),     # valid: rows of 38
    (2, 9, 40, 3, 2, [1, 1, 1, 1], 1),      # stride 2, rows of 20
    (3, 28, 28, 3, 2, [0, 0, 1, 1], 1),     # mobilenet's stride-2 padding, rows of 14: the dense epilogue
    (2, 17, 48, 3, 2, [1, 1, 1, 1], 1),     # stride 2, rows of 24
    (2, 13, 45, 3, 2, [1, 1, 1, 1], 1),     # stride 2, odd width, rows of 23
    (2, 9, 40, 5, 2, [2, 1, 2, 2], 2),      # 5x5, stride 2, dilated, asymmetric
    (2, 8, 64, 3, 2, [1, 1, 1, 1], 1),      # stride 2, rows of 32: 2 whole zmm
    (2, 5, 19, 3, 1, [0, 0, 0, 0], 1),      # valid, 3 rows of 17 through the scalar epilogue (blocks of 3 rows below)
    (2, 30, 10, 3, 1, [1, 1, 1, 1], 1),     # rows path, input rows narrower than a zmm: masked loads
    (2, 40, 12, 3, 2, [1, 1, 1, 1], 1),     # the same, stride 2
    (2, 25, 5, 3, 1, [1, 1, 1, 1], 1),      # whole plane of many short rows (ds_cnn): the zmm plane, not rows
    (2, 10, 10, 5, 1, [2, 2, 2, 2], 1),     # whole plane, 5x5: taps two blocks away
    (2, 12, 12, 3, 1, [2, 2, 2, 2], 2),     # whole plane, dilated
]
EPILOGUES = ["none", "relu", "relu6", "clip_relu", "hardswish", "add"]


def multi_graph(cases, shift: int = 0):
    """One model of independent depthwise layers (each its own group and kernel), layer ``i`` with
    epilogue ``EPILOGUES[(i + shift) % len(EPILOGUES)]``."""
    b = GraphBuilder("dw_zmm")
    rng = np.random.default_rng(16 + shift)  # per graph: the same constants whatever ran before (mutation runs)
    outs, spec = [], []
    for i, (c, h, w, k, s, pads, d) in enumerate(cases):
        x = b.input(f"x{i}", (1, c, h, w))
        wt = b.const(f"w{i}", (rng.standard_normal((c, 1, k, k)) / 3).astype(np.float32))
        bias = b.const(f"b{i}", (rng.standard_normal(c) / 3).astype(np.float32))
        y = b.op("Conv", x, wt, bias, kernel_shape=[k, k], strides=[s, s], pads=pads, dilations=[d, d], group=c,
                 name=f"dw{i}")
        names = [f"dw{i}"]
        epi = EPILOGUES[(i + shift) % len(EPILOGUES)]
        if epi == "relu":
            y = b.op("Relu", y, name=f"e{i}")
        elif epi == "relu6":
            y = b.op("Clip", y, b.const(f"lo{i}", np.float32(0)), b.const(f"hi{i}", np.float32(6)), name=f"e{i}")
        elif epi == "clip_relu":
            y = b.op("Clip", y, None, b.const(f"hi{i}", np.float32(0.5)), name=f"e{i}")
            names.append(f"e{i}")
            y = b.op("Relu", y, name=f"r{i}")
            names.append(f"r{i}")
        elif epi == "hardswish":
            y = b.op("HardSwish", y, name=f"e{i}")
        elif epi == "add":
            y = b.op("Add", y, b.input(f"res{i}", y.shape), name=f"e{i}")
        if epi not in ("none", "clip_relu"):
            names.append(f"e{i}")
        outs.append(y)
        spec.append(("conv_epilogue", names))
    g = b.build(*outs)
    return g, group_by_names(g, spec)


def _kernel_sources(source: str) -> list[str]:
    """The generated source cut at each kernel's definition (the text of each kernel)."""
    return source.split("OPFUSE_KERNEL")[1:]


def test_the_cases_cover_both_in_place_paths_and_every_tail():
    plane = [(c, h, w) for c, h, w, k, s, p, d in CASES  # stride 1, output the input's size, at most 256 floats
             if s == 1 and p[0] + p[2] == p[1] + p[3] == (k - 1) * d and h * w <= DIRECT_MAX_VECTORS * VECTOR]
    assert len(plane) == 6
    widths = {(w + sum(p[1::2]) - (k - 1) * d - 1) // s + 1 for _c, _h, w, k, s, p, d in CASES}
    assert {w % ZMM for w in widths} >= {0, 1, 4, 7, 8, 14}
    assert any(w < ZMM for w in widths) and any(w > 2 * ZMM for w in widths)


def test_generated_text_has_the_zmm_bodies_before_the_avx2_ones():
    """Whatever the machine: the zmm body, then ``#elif`` the AVX2 one, then ``#else`` the padded
    copy, in every depthwise kernel; masked loads and stores (``__mmask16`` immediates) at the
    edges and tails, ``vpermt2ps`` for stride 2; the same C from the same options (deterministic)."""
    g, plan = multi_graph(CASES, 2)
    program = generate(g, plan, options=ZMM_ON)
    src = program.source
    assert src == generate(g, plan, options=ZMM_ON).source
    # Rows of 14 (stride 2 of 28) with a Relu: finished in registers by the zmm body only.
    notes = [n for k in program.kernels for n in k.notes if "dw11" in n]
    assert notes == ["depthwise 'dw11': AVX-512 body (zmm), its epilogue in registers"]
    # HardSwish (dw8's epilogue) too, a multiply and an add as in the scalar C, no FMA.
    assert any("'dw8': AVX-512 body (zmm), its epilogue in registers" in n for k in program.kernels for n in k.notes)
    assert "_mm512_add_ps(_mm512_mul_ps(" in src
    kernels = [k for k in _kernel_sources(src) if "_mm256_" in k]
    assert len(kernels) == len(CASES)
    for k in kernels:  # the whole-plane layers: #if zmm rows #else (#if AVX2 plane #else copy #endif) #endif
        at = k.index(ZMM_GUARD)
        assert at < k.index(AVX2_GUARD, at) < k.index("#else", k.index(AVX2_GUARD, at))
        assert "_mm512_fmadd_ps(" in k
    # The six whole planes run the zmm plane, its taps moved out of whole blocks (``valignd``, masked where a tap
    # meets the padding); the five whose epilogue it finishes in registers (Relu6, Clip + Relu, HardSwish, Clip +
    # Relu, HardSwish with this shift) in a zmm branch of their own, the dilated one (a residual Add) in the #elif.
    assert sum(AVX2_ELIF in k for k in kernels) == len(CASES) - 5
    assert [EPILOGUES[(i + 2) % len(EPILOGUES)] for i in (0, 1, 2, 19, 20, 21)] == [
        "relu6", "clip_relu", "hardswish", "clip_relu", "hardswish", "add"]
    assert "_mm512_maskz_alignr_epi32((__mmask16)0x" in src
    # Whole vectors as two ymm loads (``zmm_load``), never one unaligned or masked zmm load or store: row
    # edges by ``valignd`` where a row holds 16 floats, AVX2's masked loads and stores by halves elsewhere.
    zmm_text = "".join(k.split(ZMM_GUARD, 1)[1].split(AVX2_GUARD, 1)[0] for k in kernels)  # the zmm bodies
    assert "_mm512_loadu_ps(" not in src and "_mm512_maskz_loadu_ps(" not in src and "_mm512_mask_storeu_ps(" not in src
    assert "_mm512_insertf64x4(" in src and "_mm512_alignr_epi32(" in src and "_mm512_permutex2var_ps(" in src
    assert "_mm256_maskload_ps(" in zmm_text
    # A stride-1 row of 17 ends in a one-lane store (second half); a 14-float row in 8 + 6 lanes.
    for n in (1, 6):
        mask = ", ".join(["-1"] * n + ["0"] * (8 - n))
        assert "_mm256_maskstore_ps(" in src and f"_mm256_setr_epi32({mask}), " in src


def test_without_the_option_or_below_avx512_the_c_is_avx2s():
    """``depthwise_avx512=False``, ``vector_isa="avx2"`` and the plain C build have no zmm body, and the
    option changes nothing where the ISA is AVX2; None follows the host's FMA width (``resolved``)."""
    g, plan = multi_graph(CASES[:6])
    off = generate(g, plan, options=ZMM_OFF).source
    avx2 = generate(g, plan, options=CodegenOptions(vector_isa="avx2")).source
    assert ZMM_GUARD not in off and "_mm512_maskz_loadu_ps" not in off and "_mm512_maskz_loadu_ps" not in avx2
    assert avx2 == generate(g, plan, options=CodegenOptions(vector_isa="avx2", depthwise_avx512=True)).source
    assert "_mm512_" not in generate(g, plan, options=PORTABLE.with_(depthwise_avx512=True)).source
    assert CodegenOptions().resolved("avx512", True).depthwise_avx512 is True
    assert CodegenOptions().resolved("avx512", False).depthwise_avx512 is False
    assert CodegenOptions(depthwise_avx512=False).resolved("avx512", True).depthwise_avx512 is False
    with pytest.raises(Exception, match="depthwise_zmm_row_block"):
        CodegenOptions(depthwise_zmm_row_block=0)
    with pytest.raises(Exception, match="depthwise_zmm_plane_rows_max_ratio"):
        CodegenOptions(depthwise_zmm_plane_rows_max_ratio=0)
    with pytest.raises(Exception, match="depthwise_zmm_plane_min_vectors"):
        CodegenOptions(depthwise_zmm_plane_min_vectors=0)


SHORT_ROW_PLANES = [
    ((2, 25, 5, 3, 1, [1, 1, 1, 1], 1), True),    # 25 rows of one zmm against 8 zmm: ratio 3.1
    ((2, 64, 4, 3, 1, [1, 1, 1, 1], 1), True),    # 64 against 16: ratio 4
    ((2, 32, 8, 3, 1, [1, 1, 1, 1], 1), True),    # 32 against 16: ratio 2
    ((2, 12, 12, 3, 1, [1, 1, 1, 1], 1), True),   # 12 against 9: ratio 1.33
    ((2, 14, 14, 3, 1, [1, 1, 1, 1], 1), False),  # 14 against 13: ratio 1.08 (mobilenet_v1's 14x14 layers)
    ((2, 10, 25, 3, 1, [1, 1, 1, 1], 1), False),  # 20 against 16: ratio 1.25
    ((2, 6, 6, 3, 1, [1, 1, 1, 1], 1), False),    # 3 zmm: below depthwise_zmm_plane_min_vectors
    ((2, 4, 4, 3, 1, [1, 1, 1, 1], 1), False),    # one zmm
]


@pytest.mark.parametrize(("case", "plane"), SHORT_ROW_PLANES)
def test_whole_planes_without_a_register_epilogue_run_the_rows_but_short_rows(case, plane):
    """A whole-plane layer whose epilogue the zmm plane cannot finish in registers (here a residual Add) runs the
    rows path, but where its rows would take at least ``depthwise_zmm_plane_rows_max_ratio`` times the plane's
    vectors (and the plane has at least ``depthwise_zmm_plane_min_vectors``): then the zmm plane, the C that
    ``depthwise_zmm_plane_rows=False`` gives; an infinite ratio keeps the rows everywhere."""
    g, plan = multi_graph([case], shift=EPILOGUES.index("add"))
    src = generate(g, plan, options=ZMM_ON).source
    planes = generate(g, plan, options=ZMM_ON.with_(depthwise_zmm_plane_rows=False)).source
    rows = generate(g, plan, options=ZMM_ON.with_(depthwise_zmm_plane_rows_max_ratio=float("inf"))).source
    assert planes != rows
    assert src == (planes if plane else rows)
    if plane:
        assert src != generate(g, plan, options=ZMM_ON.with_(depthwise_zmm_plane_min_vectors=100)).source


@pytest.mark.parametrize(("case", "_plane"), SHORT_ROW_PLANES)
def test_whole_planes_with_a_relu_run_the_zmm_plane_and_its_register_epilogue(case, _plane):
    """With a Relu (any epilogue of Relus, Clips and HardSwish) the zmm plane finishes it in registers on every
    whole plane, whatever the rows would take; without ``depthwise_zmm_plane_register_epilogue`` the rule above."""
    g, plan = multi_graph([case], shift=EPILOGUES.index("relu"))
    program = generate(g, plan, options=ZMM_ON)
    rows = generate(g, plan, options=ZMM_ON.with_(depthwise_zmm_plane_register_epilogue=False,
                                                  depthwise_zmm_plane_rows_max_ratio=float("inf"))).source
    any_ratio = ZMM_ON.with_(depthwise_zmm_plane_rows_max_ratio=float("inf"))
    assert program.source == generate(g, plan, options=any_ratio).source
    assert program.source != rows
    assert [n for k in program.kernels for n in k.notes if "zmm" in n] == [
        "depthwise 'dw0': AVX-512 body (zmm), its epilogue in registers"]
    assert "_mm512_max_ps(" in program.source.split(ZMM_GUARD, 1)[1].split("#else", 1)[0]


def _build(g, plan, cache_dir, options, extra_flags=()):
    from opfuse.runtime.native import CompiledModel
    from opfuse.runtime.toolchain import Toolchain, build_library
    tc = Toolchain.detect()
    tc = dataclasses.replace(tc, flags=(*tc.flags, *extra_flags))
    program = generate(g, plan, options=options)
    library = build_library(program.source, tc, cache_dir, prelude=program.prelude)
    return CompiledModel(g, plan, program, tc, library, threads=1)


@needs_avx512
@pytest.mark.parametrize("shift", [0, 3])
def test_zmm_bodies_give_the_avx2_bits_and_the_reference(shift, cache_dir):
    from opfuse.runtime import reference
    g, plan = multi_graph(CASES, shift)
    feeds = reference.random_inputs(g, shift)
    zmm = _build(g, plan, cache_dir, ZMM_ON)
    assert sum("AVX-512 body" in note for k in zmm.program.kernels for note in k.notes) == len(CASES)
    got = zmm.run(feeds)
    want = reference.run(g, feeds)
    assert_close(got, want)
    assert_close(_build(g, plan, cache_dir, PORTABLE).run(feeds), want)
    ymm = _build(g, plan, cache_dir, ZMM_OFF).run(feeds)
    elif_branch = _build(g, plan, cache_dir, ZMM_ON, ("-mno-avx512f",)).run(feeds)  # the same C's AVX2 branch
    # A load per tap, 3 x 3 blocking, and the unrolled whole-plane zmm body with a masked load per tap and vector
    # for the small "same" planes (ZMM_ON runs three of them as the shifted plane, the 14x14 as rows).
    loads = _build(g, plan, cache_dir, ZMM_ON.with_(depthwise_zmm_shifted_taps=False, depthwise_zmm_block_group=3,
                                                      depthwise_zmm_row_block=3, depthwise_zmm_plane_rows=False,
                                                      depthwise_zmm_plane_shifted=False))
    assert sum(AVX2_ELIF in k for k in _kernel_sources(loads.program.source)) == len(CASES)  # zmm #elif AVX2 each
    loads = loads.run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], ymm[k], err_msg=k)
        np.testing.assert_array_equal(got[k], elif_branch[k], err_msg=k)
        np.testing.assert_array_equal(got[k], loads[k], err_msg=k)


@needs_avx512
def test_zmm_two_threads_equal_one(cache_dir):
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, plan = multi_graph([CASES[1], CASES[5], CASES[11]])
    feeds = reference.random_inputs(g, 1)
    one = build(g, plan, cache_dir=cache_dir, options=ZMM_ON, threads=1).run(feeds)
    two = build(g, plan, cache_dir=cache_dir, options=ZMM_ON, threads=2).run(feeds)
    for k in one:
        np.testing.assert_array_equal(one[k], two[k])


# Epilogues of Mul/Add/Sub/Div by a constant scalar after the activations (PP-OCRv4's HardSwish then a scale and
# a shift): finished in registers too, each op as the scalar C writes it (a multiply, then an add: no FMA).
ARITH_CASES = [
    ((2, 20, 20, 5, 1, [2, 2, 2, 2], 1), ["HardSwish", ("Mul", 0.94), ("Add", -0.85)]),   # rows of 20 (PP-OCRv4)
    ((2, 14, 14, 3, 1, [1, 1, 1, 1], 1), ["Relu", ("Sub", 0.25), ("Div", 3.0)]),          # whole plane
    ((3, 12, 8, 3, 1, [1, 1, 1, 1], 1), [("Mul", -2.0), ("rsub", 1.5), "Relu"]),           # whole plane, c - y
    ((2, 9, 40, 3, 2, [1, 1, 1, 1], 1), [("Add", 0.5), "HardSwish", ("Div", 0.75)]),       # stride 2, rows of 20
    # the constant first (c * y, c + y), a Clip with its minimum only, one with attributes (opset 6)
    ((2, 20, 24, 3, 1, [1, 1, 1, 1], 1),
     [("cMul", 1.25), ("cAdd", -0.5), ("clip_min", -0.2), ("clip_attrs", 0.0, 0.6)]),
]
# Epilogues the register epilogue must refuse (the scalar epilogue runs them; same values): c / y, a Max by a
# constant, and a stage that also stores the convolution's own output (a second output of the group).
REFUSED_CASES = [
    ((2, 20, 24, 3, 1, [1, 1, 1, 1], 1), ["Relu", ("rDiv", 2.0)]),
    ((2, 14, 14, 3, 1, [1, 1, 1, 1], 1), [("Max", 0.1)]),
    ((2, 20, 24, 3, 1, [1, 1, 1, 1], 1), ["Relu", "store_conv"]),
]


def arith_graph(cases=None):
    b = GraphBuilder("dw_arith")
    rng = np.random.default_rng(17)
    outs, spec = [], []
    for i, ((c, h, w, k, s, pads, d), epi) in enumerate(ARITH_CASES if cases is None else cases):
        x = b.input(f"x{i}", (1, c, h, w))
        wt = b.const(f"w{i}", (rng.standard_normal((c, 1, k, k)) / 3).astype(np.float32))
        bias = b.const(f"b{i}", (rng.standard_normal(c) / 3).astype(np.float32))
        y = b.op("Conv", x, wt, bias, kernel_shape=[k, k], strides=[s, s], pads=pads, dilations=[d, d], group=c,
                 name=f"dw{i}")
        conv = y
        names = [f"dw{i}"]
        for j, op in enumerate(epi):
            name = f"e{i}_{j}"
            if op == "store_conv":
                outs.append(conv)
                continue
            if isinstance(op, str):
                y = b.op(op, y, name=name)
            elif op[0] == "clip_min":
                y = b.op("Clip", y, b.const(f"c{i}_{j}", np.float32(op[1])), name=name)
            elif op[0] == "clip_attrs":
                y = b.op("Clip", y, min=op[1], max=op[2], name=name)
            elif op[0] in ("rsub", "rDiv", "cMul", "cAdd"):
                kind = {"rsub": "Sub", "rDiv": "Div", "cMul": "Mul", "cAdd": "Add"}[op[0]]
                y = b.op(kind, b.const(f"c{i}_{j}", np.float32(op[1])), y, name=name)
            else:
                y = b.op(op[0], y, b.const(f"c{i}_{j}", np.float32(op[1])), name=name)
            names.append(name)
        outs.append(y)
        spec.append(("conv_epilogue", names))
    g = b.build(*outs)
    return g, group_by_names(g, spec)


def test_constant_arithmetic_epilogues_are_finished_in_registers():
    g, plan = arith_graph()
    program = generate(g, plan, options=ZMM_ON)
    for i in range(len(ARITH_CASES)):
        assert any(f"'dw{i}': AVX-512 body (zmm), its epilogue in registers" in n
                   for k in program.kernels for n in k.notes), i
    assert "_mm512_div_ps(" in program.source and "_mm512_sub_ps(" in program.source
    # A Div by a non-constant, or a Mul by a tensor, keeps the scalar epilogue.
    b = GraphBuilder("dw_tensor")
    x = b.input("x", (1, 2, 20, 20))
    y = b.op("Conv", x, b.const("w", np.ones((2, 1, 3, 3), np.float32)), kernel_shape=[3, 3], pads=[1] * 4,
             group=2, name="dw")
    y = b.op("Mul", b.op("Relu", y, name="r"), b.const("m", np.ones((1, 2, 1, 1), np.float32)), name="m")
    g2 = b.build(y)
    p2 = group_by_names(g2, [("conv_epilogue", ["dw", "r", "m"])])
    notes = [n for k in generate(g2, p2, options=ZMM_ON).kernels for n in k.notes]
    assert notes == ["depthwise 'dw': AVX-512 body (zmm)"]


def test_register_epilogue_refuses_what_it_cannot_finish():
    g, plan = arith_graph(REFUSED_CASES)
    notes = [n for k in generate(g, plan, options=ZMM_ON).kernels for n in k.notes]
    assert notes == [f"depthwise 'dw{i}': AVX-512 body (zmm)" for i in range(len(REFUSED_CASES))], notes


@needs_avx512
@pytest.mark.parametrize("cases", ["finished", "refused"])
def test_constant_arithmetic_epilogues_same_bits(cases, cache_dir):
    from opfuse.runtime import reference
    g, plan = arith_graph(None if cases == "finished" else REFUSED_CASES)
    feeds = reference.random_inputs(g, 4)
    want = reference.run(g, feeds)
    zmm = _build(g, plan, cache_dir, ZMM_ON).run(feeds)
    assert_close(zmm, want)
    ymm = _build(g, plan, cache_dir, ZMM_OFF).run(feeds)
    elif_branch = _build(g, plan, cache_dir, ZMM_ON, ("-mno-avx512f",)).run(feeds)
    scalar = _build(g, plan, cache_dir, ZMM_ON.with_(depthwise_register_epilogue=False)).run(feeds)
    for k in want:
        np.testing.assert_array_equal(zmm[k], ymm[k], err_msg=k)
        np.testing.assert_array_equal(zmm[k], elif_branch[k], err_msg=k)
        np.testing.assert_array_equal(zmm[k], scalar[k], err_msg=k)
