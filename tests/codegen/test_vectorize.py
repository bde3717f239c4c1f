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
    # By default the micro-kernel is AVX2/FMA intrinsics, behind the compiler's target macros.
    auto = generate(g, plan).source
    assert "#if defined(__AVX2__) && defined(__FMA__)" in auto and "_mm256_fmadd_ps" in auto
