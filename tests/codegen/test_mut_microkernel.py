"""``codegen/microkernel.py`` where mutation testing (tests/mutation/mutM.md, issue 13) found no test: B's row in
more than two pieces (``b_split``: piece ``p`` at ``p * ldb`` floats past the first, a panel of positions spread over
three or four output rows of a convolution band), compiled the three ways against NumPy; the AdvSIMD storing
micro-kernels with a one-letter epilogue (a Relu alone, a bias alone) under qemu-aarch64 against the reference, in
one program (their function names must differ); the 32 q-register rule at a row count just past it; the transposed
storing micro-kernels in one translation unit with ``-pedantic-errors -Werror`` (each defines and undefines its
store macro: a macro defined again with another body is a constraint violation, C99 6.10.3p2); a transposed and a
row-storing micro-kernel of one block in one program."""
from __future__ import annotations

import ctypes
import os
import platform
import signal
import time

import numpy as np
import pytest

from cg_support import assert_close
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.microkernel import fits_neon, microkernel
from opfuse.compiler import plan_model
from opfuse.ops import GraphBuilder
from opfuse.runtime import aarch64, reference
from opfuse.runtime.native import build
from test_avx512 import HOST_HAS_AVX512, NO_AVX512_REASON, _compile
from test_neon import needs_tools
from test_transposed_store import UKERNELS

rng = np.random.default_rng(13)
# (MR, NR, B's piece in floats, an AVX-512 body): three pieces of a zmm, three and four of a ymm (the zmm body needs
# whole zmm pieces: ``conv_direct.wide_direct_block``); the GEMM asks for two pieces only, the kernel takes any count
SPLIT_KERNELS = [(8, 48, 16, True), (6, 24, 8, False), (4, 32, 8, False)]


def _call_split(lib, fn: str, mr: int, nr: int, split: int, kc: int, load_c: bool):
    """A packed A panel times B whose row ``k`` is at ``b + koff[k]`` (rows shuffled, gaps between them), piece
    ``p`` of it ``p * ldb`` floats past its first; (the block, NumPy's)."""
    A = rng.standard_normal((mr, kc)).astype(np.float32)
    B = rng.standard_normal((kc, nr)).astype(np.float32)
    pieces, step = nr // split, split + 3
    ldb = kc * step + 5
    b = np.zeros(pieces * ldb, dtype=np.float32)
    order = rng.permutation(kc)
    koff = np.zeros(kc + 64, dtype=np.int32)  # the prefetch reads entries past the last k
    for k in range(kc):
        for p in range(pieces):
            at = p * ldb + order[k] * step
            b[at:at + split] = B[k, p * split:(p + 1) * split]
    koff[:kc] = order * step
    koff[kc:] = koff[kc - 1]
    ldc = nr + 3
    C0 = rng.standard_normal((mr, ldc)).astype(np.float32)
    C = C0.copy()
    packed = np.ascontiguousarray(A.T)
    fp = ctypes.POINTER(ctypes.c_float)
    f = getattr(lib, fn)
    f.restype = None
    f(ctypes.c_long(kc), packed.ctypes.data_as(fp), (ctypes.c_void_p * mr)(),
      koff.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), b.ctypes.data_as(fp), ctypes.c_long(ldb),
      C.ctypes.data_as(fp), ctypes.c_long(ldc), ctypes.c_int(int(load_c)))
    assert np.array_equal(C[:, nr:], C0[:, nr:])  # nothing written past the block's columns
    return C[:, :nr], A.astype(np.float64) @ B.astype(np.float64) + (C0[:, :nr] if load_c else 0)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "plain"])
def test_b_in_three_and_four_pieces_matches_numpy(isa, tmp_path):
    if isa == "avx512" and not HOST_HAS_AVX512:
        pytest.skip(NO_AVX512_REASON)
    if isa != "plain" and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("not an x86-64 host: no AVX2 or AVX-512 to compile for")
    flags = {"avx512": ["-march=native"], "avx2": ["-march=native", "-mno-avx512f"], "plain": []}[isa]
    kernels = [microkernel(mr, nr, "packed", "koff", "auto", 16, avx512=wide, b_split=split)
               for mr, nr, split, wide in SPLIT_KERNELS]
    lib = _compile(tmp_path, "\n".join(text for _, text in kernels).replace("static void", "void"), flags, isa)
    assert "_mm512_fmadd_ps" in kernels[0][1]
    for (mr, nr, split, _), (fn, _) in zip(SPLIT_KERNELS, kernels, strict=True):
        for kc, load_c in ((29, False), (3, True)):
            got, want = _call_split(lib, fn, mr, nr, split, kc, load_c)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(kc), err_msg=f"{fn} kc={kc}")


def test_a_row_count_just_past_the_32_q_registers_is_split():
    """9 x 12: 27 accumulators + 3 B vectors + 3 A vectors = 33 q registers: the NEON body computes it in groups
    of rows (each group loads its own A panel start); 8 x 12 (24 + 3 + 2) in one."""
    assert fits_neon(8, 12) and not fits_neon(9, 12)
    assert microkernel(9, 12, neon=True)[1].count("const float* restrict ak = a + ") == 2  # rows 0-4, then 5-8
    assert microkernel(8, 12, neon=True)[1].count("const float* restrict ak = a + ") == 1


