"""Winograd convolution (``codegen/winograd.py``): the transforms' algebra, Winograd chosen for
3x3 stride-1 convolutions with an epilogue (bias + residual Add + Relu) and equal to the
reference (partial tiles, padding 0 and 1, batch 2, channel counts off the register block,
1 and 2 threads), refused with a reason where illegal or unprofitable, the portable C99 path
against the vectorised one, and deterministic C.

Tolerance: the suite's (``assert_close``: rtol 1e-4, atol 1e-5) for both transforms. Max abs
errors on 64 -> 64 channels at 56x56 (O(1) outputs): direct 4.1e-6, F(2x2, 3x3) 1.8e-6,
F(4x4, 3x3) 1.1e-5 (3.4e-5 with the usual points 0, +-1, +-2, which is why it uses 0, 1, -1,
2, -1/2). On this file's cases F(4x4) reaches at most 0.78 of the tolerance (300 input channels).
"""
from __future__ import annotations

from fractions import Fraction

import re

import numpy as np
import pytest

from cg_support import WIDE_HOST, assert_close, group_by_names, run_both
from opfuse.codegen.outline import parallel_loops
from opfuse.codegen import CodegenOptions
from opfuse.codegen.program import generate
from opfuse.codegen.winograd import F2, F4, choose_transform, winograd_choice
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(5)


