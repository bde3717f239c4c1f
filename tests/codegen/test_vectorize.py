"""The loops gcc must vectorise are vectorised (``-fopt-info-vec``)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from opfuse.codegen import CodegenOptions, generate
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime.toolchain import Toolchain, ToolchainError


def _vector_report(source: str, tmp_path) -> str:
    try:
        tc = Toolchain.detect()
    except ToolchainError:
        pytest.skip("no C compiler")
    if "gcc" not in tc.identity.lower() and "cc (" not in tc.identity:
        pytest.skip("vectorisation report needs gcc")
    src = tmp_path / "model.c"
    src.write_text(source)
    proc = subprocess.run([tc.cc, *tc.flags, "-fopt-info-vec-optimized", "-o", str(tmp_path / "m.so"), str(src)],
                          capture_output=True, text=True, check=True)
    return proc.stderr


def _lines_of(source: str, needle: str) -> list[int]:
    return [i + 1 for i, ln in enumerate(source.splitlines()) if needle in ln]


def test_elementwise_chain_and_microkernel_vectorise(tmp_path):
    b = GraphBuilder("vec")
    x = b.input("x", (1, 64, 32, 32))
    y = b.op("Relu", b.op("Mul", b.op("Add", x, b.const("bias", np.ones((64, 1, 1), np.float32))),
                          b.input("s", (1, 64, 32, 32))))
    m = b.op("MatMul", b.input("a", (64, 128)), b.const("w", np.ones((128, 96), np.float32)))
    g = b.build(y, m)
    plan = FusionPlan(g, [FusionGroup("chain", g.nodes[:3], "elementwise"), FusionGroup("mm", [g.nodes[3]], "single")])
    # The plain C99 micro-kernel (what runs where there is no AVX2) must vectorise too.
    src = generate(g, plan, options=CodegenOptions(simd="none")).source
    report = _vector_report(src, tmp_path)
    vectorised = {int(ln.split(":")[1]) for ln in report.splitlines() if "loop vectorized" in ln}
    store_line = _lines_of(src, "] = t")[0]  # the chain's store, inside its innermost loop
    loop_line = max(i for i in _lines_of(src, "for (long") if i < store_line)
    assert loop_line in vectorised
    ukr = _lines_of(src, "acc[0][j] += ai * bk[j]")[0]
    assert ukr in vectorised or any(abs(v - ukr) <= 1 for v in vectorised)
    # By default the micro-kernel is AVX2/FMA intrinsics, behind the compiler's target macros (after
    # an AVX-512F body, behind its own, where the host has AVX-512: ``CodegenOptions.vector_isa``).
    auto = generate(g, plan, options=CodegenOptions(vector_isa="avx2")).source
    assert "#if defined(__AVX2__) && defined(__FMA__)" in auto and "_mm256_fmadd_ps" in auto
    wide = generate(g, plan, options=CodegenOptions(vector_isa="avx512")).source
    assert "#if defined(__AVX512F__)" in wide and "_mm512_fmadd_ps" in wide
    assert "#elif defined(__AVX2__) && defined(__FMA__)" in wide and "_mm256_fmadd_ps" in wide


@pytest.mark.parametrize("anchor", ["conv1x1", "conv3x3", "depthwise", "matmul"])
@pytest.mark.parametrize("act", ["Sigmoid", "Silu", "Gelu", "Softplus", "HardSwish"])
def test_tile_epilogue_with_transcendental_vectorises(tmp_path, anchor, act):
    """The loop a GEMM/conv tile's epilogue runs in (bias, activation, store) is vectorised by gcc,
    with the exp/erf/log-based activations too (their helpers are branch-free, no libm call): the scalar
    epilogue, which x86 builds run with ``vector_epilogue`` off (on, the epilogue is intrinsics where it has a
    vector form: tests/codegen/test_vector_epilogue.py)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("epi")
    if anchor == "matmul":
        y = b.op("MatMul", b.input("x", (64, 96)), b.const("w", rng.standard_normal((96, 80)).astype(np.float32)))
    else:
        k, group, cout = {"conv1x1": (1, 1, 32), "conv3x3": (3, 1, 32), "depthwise": (3, 16, 16)}[anchor]
        w = b.const("w", rng.standard_normal((cout, 16 // group, k, k)).astype(np.float32))
        y = b.op("Conv", b.input("x", (1, 16, 20, 24)), w, b.const("bias", np.ones(cout, np.float32)),
                 pads=[k // 2] * 4, group=group)
    g = b.build(b.op(act, y))
    anchor_node = g.nodes[0]
    kind = "gemm_epilogue" if anchor == "matmul" else "conv_epilogue"
    plan = FusionPlan(g, [FusionGroup("epi", list(g.nodes), kind, anchor_node)])
    # the depthwise AVX-512 body finishes Relu, Clip and HardSwish in registers whatever ``vector_epilogue`` says
    src = generate(g, plan, options=CodegenOptions(vector_epilogue=False, depthwise_avx512=False)).source
    report = _vector_report(src, tmp_path)
    vectorised = {int(ln.split(":")[1]) for ln in report.splitlines() if "loop vectorized" in ln}
    lines = src.splitlines()
    store = next(i + 1 for i, ln in enumerate(lines) if ln.strip().startswith(("p1_", "p2_", "p3_", "p4_"))
                 and "] = t" in ln)
    loop = max(i for i in _lines_of(src, "for (long") if i < store)
    assert any(loop <= v <= store for v in vectorised), f"{anchor} + {act}: epilogue loop (line {loop}) not vectorised"


def test_nan_propagating_max_min_clip_pool_and_reducemax_vectorise(tmp_path):
    """Max, Min, Clip with run-time bounds, MaxPool and ReduceMax keep NaN (``rules.nan_max``) and
    each kernel still has a vectorised loop (ReduceMax's lane loop only since NaN propagates:
    gcc keeps it as a loop, ``lane_reduce(keep_lane_loop=True)``)."""
    b = GraphBuilder("nanvec")
    x = b.input("x", (64, 256))
    y = b.input("y", (64, 256))
    img = b.op("Reshape", x, b.const("s", np.array([1, 64, 16, 16], np.int64)))
    g = b.build(b.op("Max", x, y, name="mx"), b.op("Min", x, y, name="mn"),
                b.op("Clip", x, b.input("lo", ()), b.input("hi", ()), name="clip"),
                b.op("ReduceMax", x, axes=[1], name="rmax"),
                b.op("MaxPool", img, kernel_shape=[2, 2], strides=[2, 2], name="mpool"))
    # The plain C99 path (gcc's vectoriser); by default MaxPool is AVX2 intrinsics (codegen/pool.py).
    src = generate(g, options=CodegenOptions(simd="none")).source
    report = _vector_report(src, tmp_path)
    vectorised = {int(ln.split(":")[1]) for ln in report.splitlines() if "loop vectorized" in ln}
    starts = {name: _lines_of(src, f"[ops_{op}] */")[0]
              for name, op in (("mx", "Max"), ("mn", "Min"), ("clip", "Clip"), ("rmax", "ReduceMax"),
                               ("mpool", "MaxPool"))}
    ends = sorted(starts.values()) + [len(src.splitlines())]
    for name, start in starts.items():
        end = next(e for e in ends if e > start)
        assert any(start < v < end for v in vectorised), f"kernel '{name}' has no vectorised loop"
    assert "!= " in src  # the NaN tests are there
    auto = generate(g).source
    assert "_mm256_max_ps" in auto and "_CMP_UNORD_Q" in auto


def _vector_loop_instructions(so) -> int:
    """Instructions of the shortest backward-jumping loop of ``so`` whose instructions use ymm/zmm
    registers for at least half of them (the main vector loop; the others are scalar or jumps back
    over whole functions)."""
    import re
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True,
                          check=True).stdout
    ins = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in
           (re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", ln) for ln in dump.splitlines()) if m]
    loops = []
    for at, op, arg in ins:
        t = re.match(r"([0-9a-f]+)", arg) if op.startswith("j") else None
        if t and int(t.group(1), 16) < at:
            body = [x for x in ins if int(t.group(1), 16) <= x[0] <= at]
            if 2 * sum("ymm" in x[2] or "zmm" in x[2] for x in body) >= len(body):
                loops.append(len(body))
    return min(loops, default=0)
