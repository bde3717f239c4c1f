"""The pattern algebra: construction, printing, compilation into templates, and malformed patterns."""
from __future__ import annotations

import pytest

from opfuse.errors import OpfuseError
from opfuse.ops.registry import Category
from opfuse.patterns import (Alt, Const, Op, OpPattern, PatternError, Repeat, Seq, Var, compile_pattern,
                             has_attr, many, par)
from opfuse.patterns.template import VMacro, VOp


def test_bare_op_alternation_merges_into_one_vertex():
    p = Op("Add") | Op("Mul") | Op(tag="activation")
    assert isinstance(p, OpPattern)
    assert repr(p) == "Add|Mul|tag=activation"
    cp = compile_pattern(p >> Op("Relu"))
    assert len(cp.templates) == 1


def test_compound_alternation_expands_to_templates():
    p = (Op("Relu") >> Op("Add")) | (Op("Exp") >> Op("Mul"))
    assert isinstance(p, Alt)
    assert len(compile_pattern(p).templates) == 2


def test_optional_and_repetition_variants():
    # (Div|Mul)? gives the template with and without the op
    p = Op("MatMul") >> Op("Div", "Mul").opt() >> Op("Softmax")
    assert sorted(len(t.ops) for t in compile_pipeline_ops(p)) == [2, 3]
    # plus(): one concrete copy, and one concrete copy after a chain macro
    cp = compile_pattern(Op("Relu").plus())
    kinds = sorted(tuple(type(v).__name__ for v in t.vertices) for t in cp.templates)
    assert kinds == [("VOp",), ("VOp", "VMacro")]
    # a fixed count is unrolled, nothing to choose
    assert len(compile_pattern(Op("Relu").repeat(3, 3)).templates) == 1


def compile_pipeline_ops(p):
    return compile_pattern(p).templates


def test_many_keeps_one_concrete_copy_and_a_fan():
    cp = compile_pattern(many(Op("Conv")) >> Op("Concat"))
    fans = [v for t in cp.templates for v in t.vertices if isinstance(v, VMacro)]
    assert [f.kind for f in fans] == ["fan"]
    assert fans[0].after is not None  # symmetry breaking: copies after the concrete one


def test_call_syntax_binds_slots_and_at_sets_entry_slot():
    x = Var("x")
    p = Op("Div")(x, Const(2.0))
    t = compile_pattern(p).templates[0]
    div = [v for v in t.vertices if isinstance(v, VOp)][0]
    assert sorted(e.slot for e in div.ins) == [0, 1]
    q = Op("Relu") >> Op("Sub").at(1)
    sub = [v for v in compile_pattern(q).templates[0].vertices if isinstance(v, VOp)][1]
    assert [e.slot for e in sub.ins] == [1]


def test_repr_reads_like_the_seed():
    p = Op("Conv").named("conv") >> Op("BatchNormalization") >> Op(tag="activation").opt()
    assert repr(p) == "((Conv:conv >> BatchNormalization) >> (tag=activation)?)"
    assert repr(Op(category=Category.ELEMWISE).where(has_attr(alpha=0.5))) == \
        "category=ELEMWISE.where(has_attr(alpha=0.5))"
    assert repr(many(Op("Conv"))) == "many(Conv, 1, None)"


def test_where_applies_to_every_alternative():
    p = (Op("Add") | Op("Mul")).where(has_attr(foo=1))
    assert all(a.constraints for a in p.alternatives)


@pytest.mark.parametrize("build, message", [
    (lambda: Op("Relu") >> Var(), "cannot flow into a variable"),
    (lambda: Op("Relu").repeat(3, 2), "bad repetition bounds"),
    (lambda: many(Op("Conv"), 0), r"many\(\) needs"),
    (lambda: par(Op("Relu")), "at least two branches"),
    (lambda: Var().plus(), "cannot repeat"),
    (lambda: Op("Add")(Op("Relu").plus()), "one op or variable"),
])
def test_malformed_patterns_raise_on_construction(build, message):
    with pytest.raises(PatternError, match=message):
        build()


@pytest.mark.parametrize("build, message", [
    (lambda: par(Op("Relu"), Op("Exp")), "not connected"),
    (lambda: ((Op("Relu") >> Op("Add")) | Op("Exp")).plus(), "alternation of compound patterns inside"),
    (lambda: Op("Relu").plus().plus(), "nested repetition"),
    (lambda: many(Op("Conv")), "not connected"),  # copies side by side with nothing joining them
    (lambda: (Op("Relu").named("a") >> Op("Exp").named("a")), "used twice"),
    (lambda: many(Op("Conv")) >> Op("Relu").plus(), "cannot feed another repetition"),
])
def test_malformed_patterns_raise_on_compile(build, message):
    with pytest.raises(PatternError, match=message):
        compile_pattern(build())


def test_pattern_error_is_a_user_facing_error():
    assert issubclass(PatternError, OpfuseError)


def test_sequence_and_par_structure():
    x = Var("x")
    p = x >> par(Op("MatMul"), Op("MatMul"))
    t = compile_pattern(p).templates[0]
    assert len(t.edges) == 2 and all(e.src.pat is x for e in t.edges)
    assert len(t.order_pairs) == 1  # identical branches are ordered by position
    assert isinstance(Op("A") >> Op("B"), Seq) and isinstance(Op("A").plus(), Repeat)
