"""The inline evaluator (``codegen/evaluator.py``): a value used twice in a fused group is computed once per
element (memoised in its C scope), a one-element constant is an exact literal of its own type, and the results
equal the reference's."""
from __future__ import annotations

import re

import numpy as np

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import generate
from opfuse.codegen.options import PORTABLE
from opfuse.ops import GraphBuilder


def _square_of_exp():
    """exp(x) * exp(x) + 0.5 (a float32 scalar) + 2 (an int32 scalar, cast), one elementwise group."""
    b = GraphBuilder("memo")
    x = b.input("x", (3, 37))
    e = b.op("Exp", x, name="exp")
    sq = b.op("Mul", e, e, name="sq")
    half = b.op("Add", sq, b.const("half", np.array(0.5, np.float32)), name="add_half")
    two = b.op("Cast", b.const("two", np.array([2], np.int32)), to=1, name="two_f")
    y = b.op("Add", half, two, name="add_two")
    g = b.build(y)
    return g, group_by_names(g, [("elementwise", ["exp", "sq", "add_half", "two_f", "add_two"])])


def _kernel(src: str) -> str:
    return src[src.index("static void k0_"):src.index("int opfuse_run(")]


def test_a_value_used_twice_is_computed_once_per_element():
    g, plan = _square_of_exp()
    body = _kernel(generate(g, plan, options=PORTABLE).source)
    calls = re.findall(r"const float (t\d+) = opfuse_expf\(", body)
    assert len(calls) == 1, "Exp is used twice by Mul: evaluated once and reused"
    assert f"= {calls[0]} * {calls[0]};" in body


def test_one_element_constants_are_literals_of_their_own_type():
    g, plan = _square_of_exp()
    body = _kernel(generate(g, plan, options=PORTABLE).source)
    assert re.search(r"= t\d+ \+ 0x1p-1f;", body)  # 0.5 as a float literal, not read from the weights
    assert re.search(r"= t\d+ \+ 0x1p\+1f;", body)  # Cast(int32 2) folded: a float literal


def test_memoised_values_give_the_reference_results(cache_dir):
    g, plan = _square_of_exp()
    got, want, model = run_both(g, plan, cache_dir)
    assert_close(got, want)
    assert model.report["kernels"] == 1
