"""Kernels with the same code share one C function (``ProgramBuilder._register``): layers of one shape and
epilogue are compiled once, each still one call in ``opfuse_run`` with its own tensors and weights."""
from __future__ import annotations

import re

import numpy as np

from cg_support import assert_close, epilogue_plan, run_both
from opfuse.codegen.options import CORTEX_M7
from opfuse.codegen.program import generate
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(11)


def W(b, *shape):
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) * 0.3).astype(np.float32))


def _stack(shift_a: float = 0.5, shift_b: float = 0.5):
    """Four Conv groups over 8 x 10 x 10: two 3x3 + Relu (one shape, other weights), a 1x1 + Relu, and two
    3x3 + Add(scalar) + Relu whose scalars are ``shift_a`` and ``shift_b``."""
    b = GraphBuilder("shared")
    y = b.input("x", (1, 8, 10, 10))
    for i in range(2):
        y = b.op("Relu", b.op("Conv", y, W(b, 8, 8, 3, 3), W(b, 8), pads=[1, 1, 1, 1], name=f"c{i}"), name=f"r{i}")
    y = b.op("Relu", b.op("Conv", y, W(b, 8, 8, 1, 1), W(b, 8), name="pw"), name="rpw")
    for i, shift in enumerate((shift_a, shift_b)):
        c = b.op("Conv", y, W(b, 8, 8, 3, 3), W(b, 8), pads=[1, 1, 1, 1], name=f"s{i}")
        y = b.op("Relu", b.op("Add", c, b.const(f"shift{i}", np.float32(shift)), name=f"a{i}"), name=f"sr{i}")
    return b.build(y)


def _functions(program) -> list[str | None]:
    return [k.function for k in program.kernels]


def test_layers_of_one_shape_share_a_function_and_compute_their_own_outputs(cache_dir):
    g = _stack()
    plan = epilogue_plan(g)
    got, want, model = run_both(g, plan, cache_dir)
    assert_close(got, want)
    p = model.program
    f = _functions(p)
    assert len(f) == 5 and p.num_functions == 5
    assert f[0] == f[1] and f[3] == f[4]  # c0, c1 and s0, s1: the same code
    assert len({f[0], f[2], f[3]}) == 3 and p.c_functions == 3
    assert model.report["functions"] == 5 and model.report["c_functions"] == 3
    src = p.source
    for name in {f[0], f[3]}:
        assert len(re.findall(rf"^OPFUSE_KERNEL static void {name}\(", src, re.M)) == 1
        assert len(re.findall(rf"^  {name}\(", src, re.M)) == 2  # two calls in opfuse_run
    # The second group of each pair keeps its comment, which names the function that runs it.
    assert src.count(f" * runs as {f[0]}: the same code */") == 1
    assert src.count(f" * runs as {f[3]}: the same code */") == 1


def test_a_different_constant_is_a_different_function(cache_dir):
    """The scalar added after s0 and s1 is in the code: 0.5 and 0.25 give two functions, each with its own."""
    g = _stack(0.5, 0.25)
    got, want, model = run_both(g, epilogue_plan(g), cache_dir)
    assert_close(got, want)
    f = _functions(model.program)
    assert f[0] == f[1] and f[3] != f[4] and model.program.c_functions == 4


def test_other_shapes_are_other_functions():
    b = GraphBuilder("shapes")
    x = b.input("x", (1, 8, 10, 10))
    y1 = b.op("Relu", b.op("Conv", x, W(b, 8, 8, 3, 3), W(b, 8), pads=[1, 1, 1, 1], name="c0"), name="r0")
    y2 = b.op("Relu", b.op("Conv", x, W(b, 8, 8, 3, 3), W(b, 8), name="c1"), name="r1")  # no padding: 8 x 8 out
    y3 = b.op("Relu", b.op("Conv", x, W(b, 4, 8, 3, 3), W(b, 4), pads=[1, 1, 1, 1], name="c2"), name="r2")
    g = b.build(y1, y2, y3)
    p = generate(g, epilogue_plan(g))
    assert p.num_functions == 3 and p.c_functions == 3


def test_sharing_is_deterministic_and_applies_to_the_mcu_platform():
    g = _stack()
    plan = epilogue_plan(g)
    assert generate(g, plan).source == generate(g, plan).source
    p = generate(g, plan, options=CORTEX_M7)
    f = _functions(p)
    assert f[0] == f[1] and f[3] == f[4] and p.c_functions == 3
    calls = re.findall(rf"^  {f[0]}\(([^;]*)\);", p.source, re.M)
    assert len(calls) == 2 and calls[0] != calls[1]  # each call passes its own tensors and weights
