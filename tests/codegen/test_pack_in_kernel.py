"""A 1x1 convolution whose input rows are packed per tile (B = channels x positions) has the first row block's
micro-kernel call on each panel read the panel's rows in place and store them to the packed panel as it goes
(``gemm.pack_in_kernel``, ``CodegenOptions.gemm_pack_in_kernel``; ``microkernel``'s ``b_copy``): no copy pass
before the calls, the tile's other calls reading the packed panel as before. The same values reach the same packed
panel, so the results are the same bits with and without it, whatever the K blocks, part panels, row tiles and
threads; the kernel's notes say it; nothing changes where it does not apply."""
from __future__ import annotations

import ctypes
import platform
import re

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, pointwise_relu, run_both
from opfuse.codegen import CodegenOptions
from opfuse.codegen.microkernel import microkernel
from opfuse.codegen.options import CORTEX_M7
from opfuse.codegen.program import generate
from opfuse.ops import GraphBuilder
from test_avx512 import HOST_HAS_AVX512, NO_AVX512_REASON, _compile

rng = np.random.default_rng(23)
NOTE = "B's panels packed by the first row block's micro-kernel calls (read in place, stored as they are read)"


def pointwise(c: int, oc: int, hw: int):
    return pointwise_relu(c, oc, hw, rng, "inkernel")


def _notes(program) -> list[str]:
    return [n for k in program.kernels if k.function for n in k.notes if NOTE in n]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_1x1_convolution_packs_its_input_in_the_first_calls(isa):
    """64 -> 64 channels at 32x32: 1024 positions in whole panels (AVX2's 16 columns, AVX-512's 32), 256 KB out
    (B's panel outermost). The first row block's call on a panel is the copying variant, the others the packed
    one, and no copy runs before them; without the option, the row copies and no copying variant."""
    g, plan = pointwise(64, 64, 32)
    program = generate(g, plan, options=CodegenOptions(vector_isa=isa))
    (note,) = _notes(program)
    assert note.endswith(NOTE)
    src = program.source
    assert "_strided_pf32" in src and "_cp_stbr(" in src and "float* restrict bp," in src
    assert "memcpy(bpack" not in src
    call = src.split("_cp_stbr(kc")[1].split(");")[0]  # the copying call: B in place, 1024 floats a row
    assert "p1_x + n" in call and ", 1024, ctile" in call and "pc" in call and ", bpack" in call
    assert "if (ir" in src and " == 0) {" in src
    off = generate(g, plan, options=CodegenOptions(vector_isa=isa, gemm_pack_in_kernel=False))
    assert not _notes(off) and "_cp" not in off.source and "memcpy(bpack" in off.source


def test_a_part_last_panel_is_copied_before_the_calls():
    """28x28 = 784 positions: 24 whole panels of 32 and one of 16 (AVX-512). The whole ones are packed by the
    calls (the copying call only where the panel is whole); the part one is copied, padded with zeros, as before."""
    g, plan = pointwise(32, 40, 28)
    src = generate(g, plan, options=CodegenOptions(vector_isa="avx512")).source
    assert re.search(r"== 0 && n\d+ \+ jr\d+ \+ 32 <= 784\) \{", src)  # the copying call where the panel is whole
    assert "== 32) continue;" in src and "memcpy(" not in src  # the whole panels skipped by the copy
    assert "= 0.0f;" in src  # the part panel's padding


