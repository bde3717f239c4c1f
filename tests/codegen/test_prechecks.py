"""Run-time checks hoisted before a fused kernel's loops (``codegen/prechecks.py``, issue 13).

The reference checks a whole operand (every divisor, every exponent), also where a fused
consumer (a Slice) reads only part of the result; these cases reach the pre-check paths no
other test did: a constant operand known bad at build time, a pre-check after one of a
constant operand, and two pre-checked nodes of one kernel with different messages. The
expected values and messages are worked out by hand in each test.
"""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import InputError
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

I64 = np.int64


def _one_group(g, kind):
    return FusionPlan(g, [FusionGroup("all", list(g.nodes), kind)])


def _slice02(b, v):
    """v[0:2] on axis 0."""
    return b.op("Slice", v, b.const("st", np.array([0], I64)), b.const("en", np.array([2], I64)),
                b.const("ax", np.array([0], I64)), name="s")


@pytest.mark.parametrize("folded", [False, True])
def test_constant_zero_divisor_outside_the_slice_faults(folded, cache_dir):
    """a / [1, 1, 1, 0], then [0:2]: the zero divisor is a constant (known bad when the C code is
    written) in an element the fused loop never computes; the reference rejects it anyway. Folded:
    the divisor is Neg([-1, -1, -1, 0]), a node of the group folded at build time (not a group input)."""
    b = GraphBuilder("cdiv0")
    a = b.input("a", (4,), I64)
    d = b.op("Neg", b.const("k", np.array([-1, -1, -1, 0], I64)), name="neg") if folded else \
        b.const("k", np.array([1, 1, 1, 0], I64))
    q = b.op("Div", a, d, name="the_div")
    g = b.build(_slice02(b, q))
    feeds = {"a": np.array([5, -6, 7, 8], I64)}
    message = "node 'the_div' (Div): integer division by zero"
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        reference.run(g, feeds)
    for plan in (None, _one_group(g, "injective")):
        model = build(g, plan, cache_dir=cache_dir)
        with pytest.raises(InputError) as got:
            model.run(feeds)
        assert message in str(got.value)


def test_pre_check_after_a_constant_operand_still_runs(cache_dir):
    """q = a / [2, 3, 4, 5] (constant divisor, checked at build time), p = q ** e, then [0:2].
    a = [8, 9, 8, 3] gives q = [4, 3, 2, 0]; with e[3] = -1 the element 0 ** -1 lies outside the
    slice: the Pow after the Div must still be checked whole."""
    b = GraphBuilder("divpow")
    a = b.input("a", (4,), I64)
    e = b.input("e", (4,), I64)
    q = b.op("Div", a, b.const("k", np.array([2, 3, 4, 5], I64)), name="the_div")
    p = b.op("Pow", q, e, name="the_pow")
    g = b.build(_slice02(b, p))
    model = build(g, _one_group(g, "injective"), cache_dir=cache_dir)
    a_v = np.array([8, 9, 8, 3], I64)
    with pytest.raises(InputError) as got:
        model.run({"a": a_v, "e": np.array([1, 2, 1, -1], I64)})
    assert "node 'the_pow' (Pow): integer 0 to a negative power" in str(got.value)
    out = model.run({"a": a_v, "e": np.array([1, 2, 1, 1], I64)})
    np.testing.assert_array_equal(out[g.outputs[0].name], np.array([4, 9], I64))  # 4 ** 1, 3 ** 2


def _div_and_pow(k=None):
    """out = a / d + c ** e in one elementwise kernel; ``d`` is the constant ``k`` if given."""
    b = GraphBuilder("divandpow")
    a = b.input("a", (4,), I64)
    d = b.const("k", np.array(k, I64)) if k is not None else b.input("d", (4,), I64)
    q = b.op("Div", a, d, name="the_div")
    p = b.op("Pow", b.input("c", (4,), I64), b.input("e", (4,), I64), name="the_pow")
    return b.build(b.op("Add", q, p, name="add"))


DIV_MSG = "node 'the_div' (Div): integer division by zero"
POW_MSG = "node 'the_pow' (Pow): integer 0 to a negative power"


@pytest.mark.parametrize("bad", ["div", "pow"])
def test_two_pre_checks_in_one_kernel_keep_their_own_messages(bad, cache_dir):
    """Both operands sets come from the group's inputs: each node has its own flag and message."""
    g = _div_and_pow()
    model = build(g, _one_group(g, "elementwise"), cache_dir=cache_dir)
    feeds = {"a": np.array([6, 7, 8, 9], I64), "d": np.array([3, -7, 2, 1], I64),
             "c": np.array([2, 0, 1, 3], I64), "e": np.array([3, 1, -1, 0], I64)}
    # 6/3 + 2**3, 7/-7 + 0**1, 8/2 + 1**-1, 9/1 + 3**0 (integer 1 ** -1 is 1)
    np.testing.assert_array_equal(model.run(feeds)["add"], np.array([10, -1, 5, 10], I64))
    if bad == "div":
        feeds["d"] = np.array([3, 0, 2, 1], I64)
    else:
        feeds["c"] = np.array([2, 0, 1, 3], I64)
        feeds["e"] = np.array([3, -2, -1, 0], I64)
    with pytest.raises(InputError) as got:
        model.run(feeds)
    assert (DIV_MSG if bad == "div" else POW_MSG) in str(got.value)
    assert (POW_MSG if bad == "div" else DIV_MSG) not in str(got.value)


def test_a_constant_bad_operand_is_reported_before_a_later_nodes_fault(cache_dir):
    """a / [2, 0, 1, 1] is bad at build time; c ** e is bad at run time too. The reference runs
    the Div first (graph order) and raises its error: so must the kernel."""
    g = _div_and_pow(k=[2, 0, 1, 1])
    feeds = {"a": np.array([6, 7, 8, 9], I64), "c": np.array([0, 1, 1, 1], I64), "e": np.array([-1, 1, 1, 1], I64)}
    with pytest.raises(InputError) as want:
        reference.run(g, feeds)
    assert DIV_MSG in str(want.value)
    model = build(g, _one_group(g, "elementwise"), cache_dir=cache_dir)
    with pytest.raises(InputError) as got:
        model.run(feeds)
    assert DIV_MSG in str(got.value)
