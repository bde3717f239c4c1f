"""Every MatMul / Gemm form the GEMM lowering builds a problem for (``codegen/gemm.py``: ``matmul_problem``,
``gemm_problem``, ``emit_naive``), all in one program against the reference executor, every output checked by the
same test: test_ops.py's linalg suite (1-D operands, batches broadcast, a constant B folding A's batch, transposes,
alpha, beta, C) plus a constant A (2-D, batched, broadcast over B's batch, its batch folded into M), a run-time
vector B, a constant A transposed in a Gemm, integer Gemms and batched integer MatMuls in the triple loop. One
compile (mutation testing, tests/MUTATION.md: a mutant that changes one form's C is seen by the test that checks
that form)."""
from __future__ import annotations

import numpy as np

from cg_support import assert_close
from opfuse.runtime import reference
from opfuse.runtime.native import build
from test_ops import linalg_suite


def test_every_matmul_and_gemm_form_in_one_program(cache_dir):
    s = linalg_suite()
    s.case("const_a", "MatMul", s.w(5, 7), s.b.input("rb", (7, 4)))
    s.case("const_a_batched", "MatMul", s.w(3, 5, 7), s.b.input("rb3", (3, 7, 4)))
    s.case("const_a_broadcast", "MatMul", s.w(5, 7), s.b.input("rb2", (2, 7, 3)))
    s.case("const_a_batch_broadcast", "MatMul", s.w(2, 1, 5, 7), s.b.input("rb4", (3, 7, 4)))
    s.case("const_a_batch_folded", "MatMul", s.w(3, 5, 7), s.b.input("rb5", (7, 4)))  # A's batch folded into M
    s.case("runtime_vector_b", "MatMul", s.b.input("ra", (3, 7)), s.b.input("rv", (7,)))
    s.case("gemm_const_a_transA", "Gemm", s.w(6, 5), s.b.input("gb2", (6, 4)), transA=1, alpha=1.5)
    s.case("gemm_no_c", "Gemm", s.b.input("gn", (4, 6)), s.w(6, 3), beta=0.0)
    # the triple loop over a batch: A and B each with their own batch, B's broadcast over A's
    s.case("int32_batched", "MatMul", s.b.input("na", (2, 3, 4), np.int32), s.b.input("nb", (2, 4, 5), np.int32))
    s.case("int64_b_broadcast", "MatMul", s.b.input("la", (3, 2, 4), np.int64), s.b.input("lb", (1, 4, 3), np.int64))
    for dtype, alpha, beta, with_c in ((np.int32, 2.0, 0.5, True), (np.int64, 1.0, 1.0, True),
                                       (np.int32, 3.0, -2.0, True), (np.int32, 0.5, 1.0, True),
                                       (np.int32, 0.5, 1.0, False)):
        name = f"gemm_{np.dtype(dtype).name}_{alpha:g}_{beta:g}_{int(with_c)}".replace("-", "m").replace(".", "p")
        a = s.b.input(f"{name}_a", (5, 7), dtype)
        w = s.b.input(f"{name}_w", (4, 7), dtype)
        c = [s.b.input(f"{name}_c", (1, 4), dtype)] if with_c else []
        s.case(name, "Gemm", a, w, *c, transB=1, alpha=alpha, beta=beta)
    g = s.graph()
    feeds = reference.random_inputs(g, 3)
    model = build(g, None, cache_dir=cache_dir)
    assert_close(model.run(feeds), reference.run(g, feeds))