def test_nothing_changes_where_it_does_not_apply():
    """The output of 3.2 MB with B's K block in L2 takes A's panels outermost (``gemm_rows_outer_store``): the
    first row block would read every panel in place, one after the other; the plain C99 build, the Cortex-M7's and
    the aarch64 one have no copying variant; a strided 1x1 convolution and a 3x3 read windows, a MatMul's weights
    are packed at build time."""
    g, plan = pointwise(32, 64, 112)
    assert not _notes(generate(g, plan)) and "_cp" not in generate(g, plan).source
    g, plan = pointwise(64, 64, 32)
    for options in (CodegenOptions(simd="none"), CORTEX_M7, CodegenOptions(vector_isa="neon")):
        program = generate(g, plan, options=options)
        assert not _notes(program) and "_cp" not in program.source
    b = GraphBuilder("windows")
    x = b.input("x", (1, 32, 32, 32))
    for k, s in ((1, 2), (3, 1)):
        w = b.const(f"w{k}{s}", (rng.standard_normal((32, 32, k, k)) / 10).astype(np.float32))
        out = b.op("Conv", x, w, kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4, name=f"conv{k}{s}")
        gw = b.build(out)
        assert not _notes(generate(gw, group_by_names(gw, [])))
    bm = GraphBuilder("dense")
    xm = bm.input("x", (64, 64))
    wm = bm.const("w", rng.standard_normal((64, 96)).astype(np.float32))
    gm = bm.build(bm.op("MatMul", xm, wm, name="mm"))
    assert not _notes(generate(gm, group_by_names(gm, [])))


def _problem(M: int = 64, N: int = 1024, K: int = 64, step: int | None = 1024, ptr: bool = True):
    from opfuse.codegen.gemm import GemmProblem, Operand
    a = Operand(lambda ev, b, m, k: "0", static=np.zeros((1, M, K), np.float32))
    b = Operand(lambda ev, b, k, n: "0")
    if ptr:
        b.row_ptr = lambda b, k, n: f"x + {k} * {N} + {n}"
    b.row_step = step
    return GemmProblem("pw", 1, M, N, K, a, b, None, None)  # type: ignore[arg-type]


def test_each_condition_alone_refuses():
    """``pack_in_kernel`` directly: its answer with every condition met, then each one alone unmet."""
    from opfuse.codegen.gemm import pack_in_kernel
    o = CodegenOptions(vector_isa="avx512")

    def pik(p=None, o=o, packed_b=True, packer=False, gather="", body=64, a_outer=False):
        return pack_in_kernel(p or _problem(), o, packed_b, packer, gather, body, a_outer)

    assert pik() and pik(o=o.with_(vector_isa="avx2")) and pik(body=1)
    assert not pik(packed_b=False) and not pik(packer=True) and not pik(gather="panel") and not pik(body=0)
    assert not pik(body=-6)  # the last row tile of tail panels only (see below)
    assert not pik(a_outer=True)
    assert not pik(_problem(ptr=False)) and not pik(_problem(step=None))
    assert not pik(o=o.with_(gemm_pack_in_kernel=False)) and not pik(o=o.with_(simd="none"))
    assert not pik(o=o.with_(vector_isa="neon")) and not pik(o=o.with_(platform="mcu"))


def two_images(c: int, oc: int, hw: int):
    """``pointwise`` on a batch of two: each image's positions are the GEMM's columns of its own batch entry."""
    return pointwise_relu(c, oc, hw, rng, "inkernel2", batch=2)


# (graph, options): whole panels in one K block; a part last panel (one image, two); three K blocks; row tiles
# with a part block
CASES = {
    "whole": (lambda: pointwise(64, 64, 32), {}),
    "part_panel": (lambda: pointwise(32, 40, 28), {}),
    "two_images_part_panel": (lambda: two_images(24, 40, 28), {}),
    "k_blocks": (lambda: pointwise(96, 48, 32), dict(gemm_kc=40)),
    "row_tiles": (lambda: pointwise(40, 150, 16), dict(gemm_wide=64)),
}


