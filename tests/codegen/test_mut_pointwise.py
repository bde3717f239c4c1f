"""``codegen/pointwise.py`` where mutation testing (tests/mutation/mutM.md, issue 13) found no test: a Concat computed
inline in a pointwise chain is written as one loop per input along its axis (``concat.concat_split``: no branch
between the inputs, the form gcc 12.2 -O3 turned into masked loads that returned other memory), in the plain C99
build and the vectorised one, against the reference."""
from __future__ import annotations

import re

import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.ops import GraphBuilder


@pytest.mark.parametrize("simd", ["none", "auto"])
def test_an_inline_concat_is_one_loop_per_input(simd, cache_dir):
    b = GraphBuilder("cat")
    x, y = b.input("x", (2, 3, 40)), b.input("y", (2, 5, 40))
    c = b.op("Concat", b.op("Relu", x, name="rx"), y, axis=1, name="concat")
    g = b.build(b.op("Sigmoid", c, name="sig"))
    plan = group_by_names(g, [("pw", ["rx", "concat", "sig"])])
    got, want, m = run_both(g, plan, cache_dir, options=CodegenOptions(simd=simd))
    assert_close(got, want)
    # channels 0-2 from x, then 3-7 from y, each loop reading its own input
    assert re.search(r"for \(long (i\d+) = 0; \1 < 3; \+\+\1\)", m.program.source)
    assert re.search(r"for \(long (i\d+) = 3; \1 < 8; \+\+\1\)", m.program.source)
