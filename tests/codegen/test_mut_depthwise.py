"""``codegen/depthwise.py`` where mutation testing (tests/mutation/mutW.md, issue 13) found no test.

The in-place paths read their input where it lies (no padded copy), so a load outside the input tensor reads
another buffer's floats or faults. Lanes that fall in the padding are masked, so such a load changes no result
and only a fault shows it: here each input lies between two inaccessible pages (``mprotect``), and the model runs
in a forked child process (a fault ends the child, not the test session), against the reference. And the AVX-512
rows body's taps exactly one zmm (16 columns) to the right, which it loads rather than shifts out of two blocks."""
from __future__ import annotations

import ctypes
import mmap
import os
import signal
import sys
import time

import numpy as np
import pytest

from cg_support import assert_close, group_by_names
from opfuse.codegen import CodegenOptions
from opfuse.ops import GraphBuilder

PAGE = mmap.PAGESIZE
# (channels, H, W, stride, epilogue): each input a whole number of pages, so that it starts and ends at a page
# boundary with an inaccessible page on either side.
CASES = {
    "plane-relu": (16, 8, 8, 1, "relu"),     # the zmm shifted plane, its register epilogue (AVX2: the direct plane)
    "plane": (16, 8, 8, 1, "none"),          # the shifted plane into the dense buffer
    "plane-add": (16, 8, 8, 1, "add"),       # a residual Add: the zmm rows over the plane
    "rows": (4, 16, 64, 1, "relu"),          # rows of 64: the rows path
    "rows-stride2": (4, 32, 32, 2, "none"),  # stride 2: even/odd floats of two loads
}


def _graph(case: str):
    c, h, w, s, epi = CASES[case]
    rng = np.random.default_rng(21)
    b = GraphBuilder(f"dw_fence_{case.replace('-', '_')}")
    x = b.input("x", (1, c, h, w))
    y = b.op("Conv", x, b.const("w", (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32)),
             b.const("b", (rng.standard_normal(c) / 3).astype(np.float32)), kernel_shape=[3, 3], strides=[s, s],
             pads=[1, 1, 1, 1], group=c, name="dw")
    names = ["dw"]
    if epi == "relu":
        y = b.op("Relu", y, name="e")
        names.append("e")
    elif epi == "add":
        y = b.op("Add", y, b.input("res", y.shape), name="e")
        names.append("e")
    g = b.build(y)
    return g, group_by_names(g, [("conv_epilogue", names)])


def _fenced(a: np.ndarray) -> tuple[np.ndarray, mmap.mmap]:
    """A copy of ``a`` (a whole number of pages) with an inaccessible page just before and just after it."""
    assert a.nbytes % PAGE == 0
    buf = mmap.mmap(-1, a.nbytes + 2 * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for at in (base, base + PAGE + a.nbytes):
        assert libc.mprotect(at, PAGE, 0) == 0, os.strerror(ctypes.get_errno())  # PROT_NONE
    out = np.frombuffer(buf, dtype=a.dtype, count=a.size, offset=PAGE).reshape(a.shape)
    out[...] = a
    return out, buf


def _run_fenced(model, feeds: dict, want: dict) -> int:
    """In a forked child: run ``model`` on fenced copies of ``feeds`` and compare with ``want``; the child's exit
    status (0: the reference's values, 1: other values or an error, -SIGSEGV: a load outside an input)."""
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        code = 1
        try:
            fenced = {k: _fenced(v) for k, v in feeds.items()}
            assert_close(model.run({k: v[0] for k, v in fenced.items()}), want)
            code = 0
        finally:
            os._exit(code)
    for _ in range(1200):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -signal.SIGKILL


@pytest.mark.skipif(sys.platform != "linux", reason="fork and mprotect through the C library: Linux")
@pytest.mark.parametrize("case", list(CASES))
def test_in_place_paths_read_nothing_outside_the_input(case, cache_dir):
    """Each case's input between two inaccessible pages: the kernel (one thread) runs to the end (no fault) with
    the reference's values. The options ask for the AVX-512 bodies (run on an AVX-512 host; the AVX2 ones
    elsewhere). The kernel is built here and run in a forked child (a fault ends the child, not the session)."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, plan = _graph(case)
    feeds = reference.random_inputs(g, 0)
    model = build(g, plan, cache_dir=cache_dir, threads=1,
                  options=CodegenOptions(vector_isa="avx512", depthwise_avx512=True))
    assert _run_fenced(model, feeds, reference.run(g, feeds)) == 0


def test_taps_sixteen_columns_to_the_right_in_the_zmm_rows_body(cache_dir):
    """The zmm rows body moves a tap's vector out of two 16-float blocks (``valignd``, ``_shifted_tap``) only where
    every tap lies less than 16 columns from its output (``valignd`` shifts by 0 to 15 lanes); a 3x3 kernel
    dilated by 8 and a 5x5 dilated by 4, without padding, have a tap exactly 16 columns to the right: they load
    their taps instead. Against the reference (AVX-512 body on an AVX-512 host, AVX2 elsewhere)."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    rng = np.random.default_rng(4)
    b = GraphBuilder("dw_far_taps")
    outs = []
    for i, (k, d) in enumerate(((3, 8), (5, 4))):
        x = b.input(f"x{i}", (1, 2, 20, 40))
        outs.append(b.op("Conv", x, b.const(f"w{i}", rng.standard_normal((2, 1, k, k)).astype(np.float32)),
                         kernel_shape=[k, k], dilations=[d, d], pads=[0, 0, 0, 0], group=2, name=f"dw{i}"))
    g = b.build(*outs)
    plan = group_by_names(g, [("conv_epilogue", ["dw0"]), ("conv_epilogue", ["dw1"])])
    model = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(vector_isa="avx512", depthwise_avx512=True))
    notes = [n for k in model.program.kernels for n in k.notes]
    assert sum("AVX-512 body (zmm)" in n for n in notes) == 2, notes
    feeds = reference.random_inputs(g, 0)
    assert_close(model.run(feeds), reference.run(g, feeds))