def test_a_last_row_tile_of_tail_panels_only_keeps_the_copy(cache_dir):
    """70 output channels in row tiles of 64: the last tile's 6 rows are a tail panel alone, no whole block's call to
    pack its panels (the tail panel read them unpacked: errors of 3.6 before this was refused); 64 + 16 + 6 rows
    (the last tile with a whole block first) packs them in its calls."""
    g, plan = pointwise(40, 70, 16)
    got, want, model = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_wide=64))
    assert not _notes(model.program) and "_cp" not in model.program.source and "memcpy(" in model.program.source
    assert_close(got, want)
    g, plan = pointwise(40, 86, 16)
    got, want, model = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_wide=64))
    assert _notes(model.program) and "last 6 of 86 rows" in " ".join(n for k in model.program.kernels for n in k.notes)
    assert_close(got, want)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_bits_with_and_without(case, cache_dir):
    make, kw = CASES[case]
    g, plan = make()
    on = CodegenOptions(**kw)
    got, want, model = run_both(g, plan, cache_dir, options=on, threads=1)
    assert _notes(model.program) and "_cp" in model.program.source
    assert_close(got, want)
    for threads, opts in ((2, on), (1, CodegenOptions(gemm_pack_in_kernel=False, **kw))):
        other = run_both(g, plan, cache_dir, options=opts, threads=threads)[0]
        assert all(np.array_equal(got[k], other[k]) for k in got), (case, threads)


# The micro-kernel alone ------------------------------------------------------------------------------------------
HOST_X86 = platform.machine().lower() in ("x86_64", "amd64")


def _call(lib, fn: str, mr: int, nr: int, kc: int, load_c: bool, epi: bool, copy: bool, data):
    """The block's result (C, or ``out`` with the epilogue) and, for the copying variant, the panel it stored."""
    A, B, C0, bias = data
    fp = ctypes.POINTER(ctypes.c_float)
    C, out = C0.copy(), np.zeros((mr, nr), np.float32)
    packed_a = np.ascontiguousarray(A.T)
    panel = np.ascontiguousarray(B[:, 3:3 + nr])  # the packed panel: its rows NR floats apart
    bp = np.full(kc * nr, np.nan, np.float32)
    b_ptr = B[:, 3:].ctypes.data_as(fp) if copy else panel.ctypes.data_as(fp)
    args = [ctypes.c_long(kc), packed_a.ctypes.data_as(fp), (ctypes.c_void_p * mr)(),
            ctypes.POINTER(ctypes.c_int32)(), b_ptr, ctypes.c_long(B.shape[1] if copy else nr),
            C.ctypes.data_as(fp), ctypes.c_long(nr), ctypes.c_int(int(load_c))]
    if copy:
        args.append(bp.ctypes.data_as(fp))
    if epi:
        args += [bias.ctypes.data_as(fp), out.ctypes.data_as(fp), ctypes.c_long(nr)]
    f = getattr(lib, fn)
    f.restype = None
    f(*args)
    return (out if epi else C), bp.reshape(kc, nr)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "plain"])
def test_the_micro_kernel_packs_what_it_reads_and_computes_the_same_bits(isa, tmp_path):
    """The copying variant of blocks that fit one pass and that AVX2 splits (8 x 32: four sub-blocks of 4 x 16),
    B read in place from rows 45 floats apart: the same result as the packed variant on the packed panel, and the
    panel it stored is that packed panel, every value (none left NaN)."""
    if isa == "avx512" and not HOST_HAS_AVX512:
        pytest.skip(NO_AVX512_REASON)
    if isa != "plain" and not HOST_X86:
        pytest.skip("not an x86-64 host: no AVX2 or AVX-512 to compile for")
    flags = {"avx512": ["-march=native"], "avx2": ["-march=native", "-mno-avx512f"], "plain": []}[isa]
    blocks = [(8, 32, None), (7, 32, "br"), (6, 16, "b")]
    texts, pairs = [], []
    for mr, nr, epi in blocks:
        copying = microkernel(mr, nr, "packed", "strided", "auto", 16, avx512=True, epilogue=epi, b_copy=True)
        packed = microkernel(mr, nr, "packed", "packed", "auto", 16, avx512=True, epilogue=epi)
        assert copying[0].endswith("_cp" + (f"_st{epi}" if epi else ""))
        texts += [copying[1], packed[1]]
        pairs.append((mr, nr, epi, copying[0], packed[0]))
    lib = _compile(tmp_path, "\n".join(texts).replace("static void", "void"), flags, isa)
    for mr, nr, epi, fn, plain in pairs:
        for kc, load_c in ((29, False), (40, True)):
            data = (rng.standard_normal((mr, kc)).astype(np.float32), rng.standard_normal((kc, 45)).astype(np.float32),
                    rng.standard_normal((mr, nr)).astype(np.float32), rng.standard_normal(mr).astype(np.float32))
            got, bp = _call(lib, fn, mr, nr, kc, load_c, epi is not None, True, data)
            want, _ = _call(lib, plain, mr, nr, kc, load_c, epi is not None, False, data)
            assert np.array_equal(got, want), (fn, kc)
            assert np.array_equal(bp, data[1][:, 3:3 + nr]), (fn, kc)


