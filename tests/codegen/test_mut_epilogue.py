"""``codegen/epilogue.py``'s ``VectorEpilogue.plan`` refusals where mutation testing (tests/mutation/mutT.md, issue
13) found no test: a conv whose epilogue ends in a Transpose keeps the scalar epilogue loop, with the reason in the
notes (a square plane: no vector form for the Transpose; another shape: the output is not of the anchor's), bitwise the
scalar epilogue's results."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from test_vector_epilogue import GEOMETRIES, _check, _conv, _one_kernel

CASES = {"another-shape": ((1, 16, 23, 41), "an output is not float32 of the anchor's shape"),
         "square": ((1, 16, 24, 24), "op Transpose has no vector form")}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_transposed_epilogue_keeps_the_scalar_loop_with_its_reason(case, cache_dir):
    shape, reason = CASES[case]
    spec = dict(GEOMETRIES["packed_1x1"], x=shape)
    b = GraphBuilder("conv_transposed")
    y = b.op("Relu", _conv(b, b.input("x", shape), spec, np.random.default_rng(3)))
    g = b.build(b.op("Transpose", y, perm=[0, 1, 3, 2]))
    _check(g, _one_kernel(g), cache_dir, {}, vectorised=False, refused=reason)
