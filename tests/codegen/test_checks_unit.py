"""``codegen.checks`` without a compiler: for each checked op, the C condition of a bad element and the
NumPy test agree with the documented rule on sample values, and the message is the reference's
(mutation testing: tests/MUTATION.md). The C code's behaviour is in test_numerics.py."""
from __future__ import annotations

import re

import numpy as np
import pytest

from opfuse.codegen.checks import check_of
from opfuse.ops import GraphBuilder


def _c_eval(cond: str, **values) -> bool:
    """Evaluate a C condition over integer variables in Python (&&, || and ! only)."""
    expr = cond.replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    return bool(eval(expr, {}, values))  # noqa: S307 - our own generated expression


def _node(op, shapes, dtypes, **attrs):
    b = GraphBuilder("chk")
    ins = [b.input(f"i{k}", s, d) for k, (s, d) in enumerate(zip(shapes, dtypes, strict=True))]
    out = b.op(op, *ins, name="the_node", **attrs)
    g = b.build(out)
    return next(n for n in g.nodes if n.name == "the_node")


SAMPLES = [-2**31, -11, -10, -9, -1, 0, 1, 9, 10, 11, 2**31 - 1]


def test_integer_div_checks_a_zero_divisor_only():
    node = _node("Div", [(3,), (3,)], ["int32", "int32"])
    check = check_of(node)
    assert [v.name for v in check.operands] == ["i1"]
    for d in SAMPLES:
        assert _c_eval(check.cond("d"), d=d) == (d == 0) == check.bad(np.array([d]))
    assert check.bad(np.array([3, 0, 2])) and not check.bad(np.array([3, 1, 2]))
    assert check.message == "node 'the_node' (Div): integer division by zero"


def test_float_div_and_empty_outputs_need_no_check():
    assert check_of(_node("Div", [(3,), (3,)], ["float32", "float32"])) is None
    assert check_of(_node("Div", [(0,), (0,)], ["int32", "int32"])) is None
    assert check_of(_node("Add", [(3,), (3,)], ["int32", "int32"])) is None


def test_integer_pow_checks_zero_to_a_negative_power():
    node = _node("Pow", [(3,), (3,)], ["int64", "int64"])
    check = check_of(node)
    assert [v.name for v in check.operands] == ["i0", "i1"]
    for b in (-2, 0, 3):
        for e in (-2, -1, 0, 1):
            want = b == 0 and e < 0
            assert _c_eval(check.cond("b", "e"), b=b, e=e) == want == check.bad(np.array([b]), np.array([e]))
    assert check.message == "node 'the_node' (Pow): integer 0 to a negative power (a division by zero)"
    assert check_of(_node("Pow", [(3,), (3,)], ["float32", "int64"])) is None
    assert check_of(_node("Pow", [(3,), (3,)], ["int64", "float32"])) is None


@pytest.mark.parametrize("axis, dim", [(None, 10), (0, 10), (1, 4), (-1, 4), (-2, 10)])
def test_gather_checks_indices_against_the_axis_length(axis, dim):
    b = GraphBuilder("gather")
    data = b.input("data", (10, 4))
    idx = b.input("idx", (3,), "int64")
    g = b.build(b.op("Gather", data, idx, name="the_node", **({} if axis is None else {"axis": axis})))
    check = check_of(next(n for n in g.nodes if n.name == "the_node"))
    assert [v.name for v in check.operands] == ["idx"]
    for i in range(-dim - 2, dim + 2):
        want = not -dim <= i < dim
        assert _c_eval(check.cond("i"), i=i) == want == check.bad(np.array([i])), i
    assert check.message == f"node 'the_node' (Gather): indices out of range [{-dim}, {dim - 1}]"