def test_each_column_is_stored_once_and_the_variant_is_x86_and_plain_c_only():
    """The AVX-512 body stores its two B vectors a step; AVX2's split body (four passes of 4 x 16) stores in its
    two passes over the first rows only; the plain C copies the row. No AdvSIMD, packed-B or split-B variant."""
    _, text = microkernel(8, 32, "packed", "strided", "auto", 16, avx512=True, b_copy=True)
    avx512, rest = text.split("#elif", 1)
    assert avx512.count("_mm512_storeu_ps(bp + k * 32 + ") == 2
    avx2, plain = rest.split("#else", 1)
    assert avx2.count("_mm256_storeu_ps(bp + k * 32 + ") == 4  # two passes x two ymm
    assert "const float* restrict ak = a + 0;\n" in avx2.split("_mm256_storeu_ps(bp")[0]
    assert "for (int j = 0; j < 32; ++j) bp[k * 32 + j] = bk[j];" in plain
    for bad in (dict(b="packed"), dict(neon=True), dict(b="koff", b_split=16)):
        kw = dict(dict(b="strided"), **bad)
        b = kw.pop("b")
        with pytest.raises(AssertionError, match="in place"):
            microkernel(8, 32, "packed", b, "auto", 16, b_copy=True, **kw)


def _sweep(seed: int) -> tuple[int, int, int, int, int, int]:
    """(channels in, out, side, batch, gemm_wide, gemm_kc) of a 1x1 convolution drawn so that row tiles, tail
    panels, part panels, two images and K blocks come up across the seeds."""
    r = np.random.default_rng(seed)
    wide = int(r.choice([8, 16, 32, 64]))
    return (int(r.integers(3, 70)), int(r.integers(1, 3 * wide)), int(r.choice([8, 16, 20, 28])),
            int(r.integers(1, 3)), wide, int(r.choice([0, 16, 24])))


@pytest.mark.parametrize("seed", range(10))
def test_random_shapes_the_same_bits_with_and_without(seed, cache_dir):
    """Drawn shapes and blockings (``_sweep``): the reference's values, and the same bits as the copy before the
    calls, whether or not the calls pack (both happen across the seeds)."""
    c, oc, hw, batch, wide, kc = _sweep(seed)
    g, plan = pointwise_relu(c, oc, hw, np.random.default_rng(seed), f"sweep{seed}", batch=batch)
    kw = dict(gemm_wide=wide, **({"gemm_kc": kc} if kc else {}))
    got, want, _ = run_both(g, plan, cache_dir, options=CodegenOptions(**kw))
    assert_close(got, want)
    off = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_pack_in_kernel=False, **kw))[0]
    assert all(np.array_equal(got[k], off[k]) for k in got), (c, oc, hw, batch, wide, kc)


def test_the_sweep_reaches_both_ways():
    """The seeds above draw shapes that pack in the calls and shapes that do not (their last row tile of tail panels
    only, or A's panels outermost); ``test_a_last_row_tile_of_tail_panels_only_keeps_the_copy`` builds that case."""
    packs = set()
    for seed in range(10):
        c, oc, hw, batch, wide, kc = _sweep(seed)
        g, plan = pointwise_relu(c, oc, hw, np.random.default_rng(seed), f"sweep{seed}", batch=batch)
        program = generate(g, plan, options=CodegenOptions(gemm_wide=wide, **({"gemm_kc": kc} if kc else {})))
        packs.add(bool(_notes(program)))
    assert packs == {True, False}