@pytest.mark.parametrize("simd", ["none", "auto"])
def test_row_stride_two_column_stride_one_on_a_small_plane(simd, cache_dir):
    """Strides (2, 1) on a plane small enough for the padded copy's single wide row, which is for stride 1 both
    ways only (its result ``i = oh * Wp + ow`` reads row ``oh``, not ``2 oh``): one pass per output row. The plain
    C99 build copies every plane; the AVX2/AVX-512 build reads it in place (direct rows). Against the
    reference."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    rng = np.random.default_rng(6)
    b = GraphBuilder("dw_strides_2_1")
    x = b.input("x", (1, 3, 9, 10))
    y = b.op("Conv", x, b.const("w", rng.standard_normal((3, 1, 3, 3)).astype(np.float32)),
             b.const("bias", rng.standard_normal(3).astype(np.float32)), kernel_shape=[3, 3], pads=[1, 1, 1, 1],
             strides=[2, 1], group=3, name="dw")
    g = b.build(y)
    plan = group_by_names(g, [("conv_epilogue", ["dw"])])
    model = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(simd=simd))
    feeds = reference.random_inputs(g, 0)
    assert_close(model.run(feeds), reference.run(g, feeds))


def test_a_plane_of_exactly_the_minimum_zmm_with_short_rows_takes_the_plane():
    """8x8 outputs are 4 zmm as one plane (``depthwise_zmm_plane_min_vectors``, 4) and 8 as rows (ratio 2, above
    ``depthwise_zmm_plane_rows_max_ratio``): with a residual Add (no register epilogue) the zmm plane, the C that
    ``depthwise_zmm_plane_rows=False`` gives, not the rows; one vector fewer as a minimum of 5 keeps the rows."""
    from opfuse.codegen import generate
    from test_depthwise_avx512 import EPILOGUES, ZMM_ON, multi_graph
    assert (ZMM_ON.depthwise_zmm_plane_min_vectors, ZMM_ON.depthwise_zmm_plane_rows_max_ratio) == (4, 1.3)
    g, plan = multi_graph([(2, 8, 8, 3, 1, [1, 1, 1, 1], 1)], shift=EPILOGUES.index("add"))
    src = generate(g, plan, options=ZMM_ON).source
    planes = generate(g, plan, options=ZMM_ON.with_(depthwise_zmm_plane_rows=False)).source
    rows = generate(g, plan, options=ZMM_ON.with_(depthwise_zmm_plane_min_vectors=5)).source
    assert src == planes and src != rows


def test_the_report_says_where_the_epilogue_is_finished_in_registers():
    """A zmm rows layer's note says "its epilogue in registers" where it is (a Relu), not where the epilogue runs
    after the sums (a residual Add)."""
    from opfuse.codegen import generate
    from test_depthwise_avx512 import EPILOGUES, ZMM_ON, multi_graph
    for epi, want in (("add", ["depthwise 'dw0': AVX-512 body (zmm)"]),
                      ("relu", ["depthwise 'dw0': epilogue finished in registers",
                                "depthwise 'dw0': AVX-512 body (zmm), its epilogue in registers"])):
        g, plan = multi_graph([(2, 20, 24, 3, 1, [1, 1, 1, 1], 1)], shift=EPILOGUES.index(epi))
        assert [n for k in generate(g, plan, options=ZMM_ON).kernels for n in k.notes] == want