@needs_tools
def test_neon_storing_kernels_with_a_relu_alone_and_a_bias_alone_under_qemu():
    """Conv 1x1 (no bias) -> Relu -> Conv 1x1 with a bias: the first GEMM's micro-kernel applies the Relu alone and
    stores, the second adds the bias alone and stores; their AdvSIMD bodies under qemu within the x86 tests'
    tolerance of the reference (a dropped Relu or bias, or two kernels under one name, are far off). 8 x 12 = 96
    positions fill six 16-column panels, so both pack X's rows (``conv.PACKED_WASTE``) and store from registers."""
    b = GraphBuilder("relu_then_bias")
    x = b.input("x", (1, 8, 8, 12))
    y = b.op("Relu", b.op("Conv", x, b.const("w1", rng.standard_normal((20, 8, 1, 1)).astype(np.float32)),
                          name="c1"))
    b2 = b.const("b2", rng.standard_normal(16).astype(np.float32))
    g = b.build(b.op("Conv", y, b.const("w2", rng.standard_normal((16, 20, 1, 1)).astype(np.float32)), b2, name="c2"))
    comp = plan_model(g)
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan, comp.memory)
    notes = [n for k in program.kernels for n in k.notes]
    assert "GEMM 'c1': output Relu applied and stored by the micro-kernel" in notes
    assert "GEMM 'c2': output bias added and stored by the micro-kernel" in notes
    feeds = reference.random_inputs(g, 0)
    want = reference.run(g, feeds)
    assert_close(aarch64.run_on_qemu(program, feeds).outputs, want)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_transposed_micro_kernels_compile_without_a_diagnostic(isa, tmp_path):
    if isa == "avx512" and not HOST_HAS_AVX512:
        pytest.skip(NO_AVX512_REASON)
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("not an x86-64 host: no AVX2 or AVX-512 to compile for")
    flags = {"avx512": ["-march=native"], "avx2": ["-march=native", "-mno-avx512f"]}[isa]
    texts = [microkernel(mr, nr, "packed", "packed", "auto", 16, avx512=True, epilogue=epi, transposed=True)[1]
             for mr, nr, epi in UKERNELS if epi]
    _compile(tmp_path, "\n".join(texts), [*flags, "-pedantic-errors", "-Werror"], "strict" + isa)


def _conv_relu(b, name, x, oc):
    w = b.const(name + "_w", rng.standard_normal((oc, x.shape[1], 1, 1)).astype(np.float32))
    return b.op("Relu", b.op("Conv", x, w, b.const(name + "_b", rng.standard_normal(oc).astype(np.float32)),
                             name=name))


def test_a_transposed_and_a_row_storing_kernel_of_one_block_in_one_program(cache_dir):
    """Two 1x1 Convs with a bias and a Relu, both 6 x 16 packed x packed on the AVX2 target: at 7x7 over its
    windows with the positions packed (stored transposed), at 16x16 over its packed rows (stored along the
    rows). Two micro-kernels, each GEMM's results as the reference. Built and run in a forked child: where both
    took one function name, one GEMM stored the other's way, past its output, and the process hung or crashed."""
    b = GraphBuilder("two_stores")
    g = b.build(_conv_relu(b, "c1", b.input("x", (1, 48, 7, 7)), 36),
                _conv_relu(b, "c3", b.input("z", (1, 8, 16, 16)), 36))
    comp = plan_model(g)
    options = CodegenOptions(vector_isa="avx2", windows_pack_min_channels=1)
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=options).kernels for n in k.notes]
    assert sum("output bias and Relu applied and stored by the micro-kernel" in n for n in notes) == 2
    feeds = reference.random_inputs(g, 0)
    want = reference.run(g, feeds)

    def check() -> None:
        got = build(comp.plan.graph, comp.plan, options=options, cache_dir=cache_dir, threads=1).run(feeds)
        assert_close(got, want)
    _in_child(check)


def _in_child(check, timeout: float = 120.0) -> None:
    """Run ``check`` in a forked child (a fault, or a hang past ``timeout`` seconds, fails the test, not pytest)."""
    pid = os.fork()
    if pid == 0:
        signal.alarm(int(timeout))
        try:
            check()
            os._exit(0)
        except BaseException:
            os._exit(1)
    deadline = time.monotonic() + timeout + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child did not finish")
    assert os.waitstatus_to_exitcode(done[1]) == 0, "the check failed or faulted in the child"


def test_scalar_accumulators_of_a_packed_a_read_no_row_pointer(tmp_path):
    """The Cortex-M7's body (``scalar_accumulators``, plain C) over a packed A is called with ``ar`` = 0 (``gemm``'s
    call for a packed panel): compiled without optimisation, so that a read of ``ar`` is not deleted as dead, it
    reads none (in a forked child: such a read faults) and matches NumPy; the window access reads its rows there."""
    texts = [microkernel(4, 4, a, "packed", "none", 0, True)[1] for a in ("packed", "koff")]
    lib = _compile(tmp_path, texts[0].replace("static void", "void"), ["-O0"], "scalars")
    fn = microkernel(4, 4, "packed", "packed", "none", 0, True)[0]

    def check() -> None:
        A = rng.standard_normal((4, 9)).astype(np.float32)
        B = rng.standard_normal((9, 4)).astype(np.float32)
        packed, C = np.ascontiguousarray(A.T), np.zeros((4, 4), np.float32)
        fp = ctypes.POINTER(ctypes.c_float)
        f = getattr(lib, fn)
        f.restype = None
        f(ctypes.c_long(9), packed.ctypes.data_as(fp), None, None, B.ctypes.data_as(fp), ctypes.c_long(4),
          C.ctypes.data_as(fp), ctypes.c_long(4), ctypes.c_int(0))
        np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
    _in_child(check, 30)
    assert "ar[0]" not in texts[0] and "ar[0]" in texts[1]