def _w(b, *shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def conv_block(n, c, oc, h, w, pads, *, k=3, stride=1, dilation=1, group=1):
    """Conv (bias) -> Add (residual input) -> Relu, one conv_epilogue group."""
    b = GraphBuilder("wino")
    x = b.input("x", (n, c, h, w))
    oh = (h + pads[0] + pads[2] - dilation * (k - 1) - 1) // stride + 1
    ow = (w + pads[1] + pads[3] - dilation * (k - 1) - 1) // stride + 1
    res = b.input("res", (n, oc, oh, ow))
    y = b.op("Conv", x, _w(b, oc, c // group, k, k), _w(b, oc), kernel_shape=[k, k], strides=[stride, stride],
             pads=pads, dilations=[dilation, dilation], group=group, name="conv")
    g = b.build(b.op("Relu", b.op("Add", y, res, name="add"), name="relu"))
    return g, group_by_names(g, [("conv_epilogue", ["conv", "add", "relu"])])


def _notes(model) -> list[str]:
    return [n for k in model.program.kernels for n in k.notes]


def _conv_node(g):
    return next(n for n in g.nodes if n.op_type == "Conv")


@pytest.mark.parametrize("t", [F2, F4], ids=["F2", "F4"])
def test_transforms_compute_the_correlation_exactly(t):
    """A^T [(G g G^T) * (B^T d B)] A == the 3x3 correlation of d, in exact rational arithmetic."""
    r = np.random.default_rng(0)
    g = [[Fraction(int(v)) for v in row] for row in r.integers(-9, 10, (3, 3))]
    d = [[Fraction(int(v)) for v in row] for row in r.integers(-9, 10, (t.alpha, t.alpha))]

    def mm(a, b):
        return [[sum((a[i][k] * b[k][j] for k in range(len(b))), Fraction(0)) for j in range(len(b[0]))]
                for i in range(len(a))]

    def tr(a):
        return [list(col) for col in zip(*a, strict=True)]

    u = mm(mm(t.G, g), tr(t.G))
    v = mm(mm(t.BT, d), tr(t.BT))
    y = mm(mm(t.AT, [[u[i][j] * v[i][j] for j in range(t.alpha)] for i in range(t.alpha)]), tr(t.AT))
    want = [[sum(g[a][b] * d[i + a][j + b] for a in range(3) for b in range(3)) for j in range(t.m)]
            for i in range(t.m)]
    assert y == want


CASES = {
    # n, c, oc, h, w, pads: odd sizes (partial tiles), channels off the 6 x 16 register block
    "pad1-odd-batch2": (2, 65, 67, 13, 11, [1, 1, 1, 1]),
    "pad0-odd": (1, 70, 66, 17, 19, [0, 0, 0, 0]),
    "asymmetric-pads": (1, 64, 80, 12, 9, [0, 1, 2, 0]),
    "k-blocks": (1, 600, 64, 10, 10, [1, 1, 1, 1]),   # Cin 600: K blocks in test_winograd_k_blocks
    "many-blocks": (1, 64, 64, 40, 36, [1, 1, 1, 1]),  # several blocks of tiles per image
    # NudeNet (YOLOv8n) at 2x3x160x224, model.6: F(2x2) 5x7 tiles, blocks of 32 (12 band rows,
    # the first and last outside the image). The band copy's "outside: zero the row, continue"
    # was miscompiled by gcc 12.2 -O3 -march=native (in-image rows zeroed): errors ~1e21.
    "batch2-band-12-rows": (2, 64, 64, 10, 14, [1, 1, 1, 1]),
    # 16 F(4x4) tiles (14x14): with the AVX-512 block on, 67 channels in one zmm of tiles, 14 x 16 (70 rows)
    "zmm-panels-14x14": (1, 40, 67, 14, 14, [1, 1, 1, 1]),
    # below winograd_min_spatial with many channels (winograd_small_spatial): F(2x2) at 7x7, 4 partial tiles
    "small-spatial-7x7": (1, 131, 128, 7, 7, [1, 1, 1, 1]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_with_epilogue_matches_reference(name, threads, cache_dir):
    g, plan = conv_block(*CASES[name])
    got, want, model = run_both(g, plan, cache_dir, threads=threads)
    assert_close(got, want)
    oh, ow = _conv_node(g).outputs[0].shape[2:]
    t = choose_transform(CodegenOptions(), oh, ow)
    assert any(f"Winograd {t.name}" in n for n in _notes(model)), _notes(model)
    assert f"Winograd {t.name}" in model.program.source
    assert model.report["kernels"] == 1
    assert any(f"Winograd {t.name}" in n for k in model.report["c_kernels"] for n in k["notes"])


@pytest.mark.parametrize("f4,name", [(True, "F(4x4,3x3)"), (False, "F(2x2,3x3)")])
def test_transform_follows_the_rule(f4, name, cache_dir):
    """Output 19x17: F(4x4) by default (both sides >= winograd_f4_min_spatial), F(2x2) without
    ``winograd_f4``; both within the suite's tolerance."""
    g, plan = conv_block(2, 65, 67, 19, 17, [1, 1, 1, 1])
    got, want, model = run_both(g, plan, cache_dir, options=CodegenOptions(winograd_f4=f4), threads=2)
    assert_close(got, want)
    assert any(f"Winograd {name}" in n for n in _notes(model))
    assert choose_transform(CodegenOptions(winograd_f4=f4), 19, 17) is (F4 if f4 else F2)
    assert choose_transform(CodegenOptions(), 19, 11) is F2  # one side under winograd_f4_min_spatial


def test_results_do_not_depend_on_threads(cache_dir):
    g, plan = conv_block(2, 65, 67, 13, 11, [1, 1, 1, 1])
    one, _, _ = run_both(g, plan, cache_dir, threads=1)
    two, _, _ = run_both(g, plan, cache_dir, threads=2)
    for k in one:
        assert np.array_equal(one[k], two[k])


@pytest.mark.parametrize("shared", [True, False], ids=["shared_transform", "a_transform_per_part"])
def test_a_single_block_is_split_by_output_channels_for_threads(shared, cache_dir):
    """8x8 outputs with F(2x2) are 16 tiles, one block: its output channels are split into parts
    (up to gemm_min_tiles) for the threads; one, two and three threads (one part, two, three) give
    the same bits, and the reference's values, whether the parts share one input transform
    (``winograd_shared_transform``: one region, the channels' transforms shared out, a barrier, the
    parts) or each transforms the input itself (a loop of gemm_min_tiles iterations)."""
    g, plan = conv_block(1, 32, 40, 8, 8, [1, 1, 1, 1])
    options = CodegenOptions(winograd="on", winograd_shared_transform=shared)
    results = [run_both(g, plan, cache_dir, options=options, threads=n) for n in (1, 2, 3)]
    (one, want, model), others = results[0], results[1:]
    assert any("Winograd F(2x2,3x3)" in n for n in _notes(model))
    src = model.program.source
    written = parallel_loops(src)
    loops = [lp.bound for lp in written]
    recorded = next(k for k in model.program.kernels if k.parallel).parallel
    if shared:  # the region's two loops, one after the other: the channels' transforms, then the parts
        assert [(lp.schedule, lp.bound) for lp in written][:1] == [("schedule(static)", "32")]
        assert written[1].schedule == "schedule(dynamic, 1)" and len(written) == 2
        transform, parts = recorded
        assert (transform.iterations, transform.schedule) == (32, "static")  # the input channels
        assert (parts.iterations, parts.schedule) == (2, "dynamic") and parts.costs[0] == parts.costs[1]
        assert sum(n.count("Winograd F(2x2,3x3)") for n in _notes(model)) == 1  # noted once, not per variant
    else:
        assert loops and int(loops[0]) == CodegenOptions().gemm_min_tiles
        assert [lp.iterations for lp in recorded] == [CodegenOptions().gemm_min_tiles]
    assert_close(one, want)
    for got, _, _ in others:
        for k in one:
            assert np.array_equal(one[k], got[k])
    if shared:  # the same bits as the parts that transform the input themselves
        plain, _, _ = run_both(g, plan, cache_dir, options=options.with_(winograd_shared_transform=False), threads=2)
        assert all(np.array_equal(one[k], plain[k]) for k in one)


@pytest.mark.parametrize("threads,block,parts", [
    (1, 6, 1),                      # one thread: every block whole
    (2, 5, 1), (2, 6, 2),           # 7 blocks on 2 threads: the seventh alone, in halves
    (4, 3, 1), (4, 4, 2), (4, 6, 2),  # 7 on 4: 3 left for the last round, 2 parts each (at most `most`)
    (3, 0, 3), (8, 0, 4),           # a single block: split as the threads need, up to `most`
    (2, 1, 1),                      # 2 blocks on 2 threads: no last round to fill
])
def test_last_round_parts(threads, block, parts):
    from opfuse.codegen.winograd import last_round_parts
    units = 1 if (threads, block) in ((3, 0), (8, 0)) else 2 if (threads, block) == (2, 1) else 7
    most = 4 if units == 1 else 2
    assert last_round_parts(threads, units, most, block) == parts


def test_the_last_round_of_blocks_is_split_for_threads(cache_dir):
    """80 F(2x2) tiles in blocks of one panel width (32 or 16 tiles: 3 or 5 blocks, an odd count):
    on 2 threads the last block would run alone, so its output channels are split in two parts
    (``winograd_split_last_round``). The recorded loop says so (two slots a block, the last one's
    halves costed, the other blocks' second slot empty), its bound at 2 threads is above the whole
    blocks', and 1, 2, 3 and 4 threads give the same bits, the reference's values."""
    import re
    from opfuse.codegen.winograd import last_round_parts
    g, plan = conv_block(1, 32, 40, 20, 16, [1, 1, 1, 1])
    options = CodegenOptions(winograd="on", winograd_f4=False, winograd_block_floats=1)
    model = None
    results = []
    for n in (1, 2, 3, 4):
        got, want, built = run_both(g, plan, cache_dir, options=options, threads=n)
        model = model or built
        results.append(got)
    T = int(re.search(r"tiles per image in blocks of (\d+)", model.program.source).group(1))
    units = -(-80 // T)
    assert units % 2 == 1 and units >= 3
    loop = next(k for k in model.program.kernels if k.parallel).parallel[0]
    assert loop.iterations == 2 * units and loop.schedule == "dynamic"
    tiles = [float(min(T, 80 - t0)) for t0 in range(0, 80, T)]
    tiles = [-(-t // T) * T for t in tiles]  # each block's lanes rounded up to the panel
    assert list(loop.costs[:-2:2]) == tiles[:-1] and set(loop.costs[1:-2:2]) == {0.0}
    assert loop.costs[-2:] == (tiles[-1] / 2, tiles[-1] / 2)
    assert [last_round_parts(2, units, 2, b) for b in range(units)] == [1] * (units - 1) + [2]
    whole = CodegenOptions(winograd="on", winograd_f4=False, winograd_block_floats=1, winograd_split_last_round=False)
    _, _, plain = run_both(g, plan, cache_dir, options=whole, threads=2)
    plain_loop = next(k for k in plain.program.kernels if k.parallel).parallel[0]
    assert plain_loop.iterations == units and loop.speedup(2) > plain_loop.speedup(2)
    assert_close(results[0], want)
    for got in results[1:]:
        for k in results[0]:
            assert np.array_equal(results[0][k], got[k])


@pytest.mark.parametrize("kw,reason", [
    (dict(stride=2), "strides [2, 2]"),
    (dict(dilation=2), "dilations [2, 2]"),
    (dict(group=2), "group=2"),
    (dict(k=1), "kernel 1x1"),
    (dict(k=5), "kernel 5x5"),
])
def test_illegal_convolutions_refuse_winograd(kw, reason, cache_dir):
    pads = [0, 0, 0, 0] if kw.get("k") == 1 else [2, 2, 2, 2]
    g, plan = conv_block(1, 64, 64, 12, 12, pads, **kw)
    static = {id(v): None for v in g.values.values() if v.const is not None}
    for mode in ("auto", "on"):
        choice = winograd_choice(_conv_node(g), CodegenOptions(winograd=mode), static)
        assert choice.transform is None and reason in choice.reason
    got, want, model = run_both(g, plan, cache_dir)
    assert_close(got, want)
    assert any("direct" in n and reason in n for n in _notes(model)), _notes(model)
    assert "Winograd F(" not in model.program.source


@pytest.mark.parametrize("shape,options,reason", [
    ((8, 64, 14, 14), CodegenOptions(), "fewer than winograd_min_channels=16"),
    ((64, 12, 14, 14), CodegenOptions(), "fewer than winograd_min_channels=16"),
    ((24, 64, 10, 10), CodegenOptions(), "fewer than winograd_f2_min_channels=32"),
    ((16, 64, 16, 16), CodegenOptions(winograd_f4=False), "fewer than winograd_f2_min_channels=32"),
    ((64, 64, 7, 7), CodegenOptions(), "smaller than winograd_min_spatial=8"),
    ((128, 96, 7, 7), CodegenOptions(), "winograd_small_min_channels=128"),
    ((512, 512, 5, 5), CodegenOptions(), "winograd_small_spatial=6"),
    ((512, 512, 7, 7), CodegenOptions(winograd_small_min_channels=1024), "smaller than winograd_min_spatial=8"),
    ((64, 64, 14, 14), CodegenOptions(simd="none"), "plain C99 build"),
    ((64, 64, 14, 14), CodegenOptions(winograd="off"), "winograd='off'"),
])
def test_unprofitable_convolutions_stay_direct(shape, options, reason):
    c, oc, h, w = shape
    g, _ = conv_block(1, c, oc, h, w, [1, 1, 1, 1])
    static = {id(v): None for v in g.values.values() if v.const is not None}
    choice = winograd_choice(_conv_node(g), options, static)
    assert choice.transform is None and reason in choice.reason
    forced = winograd_choice(_conv_node(g), options.with_(winograd="on"), static)
    assert forced.transform is choose_transform(options, h, w) and forced.reason == "winograd='on'"


@pytest.mark.parametrize("shape", [(128, 128, 7, 7), (512, 512, 7, 7), (256, 256, 6, 6), (512, 128, 6, 9)])
def test_small_outputs_with_many_channels_take_f2(shape):
    """Under ``winograd_min_spatial`` but with both sides >= ``winograd_small_spatial`` and
    >= ``winograd_small_min_channels`` channels each way (resnet18's layer4): F(2x2)."""
    c, oc, h, w = shape
    g, _ = conv_block(1, c, oc, h, w, [1, 1, 1, 1])
    static = {id(v): None for v in g.values.values() if v.const is not None}
    choice = winograd_choice(_conv_node(g), CodegenOptions(), static)
    assert choice.transform is F2, choice.reason
    assert choice.reason == f"{c} -> {oc} channels, output {h}x{w}"


def test_portable_winograd_matches_the_vectorised_one(cache_dir):
    """simd="none" with winograd="on": the plain C99 micro-kernel, transforms and copies,
    against the intrinsics build (whose gathers and scatters of 8 tiles of one tile row run as
    in-register transposes: 9 tiles per row here) and the reference, for both transforms."""
    g, plan = conv_block(1, 40, 36, 34, 35, [1, 1, 1, 1])
    for f4, name in ((True, "F(4x4,3x3)"), (False, "F(2x2,3x3)")):
        portable, want, m0 = run_both(g, plan, cache_dir, options=CodegenOptions(simd="none", winograd="on",
                                                                                 winograd_f4=f4))
        simd, _, m1 = run_both(g, plan, cache_dir, options=CodegenOptions(winograd_f4=f4))
        assert "_mm256_fmadd_ps" not in m0.program.source and "_mm256_unpacklo_ps" in m1.program.source
        assert f"Winograd {name}" in m0.program.source and f"Winograd {name}" in m1.program.source
        assert_close(portable, want)
        assert_close(simd, want)
        assert_close(simd, portable)


def test_avx512_blocks_same_bits_as_avx2s(cache_dir):
    """The batched GEMMs sum each output in increasing k with one FMA a product whatever the block: 8 x 32 and
    MR x 16 in zmm (``winograd_avx512``, ``winograd_zmm_panels``) give the bits of AVX2's 6 x 16."""
    for case in ((1, 40, 67, 14, 14, [1, 1, 1, 1]), (1, 64, 64, 40, 36, [1, 1, 1, 1])):
        g, plan = conv_block(*case)
        wide, want, m = run_both(g, plan, cache_dir, options=CodegenOptions(vector_isa="avx512", winograd_avx512=True))
        ymm, _, m2 = run_both(g, plan, cache_dir, options=CodegenOptions(vector_isa="avx512", winograd_avx512=False))
        assert "Winograd GEMMs 'node_conv': 6x16" in m2.program.source
        assert "Winograd GEMMs 'node_conv': 6x16" not in m.program.source
        assert_close(wide, want)
        for k in wide:
            assert np.array_equal(wide[k], ymm[k])


def test_portable_build_keeps_the_direct_kernel_by_default():
    """The Cortex-M7 and PORTABLE builds (simd="none", winograd="auto") generate what they did
    before Winograd existed: the direct kernel, identical C with winograd="off"."""
    g, plan = conv_block(1, 64, 64, 14, 14, [1, 1, 1, 1])
    auto = generate(g, plan, options=CodegenOptions(simd="none")).source
    off = generate(g, plan, options=CodegenOptions(simd="none", winograd="off")).source
    assert "Winograd F(" not in auto
    assert auto.replace("plain C99 build (simd='none'): Winograd only with winograd='on'", "winograd='off'") == off


def test_generated_c_is_deterministic():
    g, plan = conv_block(2, 65, 67, 19, 17, [1, 1, 1, 1])
    a = generate(g, plan, options=CodegenOptions(winograd_f4=True))
    b = generate(g, plan, options=CodegenOptions(winograd_f4=True))
    assert a.source == b.source and a.weights == b.weights
    assert "Winograd F(4x4,3x3)" in a.source


def test_winograd_k_blocks(cache_dir):
    """Input channels past ``gemm_kc``: the transformed GEMMs in several K blocks (600 in 3 of 200)."""
    g, plan = conv_block(1, 600, 64, 10, 10, [1, 1, 1, 1])
    got, want, model = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_kc=256))
    assert_close(got, want)
    assert any("Winograd" in n for n in _notes(model))


@pytest.mark.parametrize("hw, block", [(32, "8x32"), (14, "16x16")])
def test_winograd_avx512_block_where_it_pads_no_more(hw, block, cache_dir):
    """``winograd_avx512``: 64 -> 64 channels, F(4x4): 32x32 outputs (64 tiles) take the 8 x 32 AVX-512 block
    (run with its zmm body on an AVX-512 host, AVX2 or plain C elsewhere), 14x14 (16 tiles, which 8 x 32 would
    pad) a 16-wide zmm block (``winograd_zmm_panels``); both equal the reference (test_winograd_units checks the
    rule itself) within F(4x4)'s rounding at 576 products a sum (one make test run read 1.09e-5 absolute)."""
    g, plan = conv_block(1, 64, 64, hw, hw, [1, 1, 1, 1])
    o = CodegenOptions(vector_isa="avx512", winograd="on", winograd_avx512=True)
    got, want, model = run_both(g, plan, cache_dir, options=o)
    assert_close(got, want, rtol=1e-3, atol=1e-4)
    assert any(n.startswith(f"Winograd GEMMs 'conv': {block} micro-kernel") for n in _notes(model)), _notes(model)


def test_transformed_weights_prefetched_ahead_same_bits(cache_dir):
    """``winograd_prefetch_u``: the batched GEMMs' micro-kernel prefetches the packed U that many bytes
    ahead (``_pa`` and the k steps in its name: 2048 bytes over panels of 16 rows are 32 steps) where U
    has ``winograd_prefetch_min_bytes`` or more (here 36 x 256 x 64 floats, 2304 KiB: prefetched by
    default, not with a 4 MiB minimum), the kernel's notes saying which; 0 emits none, nor does the plain C99
    build (simd="none": its C is the same whatever the option). A prefetch reads
    nothing into a register: the same bits either way, at 1 and 2 threads (a single 14x14 block, split by
    output channels for 2)."""
    from opfuse.codegen.microkernel import microkernel
    on_name, on = microkernel(16, 16, "packed", "strided", avx512=True, a_prefetch=32)
    off_name, off = microkernel(16, 16, "packed", "strided", avx512=True)
    assert on_name.endswith("_pa32_z") and off_name == on_name.replace("_pa32", "")
    assert "_mm_prefetch((const char*)(ak + 512), _MM_HINT_T0);" in on
    assert "_mm_prefetch((const char*)(ak + " not in off
    g, plan = conv_block(1, 64, 256, 14, 14, [1, 1, 1, 1])
    prefetch = "_mm_prefetch((const char*)(ak + "
    # the AVX-512 host's 16 x 16 block (256 channels, unpadded); AVX2's 6 x 16 ends them in a 4-row tail panel
    # (unpadded too; 258 rows, 2322 KiB, without tail panels)
    for options, fetched, note in (
            (CodegenOptions(**WIDE_HOST), True, "U (2304 KiB) prefetched 2048 bytes ahead"),
            (CodegenOptions(vector_isa="avx2"), True, "U (2304 KiB) prefetched 2048 bytes ahead"),
            (CodegenOptions(vector_isa="avx2", gemm_tail_panels=False), True,
             "U (2322 KiB) prefetched 2048 bytes ahead"),
            (CodegenOptions(**WIDE_HOST, winograd_prefetch_min_bytes=4 << 20), False,
             "U (2304 KiB) not prefetched (winograd_prefetch_min_bytes=4194304)"),
            (CodegenOptions(winograd_prefetch_u=0), False, "U not prefetched (winograd_prefetch_u=0)")):
        program = generate(g, plan, options=options)
        assert (prefetch in program.source) is fetched
        assert any(n.startswith("Winograd GEMMs 'conv'") and n.endswith(note)
                   for k in program.kernels for n in k.notes), [n for k in program.kernels for n in k.notes]
    plain = generate(g, plan, options=CodegenOptions(simd="none", winograd="on"))  # no intrinsics, no prefetch
    assert plain.source == generate(g, plan, options=CodegenOptions(simd="none", winograd="on",
                                                                    winograd_prefetch_u=0)).source
    assert "prefetched" not in plain.source and not re.search(r"_pa\d", plain.source)  # no micro-kernel _pa<steps>
    for threads in (1, 2):
        got, want, m = run_both(g, plan, cache_dir, threads=threads)
        base, _, m0 = run_both(g, plan, cache_dir, options=CodegenOptions(winograd_prefetch_u=0), threads=threads)
        assert "Winograd F(4x4,3x3)" in m.program.source
        assert prefetch in m.program.source and prefetch not in m0.program.source
        assert_close(got, want)
        for k in got:
            assert np.array_equal(got[k], base[k])


def _conv_with(epilogue: str, c: int = 32, oc: int = 48, h: int = 10, w: int = 10):
    """Conv (bias) then ``epilogue``: "silu" (Sigmoid, Mul), "scale" (Mul by a per-channel constant, Relu),
    "residual" (Add of an input of the output's shape, Relu) or "rows" (Add of a (1, 1, H, 1) input: broadcast
    along the rows), one conv_epilogue group."""
    b = GraphBuilder(f"wino_{epilogue}")
    x = b.input("x", (1, c, h, w))
    y = b.op("Conv", x, _w(b, oc, c, 3, 3), _w(b, oc), kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv")
    names = ["conv"]
    if epilogue == "silu":
        y = b.op("Mul", y, b.op("Sigmoid", y, name="sig"), name="mul")
        names += ["sig", "mul"]
    else:
        other = {"scale": lambda: _w(b, 1, oc, 1, 1), "residual": lambda: b.input("res", (1, oc, h, w)),
                 "rows": lambda: b.input("rows", (1, 1, h, 1))}[epilogue]()
        y = b.op("Relu", b.op("Mul" if epilogue == "scale" else "Add", y, other, name="op"), name="relu")
        names += ["op", "relu"]
    g = b.build(y)
    return g, group_by_names(g, [("conv_epilogue", names)])


@pytest.mark.parametrize(("epilogue", "flat"), [("silu", True), ("scale", True), ("residual", True),
                                                ("rows", False)])
@pytest.mark.parametrize("hw", [(10, 10), (20, 20), (10, 11)])
def test_flat_plane_epilogue_same_bits_as_row_by_row(epilogue, flat, hw, cache_dir):
    """``winograd_flat_epilogue``: one block of every tile with whole-tile rows (10x10 in F(2x2), 20x20 in
    F(4x4)) runs the bias and epilogue over each channel's plane as one row; not a width that is no multiple
    of m (10x11), nor an operand broadcast along the rows (its index would run past a row). The same bits as
    row by row (each element the same operations), at 1 and 2 threads, and the reference's values."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, plan = _conv_with(epilogue, h=hw[0], w=hw[1])
    feeds = reference.random_inputs(g, 0)
    want = reference.run(g, feeds)
    flat = flat and hw[1] % choose_transform(CodegenOptions(), *hw).m == 0
    # the AVX-512 host's 8 x 32 block: every tile in one block (AVX2's 6 x 16 makes two of these 25 or 36 tiles)
    rows = build(g, plan, cache_dir=cache_dir,
                 options=CodegenOptions(**WIDE_HOST, winograd_flat_epilogue=False)).run(feeds)
    for threads in (1, 2):
        model = build(g, plan, cache_dir=cache_dir, threads=threads, options=CodegenOptions(**WIDE_HOST))
        assert any("Winograd" in n for n in _notes(model))
        assert any("one row" in n for n in _notes(model)) is flat, _notes(model)
        got = model.run(feeds)
        assert_close(got, want)
        for k in got:
            np.testing.assert_array_equal(got[k], rows[k], err_msg=k)


def test_band_copy_prefetches_the_next_channels_rows(cache_dir):
    """``winograd_band_prefetch``: the band copy fetches the same input row of the channel that many ahead
    (guarded at the last channel); not in the portable C, nor with 0; the same results either way."""
    g, plan = conv_block(1, 20, 32, 16, 16, [1, 1, 1, 1])
    on, want, m_on = run_both(g, plan, cache_dir, options=CodegenOptions(winograd_band_prefetch=2))
    off, _, m_off = run_both(g, plan, cache_dir, options=CodegenOptions(winograd_band_prefetch=0))
    assert_close(on, want)
    for k in on:
        assert np.array_equal(on[k], off[k])
    assert re.search(r"if \(c\d+ \+ 2 < 20\) for \(long pj\d+ = 0; pj\d+ < 16; pj\d+ \+= 16\) __builtin_prefetch\(",
                     m_on.program.source)
    assert "__builtin_prefetch(" not in m_off.program.source
    portable = generate(g, plan, options=CodegenOptions(simd="none", winograd="on")).source
    assert "Winograd F(" in portable and "__builtin_prefetch(" not in portable


@pytest.mark.parametrize(("t", "threads", "u_from_weights"),
                         [("F2", 1, False), ("F4", 1, False), ("F4", 2, False), ("F4", 2, True)])
def test_infinite_nan_and_huge_inputs_give_the_references_outputs(t, threads, u_from_weights, cache_dir):
    """Winograd's input transform takes differences of a tile's inputs, so one infinite input made NaN of every
    output of its tile (inf - inf), where the direct sum (the reference, onnxruntime) gives +-inf, NaN where
    both signs or a NaN meet, and finite values for the outputs whose window misses it (found by ``opfuse fuzz``,
    seed 41204). Such outputs are recomputed directly: every output is NaN, +-inf or finite exactly where the
    reference's is, the finite ones within the tolerance, with the epilogue (bias, residual Add, Relu) applied
    after. Inputs: +inf, -inf, NaN and 3e38 (its transformed values overflow) in separate tiles; on 2 threads one
    image, one block whose output channels the threads share (``winograd_shared_transform``). 11 output rows: the
    last tile row is partial. The outputs of the tiles no special input reaches keep the Winograd bits of the same
    input without the specials (only the non-finite outputs are recomputed; in a reached tile the transforms made
    every output non-finite, so each is recomputed, finite ones within the tolerance). ``u_from_weights``: the
    threads compute U from the weights (``winograd_u_from_weights``), each panel's outputs transformed after its
    GEMMs."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    n = 1 if threads == 2 else 2
    g, plan = conv_block(n, 8, 32 if u_from_weights else 8, 11, 10, [1, 1, 1, 1])  # 32: two panels, two parts
    o = CodegenOptions(winograd="on", winograd_f4=t == "F4", winograd_f4_min_spatial=4, parallel_min_work=0,
                       winograd_u_from_weights_min_bytes=0 if u_from_weights else 4 << 20)
    model = build(g, plan, cache_dir=cache_dir, options=o, threads=threads)
    assert ("U computed from the 3x3 weights" in "".join(_notes(model))) is u_from_weights
    assert f"Winograd {'F(4x4,3x3)' if t == 'F4' else 'F(2x2,3x3)'}" in "".join(_notes(model))
    feeds = reference.random_inputs(g, 1)
    clean = model.run(feeds)["relu"]
    x = feeds["x"]
    specials = [(0, 3, 2, 2, np.inf), (0, 5, 9, 8, -np.inf), (n - 1, 0, 6, 1, np.nan), (n - 1, 7, 0, 9, 3e38),
                (n - 1, 2, 6, 2, np.inf)]  # the last beside the NaN: that window holds both
    reached = np.zeros(clean.shape, bool)
    m = 4 if t == "F4" else 2  # each special's window of outputs, out to their whole tiles
    for i, c, r, q, val in specials:
        x[i, c, r, q] = val
        rows = slice(max(r - 1, 0) // m * m, (r + 1) // m * m + m)
        reached[i, :, rows, max(q - 1, 0) // m * m:(q + 1) // m * m + m] = True
    got = model.run(feeds)["relu"]
    want = reference.run(g, feeds)["relu"]
    assert got[~reached].view(np.uint32).tolist() == clean[~reached].view(np.uint32).tolist()
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.where(np.isinf(want), want, 0), np.where(np.isinf(got), got, 0))
    fin = np.isfinite(want)
    assert_close({"y": got[fin]}, {"y": want[fin]})


def test_integer_rows_factor_g_exactly():
    """``G = diag(s) P`` with integer rows (first nonzero positive): F(4x4)'s rows of thirds and fifteenths are
    small powers of two times one scale each, F(2x2)'s halves too, so ``U = G g G^T`` from the weights is exact up
    to the one rounding of ``s_i s_k`` (``u_from_weights_exact``); points whose rows need a 3 are not."""
    from opfuse.codegen.winograd import integer_rows, toom_cook, u_from_weights_exact
    for t in (F2, F4):
        scales, P = integer_rows(t.G)
        assert [[s * v for v in row] for s, row in zip(scales, P, strict=True)] == [list(r) for r in t.G]
        assert all(next(v for v in row if v) > 0 for row in P)
        assert u_from_weights_exact(t)
    assert integer_rows(F4.G)[1][4] == (4, -2, 1) and integer_rows(F4.G)[0][4] == Fraction(-4, 15)
    assert not u_from_weights_exact(toom_cook(4, [0, 1, -1, 3, -3]))  # a row (1, 3, 9)


@pytest.mark.parametrize("t", [F2, F4], ids=["F2", "F4"])
def test_u_in_float32_is_near_the_float64_one(t):
    """The stored U of a convolution whose threads compute U from the weights is ``filter_transform_float32``:
    within a few float32 ulp of G g G^T in float64 (relative to each U's largest term), never further."""
    from opfuse.codegen.winograd import filter_transform, filter_transform_float32
    w = (rng.standard_normal((24, 20, 3, 3)) / 3).astype(np.float32)
    u32 = filter_transform_float32(w, t)
    u64 = filter_transform(w, t)
    G = np.abs(np.array([[float(v) for v in r] for r in t.G]))
    bound = np.einsum("ia,ocab,kb->ikoc", G, np.abs(w.astype(np.float64)), G).reshape(u64.shape)
    err = np.abs(u32.astype(np.float64) - u64)
    assert u32.dtype == np.float32 and err.max() > 0
    assert (err <= 6 * np.finfo(np.float32).eps * bound).all()


def _one_block_f4(c=64, oc=48):
    """14x14 outputs with F(4x4): 16 tiles, one block, whose output channels the threads share."""
    return conv_block(1, c, oc, 14, 14, [1, 1, 1, 1])


UFW = dict(winograd="on", winograd_u_from_weights_min_bytes=0, parallel_min_work=0)


@pytest.mark.parametrize("options", [dict(**WIDE_HOST), dict(vector_isa="avx2"), dict(simd="none")],
                         ids=["avx512", "avx2", "portable"])
def test_u_from_weights_same_bits_on_every_thread_count(options, cache_dir):
    """``winograd_u_from_weights``: in the region of a single block split by output channels for the threads, each
    thread computes U of its panels from the packed 3x3 weights, 16 input channels at a time (``_gp``, the
    micro-kernel fetching the next panel's weights: ``_bn``), while one thread streams the stored U. The stored U
    is the float32 one computed the same way, so 1, 2 and 3 threads give the same bits: the AVX-512 body of the
    computation (on an AVX-512 host) and its plain loop (AVX2, portable C) compute the stored bits, within the
    tolerance of the reference."""
    g, plan = _one_block_f4()
    o = CodegenOptions(**UFW, **options)
    runs = [run_both(g, plan, cache_dir, options=o, threads=n) for n in (1, 2, 3)]
    (one, want, model), others = runs[0], runs[1:]
    src = model.program.source
    notes = [n for n in _notes(model) if n.startswith("Winograd GEMMs")]
    assert "Winograd F(4x4,3x3)" in src and "conv_gp" in src
    assert any("on more than one thread U computed from the 3x3 weights" in n for n in notes), notes
    if options.get("simd") != "none":
        assert re.search(r"opfuse_ukr_\w+_bn\d+\(", src)
    assert_close(one, want)
    for got, _, _ in others:
        for k in one:
            assert np.array_equal(one[k], got[k])


def test_u_from_weights_prefetches_the_next_xi(cache_dir):
    """``winograd_fw_prefetch_next_xi``: the GEMMs computing U from the weights prefetch, each k step, the row of V
    the next call reads (the next xi's block, ``XV`` = C T + 16 floats on: 65 rows of T = 16 tiles for 64 input
    channels), not ``gemm_prefetch`` rows on in the same xi; the GEMMs on the stored U keep theirs. The same bits
    with the option off, at 2 threads."""
    g, plan = _one_block_f4()
    runs = {}
    for on in (True, False):
        o = CodegenOptions(**UFW, **WIDE_HOST, winograd_fw_prefetch_next_xi=on)
        runs[on] = run_both(g, plan, cache_dir, options=o, threads=2)
        src = runs[on][2].program.source
        fw = re.findall(r"opfuse_ukr_\w+_pf(\d+)_\w*_bn\d+\(", src)
        plain = re.findall(r"opfuse_ukr_16x16_packed_strided_pf(\d+)_z_u4(?:_pa\d+)?\(", src)
        assert fw and set(fw) == ({"65"} if on else {str(o.gemm_prefetch)}), fw
        assert plain and set(plain) == {str(o.gemm_prefetch)}, plain
    assert_close(runs[True][0], runs[True][1])
    for k in runs[True][0]:
        assert np.array_equal(runs[True][0][k], runs[False][0][k])


@pytest.mark.parametrize("options", [dict(**WIDE_HOST), dict(vector_isa="avx2"), dict(simd="none")],
                         ids=["avx512", "avx2", "portable"])
def test_u_from_weights_row_groups_same_bits(options, cache_dir):
    """``winograd_fw_row_groups``: the threads computing U from the weights take a row of U at a time (alpha = 6 of
    the 36 xi of F(4x4)), each chunk of input channels transformed for that row alone (``emit_u_panel``'s ``row``)
    and its six GEMMs right after, so one chunk loop per row where the option off has one for all 36 xi; the same
    bits as off, at 2 and 3 threads, within the reference's tolerance."""
    g, plan = _one_block_f4()
    loops, outs = {}, {}
    for on in (True, False):
        o = CodegenOptions(**UFW, **options, winograd_fw_row_groups=on)
        loops[on] = generate(g, plan, options=o).source.count("for (long wc_ = 0; wc_ < ")
        for n in (2, 3):
            got, want, _ = run_both(g, plan, cache_dir, options=o, threads=n)
            assert_close(got, want)
            outs[on, n] = got
    assert loops[False] >= 1 and loops[True] == 6 * loops[False], loops
    for n in (2, 3):
        assert all(np.array_equal(outs[True, n][k], outs[False, n][k]) for k in outs[True, n])


@pytest.mark.parametrize(("case", "options", "why"), [
    ((1, 64, 64, 14, 14), dict(winograd_u_from_weights=False), "off"),
    ((1, 64, 64, 14, 14), dict(winograd_u_from_weights_min_bytes=8 << 20), "U below the minimum"),
    ((1, 64, 64, 14, 14), dict(winograd_f4=False), "F(2x2): U only 16/9 of the weights"),
    ((1, 64, 64, 14, 14), dict(winograd_shared_transform=False), "no shared region"),
    ((2, 64, 64, 14, 14), {}, "two images: a block each, U would be computed twice"),
    ((1, 64, 64, 30, 30), {}, "64 tiles: several blocks"),
    ((1, 64, 70, 14, 14), dict(vector_isa="avx2"), "70 channels end in a tail panel"),
])
def test_u_from_weights_refused(case, options, why):
    """Where U is not computed from the weights the kernel streams the stored U alone: no packed weights, no
    computation, no note (``winograd_u_from_weights`` off, U under ``winograd_u_from_weights_min_bytes``, a
    transform whose U is under ``winograd_u_from_weights_min_ratio`` times the weights, no shared region, more
    than one block, a tail panel)."""
    g, plan = conv_block(*case, [1, 1, 1, 1])
    kw = {**UFW, **options}
    program = generate(g, plan, options=CodegenOptions(**kw))
    notes = [n for k in program.kernels for n in k.notes]
    assert "Winograd F(" in program.source  # still Winograd, only U streamed
    assert "conv_gp" not in program.source, why
    assert not any("U computed from the 3x3 weights" in n for n in notes), why
    if why == "off":  # the same convolution with the option on does compute it
        on = generate(g, plan, options=CodegenOptions(**UFW))
        assert "conv_gp" in on.source


def test_column_tails_where_narrower_panels_take_fewer_steps():
    """``_column_tails``: the last block's tiles past its whole NR panels (rounded up to 8) on 16- and 8-tile panels
    where their k steps (multiply-adds or loads, whichever more: ``_panel_steps``) are fewer than one padded NR
    panel's: 8 x 32 takes 8 steps, 8 x 16 and 8 x 8 4.5 each (9 loads), so 8 and 16 left over go narrow, 24 stays
    padded; 16 x 16 in zmm against 16 x 8 in ymm is 8.5 against 8.5: never; AVX2's 6 x 16 (12) against 6 x 8 (7)."""
    from opfuse.codegen.winograd import _column_tails, _panel_steps
    assert (_panel_steps(8, 32, True), _panel_steps(8, 16, True), _panel_steps(8, 8, True)) == (16, 9, 9)
    assert [_column_tails(8, 32, True, n) for n in (4, 8, 9, 16, 17, 24, 32, 36)] == \
        [[8], [8], [16], [16], [], [], [], [8]]
    assert [_column_tails(16, 16, True, n) for n in (4, 8, 16)] == [[], [], []]
    assert [_column_tails(6, 16, False, n) for n in (4, 8, 16, 17)] == [[8], [8], [], [8]]
    assert _column_tails(8, 24, True, 4) == []  # an NR it does not split


@pytest.mark.parametrize(("case", "options", "tail"), [
    ((1, 32, 32, 40, 40), WIDE_HOST, "8x8"),                  # 100 tiles in blocks of 32: the last 4 on 8 x 8
    ((1, 32, 32, 24, 24), dict(vector_isa="avx2"), "6x8"),    # 36 in blocks of 16, and 32 channels end in 2 x 8
])
def test_column_tails_same_bits_as_the_padded_panel(case, options, tail, cache_dir):
    """``winograd_column_tails``: the last block's partial panel of tiles on a narrower micro-kernel gives the bits
    of the padded NR panel (each output's sum the same products in the same order), at 1 and 2 threads, within the
    tolerance of the reference; off, no narrow kernel is emitted."""
    g, plan = conv_block(*case, [1, 1, 1, 1])
    o = CodegenOptions(**options)
    for threads in (1, 2):
        got, want, m = run_both(g, plan, cache_dir, options=o, threads=threads)
        padded, _, m0 = run_both(g, plan, cache_dir, options=o.with_(winograd_column_tails=False), threads=threads)
        assert f"opfuse_ukr_{tail}_packed_strided" in m.program.source
        assert f"opfuse_ukr_{tail}_packed_strided" not in m0.program.source
        assert_close(got, want)
        for k in got:
            assert np.array_equal(got[k], padded[k])
    if options is not WIDE_HOST:  # the channels' tail panel (2 of 32 over 6-row panels) takes its column tail too
        assert "opfuse_ukr_2x8_packed_strided" in m.program.source


@pytest.mark.parametrize(("case", "block"), [((1, 32, 32, 28, 28), "8x32"), ((1, 32, 32, 24, 24), "16x16")],
                         ids=["24_left", "zmm_16x16"])
def test_no_column_tails_where_padding_is_cheaper(case, block):
    """49 tiles in blocks of 32 leave 24 (16 + 8 would take more steps than one padded 32), and the 16 x 16 zmm
    block gains nothing from 16 x 8: the padded panel as before, one micro-kernel."""
    g, plan = conv_block(*case, [1, 1, 1, 1])
    src = generate(g, plan, options=CodegenOptions(**WIDE_HOST)).source
    assert "Winograd F(4x4,3x3)" in src
    assert set(re.findall(r"opfuse_ukr_(\d+x\d+)_packed_strided", src)) == {block}
    assert "long jt" not in src


def test_stored_u_gemms_without_the_v_prefetch_same_bits(cache_dir):
    """``winograd_prefetch_v=False``: the GEMMs on the stored U read V without prefetching it (V[xi] is the same for
    every panel); on (the default), they prefetch it ``gemm_prefetch`` steps ahead (``_pf<steps>`` in the
    micro-kernel's name). The GEMMs computing U from the weights prefetch V either way (the next xi's rows,
    ``winograd_fw_prefetch_next_xi``: 65 rows of 16 tiles on). The same bits."""
    g, plan = _one_block_f4()
    base = CodegenOptions(**UFW, **WIDE_HOST, winograd_prefetch_v=False)
    off = generate(g, plan, options=base).source
    on = generate(g, plan, options=base.with_(winograd_prefetch_v=True)).source
    assert on == generate(g, plan, options=CodegenOptions(**UFW, **WIDE_HOST)).source
    steps = base.gemm_prefetch
    stored = set(re.findall(r"(opfuse_ukr_\d+x\d+_packed_strided\w*)\(kb", off))
    assert stored and all(f"_pf{steps}" not in k for k in stored if "_bn" not in k)
    assert any("_bn" in k and "_pf65" in k for k in stored)  # the U-from-weights kernel keeps its own
    assert all(f"_pf{steps}" in k for k in re.findall(r"(opfuse_ukr_\d+x\d+_packed_strided\w*)\(kb", on)
               if "_bn" not in k)
    for threads in (1, 2):
        a, want, _ = run_both(g, plan, cache_dir, options=base, threads=threads)
        b, _, _ = run_both(g, plan, cache_dir, options=base.with_(winograd_prefetch_v=True), threads=threads)
        assert_close(a, want)
        assert all(np.array_equal(a[k], b[k]) for k in a)
