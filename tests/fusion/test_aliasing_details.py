"""Concat aliasing and views (``rules.aliasing``) case by case, each expectation worked out by hand from the
module's docstring (which Concat inputs may be written in place and why not, when a Concat is elided, which
single ops are views). Found by mutation testing (tests/MUTATION.md)."""
from __future__ import annotations

import numpy as np

from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.rules.aliasing import aliasable_inputs, concat_input_refusal, contiguous_slices, is_view, mark_views
from fusion_cases import plan_of, randn


def _reason(r):
    return None if r is None else (r.kind.value, r.reason)


def test_contiguous_slices_need_unit_extents_before_the_axis():
    assert contiguous_slices((1, 4, 2, 2), 1) and contiguous_slices((1, 1, 3, 2), 2)
    assert contiguous_slices((5, 4), 0)
    assert not contiguous_slices((2, 4, 2, 2), 1) and not contiguous_slices((1, 4, 2, 2), 2)


def _concat_graph(axis: int = 1, twice: bool = False, as_output: bool = False):
    """x (1, 2, 3, 3) -> c1 (Conv), r (Relu); Concat(c1, r, x, w) on ``axis``; w a constant."""
    b = GraphBuilder("cat")
    x = b.input("x", (1, 2, 3, 3))
    c1 = b.op("Conv", x, b.const("wc", randn((2, 2, 1, 1))), name="c1")
    r = b.op("Relu", x, name="r")
    w = b.const("w", randn((1, 2, 3, 3), 1))
    ins = [c1, r, c1, x, w] if twice else [c1, r, x, w]
    cat = b.op("Concat", *ins, axis=axis, name="cat")
    outs = [b.op("Neg", cat, name="out")] + ([c1] if as_output else [])
    return b.build(*outs)


def test_each_refusal_of_a_concat_input():
    g = _concat_graph()
    cat = g.node("cat")
    c1, r, x, w = cat.inputs
    assert concat_input_refusal(g, cat, c1, set()) is None
    assert concat_input_refusal(g, cat, r, set()) is None
    assert _reason(concat_input_refusal(g, cat, x, set())) == ("condition", "'x' is a graph input or constant")
    assert _reason(concat_input_refusal(g, cat, w, set())) == ("condition", "'w' is a graph input or constant")
    assert _reason(concat_input_refusal(g, cat, c1, {id(c1)})) == \
        ("condition", "'c1' is already aliased into another Concat")
    assert concat_input_refusal(g, cat, r, {id(c1)}) is None
    assert [v.name for v in aliasable_inputs(g, cat)] == ["c1", "r"]
    g = _concat_graph(as_output=True)
    cat = g.node("cat")
    assert _reason(concat_input_refusal(g, cat, cat.inputs[0], set())) == ("condition", "'c1' is a graph output")
    assert [v.name for v in aliasable_inputs(g, cat)] == ["r"]
    g = _concat_graph(twice=True)
    cat = g.node("cat")
    assert _reason(concat_input_refusal(g, cat, cat.inputs[0], set())) == \
        ("condition", "'c1' appears twice in the Concat")
    assert [v.name for v in aliasable_inputs(g, cat)] == ["r"]


def test_slices_along_a_later_axis_are_not_contiguous():
    g = _concat_graph(axis=2)
    cat = g.node("cat")
    assert _reason(concat_input_refusal(g, cat, cat.inputs[0], set())) == \
        ("condition", "slices along axis 2 of (1, 2, 12, 3) are not contiguous")
    # judged before anything else about the input
    assert _reason(concat_input_refusal(g, cat, cat.inputs[2], set())) == \
        ("condition", "slices along axis 2 of (1, 2, 12, 3) are not contiguous")
    assert aliasable_inputs(g, cat) == []
    g = _concat_graph(axis=-3)   # the channel axis, counted from the end
    cat = g.node("cat")
    assert [v.name for v in aliasable_inputs(g, cat)] == ["c1", "r"]


def test_the_rule_aliases_what_it_may_and_elides_a_concat_only_when_every_input_is_aliased():
    plan, dec = plan_of(_concat_graph(), disabled=frozenset({"injective", "elementwise_chain", "epilogue"}))
    grp = next(g for g in plan.groups if g.op_types == ["Concat"])
    assert grp.kind == "concat" and grp.attrs["alias_inputs"] == ["c1", "r"] and "zero_copy" not in grp.attrs
    got = [(d.verdict, d.nodes, d.reason) for d in dec if d.rule == "concat_alias"]
    assert ("fused", ("cat", "c1", "r"), "2 of 4 inputs written in place") in got
    assert ("refused", ("cat", "x"), "'x' is a graph input or constant") in got
    assert ("refused", ("cat", "w"), "'w' is a graph input or constant") in got
    # every input a computed value: the Concat is elided
    b = GraphBuilder("whole")
    x = b.input("x", (1, 2, 3, 3))
    cat = b.op("Concat", b.op("Relu", x, name="r1"), b.op("Exp", x, name="r2"), axis=1, name="cat")
    plan, dec = plan_of(b.build(b.op("Neg", cat, name="out")),
                        disabled=frozenset({"injective", "elementwise_chain", "epilogue"}))
    grp = next(g for g in plan.groups if g.op_types == ["Concat"])
    assert grp.attrs["zero_copy"] == "concat" and grp.attrs["alias_inputs"] == ["r1", "r2"]
    assert ("fused", ("cat", "r1", "r2"), "2 of 2 inputs written in place; Concat elided") in \
        [(d.verdict, d.nodes, d.reason) for d in dec if d.rule == "concat_alias"]


def _view_graph():
    b = GraphBuilder("views")
    x = b.input("x", (1, 6, 2))
    y = b.input("y", (2, 6))
    r = b.op("Relu", x, name="r")
    outs = [b.op("Reshape", r, b.const("s", np.array([1, 12])), name="reshape"),
            b.op("Flatten", r, axis=1, name="flatten"),
            b.op("Identity", r, name="identity"),
            b.op("Unsqueeze", r, axes=[0], name="unsqueeze"),
            b.op("Transpose", r, perm=[0, 2, 1], name="transpose"),
            b.op("Identity", b.const("k", randn((2, 2))), name="of_const")]
    s0, s1 = b.op("Split", r, split=[2, 4], axis=1, num_outputs=2, name="split")
    t0, t1 = b.op("Split", y, split=[3, 3], axis=1, num_outputs=2, name="split_rows")
    u0, u1 = b.op("Split", y, split=[1, 1], axis=0, num_outputs=2, name="split_batch")
    squeezed = b.op("Squeeze", r, axes=[0], name="squeeze")
    g = b.build(*[b.op("Neg", v) for v in outs + [s0, s1, t0, t1, u0, u1]], squeezed)
    return g


def test_which_single_ops_are_views():
    g = _view_graph()
    view = {n.name: is_view(g, n) for n in g.nodes}
    assert view["reshape"] and view["flatten"] and view["identity"] and view["unsqueeze"]
    assert not view["transpose"]          # moves elements
    assert not view["of_const"]           # a constant's bytes are in the weight blob
    assert not view["squeeze"]            # its output is a graph output
    assert view["split"]                  # (1, 6, 2) split along axis 1: each part contiguous
    assert not view["split_rows"]         # (2, 6) along axis 1: rows interleave
    assert view["split_batch"]            # along axis 0
    assert not view["r"]


def test_mark_views_skips_outputs_aliased_values_groups_of_several_ops_and_zero_copy_groups():
    g = _view_graph()
    node = g.node
    groups = [FusionGroup("r", [node("r"), node("identity")], "elementwise", node("r")),
              FusionGroup("flatten", [node("flatten")], "single", node("flatten"), {"zero_copy": "concat"})]
    groups += [FusionGroup(n.name, [n], "single", n) for n in g.nodes if n.name not in ("r", "identity", "flatten")]
    groups.append(FusionGroup("cat", [], "concat", None, {"alias_inputs": [node("unsqueeze").outputs[0].name]}))
    plan = FusionPlan(g, groups)
    mark_views(plan)
    z = {grp.name: grp.attrs.get("zero_copy") for grp in plan.groups}
    assert z["reshape"] == "view" and z["split"] == "view" and z["split_batch"] == "view"
    assert z["r"] is None                 # two ops
    assert z["flatten"] == "concat"       # already zero-copy: kept
    assert z["unsqueeze"] is None         # its output is aliased into a Concat
    assert z["squeeze"] is None and z["transpose"] is None and z["split_rows"] is None


def test_the_concat_group_records_its_rule_and_a_value_is_aliased_into_one_concat_only():
    b = GraphBuilder("two_cats")
    x = b.input("x", (1, 2, 3, 3))
    r1, r2 = b.op("Relu", x, name="r1"), b.op("Exp", x, name="r2")
    c1 = b.op("Concat", r1, r2, axis=1, name="cat1")
    c2 = b.op("Concat", r2, b.op("Neg", x, name="r3"), axis=1, name="cat2")
    plan, dec = plan_of(b.build(b.op("Abs", c1, name="o1"), b.op("Sigmoid", c2, name="o2")),
                        disabled=frozenset({"injective", "elementwise_chain", "epilogue", "horizontal"}))
    cat1 = next(g for g in plan.groups if g.name == "cat1")
    cat2 = next(g for g in plan.groups if g.name == "cat2")
    assert (cat1.attrs["rule"], cat1.attrs["alias_inputs"], cat1.attrs["zero_copy"]) == \
        ("concat_alias", ["r1", "r2"], "concat")
    assert (cat2.attrs["rule"], cat2.attrs["alias_inputs"]) == ("concat_alias", ["r3"]) and \
        "zero_copy" not in cat2.attrs
    assert ("refused", ("cat2", "r2"), "'r2' is already aliased into another Concat") in \
        [(d.verdict, d.nodes, d.reason) for d in dec if d.rule == "concat_alias"]


def test_a_concat_with_nothing_to_alias_does_not_stop_the_next():
    b = GraphBuilder("first_none")
    x, y = b.input("x", (1, 2, 3, 3)), b.input("y", (1, 2, 3, 3))
    c1 = b.op("Concat", x, y, axis=1, name="cat1")
    c2 = b.op("Concat", b.op("Relu", x, name="r1"), b.op("Exp", y, name="r2"), axis=1, name="cat2")
    plan, dec = plan_of(b.build(b.op("Abs", c1, name="o1"), b.op("Sigmoid", c2, name="o2")),
                        disabled=frozenset({"injective", "elementwise_chain", "epilogue", "horizontal"}))
    assert next(g for g in plan.groups if g.name == "cat2").attrs["zero_copy"] == "concat"
    assert "alias_inputs" not in next(g for g in plan.groups if g.name == "cat1").attrs


def test_a_concat_already_in_a_larger_group_is_skipped_and_the_next_is_proposed():
    from types import SimpleNamespace

    from opfuse.rules.aliasing import RULE, propose_aliasing
    from opfuse.rules.kernel_shape import GroupShape
    from opfuse.rules.partition import Partition
    b = GraphBuilder("grouped")
    x = b.input("x", (1, 2, 3, 3))
    r1, r2 = b.op("Relu", x, name="r1"), b.op("Exp", x, name="r2")
    c1 = b.op("Concat", r1, r2, axis=1, name="cat1")
    c2 = b.op("Concat", b.op("Neg", x, name="r3"), b.op("Abs", x, name="r4"), axis=1, name="cat2")
    g = b.build(c1, c2)
    node = g.node
    groups = [([node("r2"), node("cat1")], GroupShape("injective", None), {})]
    groups += [([n], GroupShape("single", n), {}) for n in g.nodes if n.name not in ("r2", "cat1")]
    grouping = SimpleNamespace(p=Partition(g, groups), facts={})
    matches = [SimpleNamespace(nodes=[node("cat1")]), SimpleNamespace(nodes=[node("cat2")])]
    sites = list(propose_aliasing(grouping, matches))
    assert [(s.names, s.detail) for s in sites] == [(["cat2", "r3", "r4"], "2 of 2 inputs written in place; "
                                                                            "Concat elided")]
    assert grouping.facts == {RULE: set()}


def test_a_constant_node_is_no_view():
    b = GraphBuilder("const_node")
    x = b.input("x", (2, 2))
    k = b.op("Constant", value=randn((2, 2)), name="k")
    g = b.build(b.op("Add", x, k, name="add"))
    assert not is_view(g, g.node("k"))
    plan, _ = plan_of(g, disabled=frozenset({"elementwise_chain", "injective", "epilogue"}))
    assert all("zero_copy" not in grp.attrs for grp in plan.groups)


def _split_cat_graph(order=("a", "b", "m"), split_axis: int = 1, x_out: bool = False):
    """c (Conv, 1x4x3x3) -> Split(a, b) on ``split_axis``; m = Neg(b); Concat of ``order`` on axis 1."""
    b = GraphBuilder("split_cat")
    x = b.input("x", (1, 2, 3, 3))
    c = b.op("Conv", x, b.const("wc", randn((4, 2, 1, 1))), name="c")
    sizes = [2, 2] if split_axis == 1 else [1, 2]
    parts = b.op("Split", c, split=sizes, axis=split_axis, num_outputs=2, name="split")
    vals = {"a": parts[0], "b": parts[1], "m": b.op("Neg", parts[1], name="m")}
    cat = b.op("Concat", *[vals[k] for k in order], axis=split_axis, name="cat")
    return b.build(b.op("Relu", cat, name="out"), *([c] if x_out else []))


def test_a_split_moves_nothing_when_its_input_can_sit_in_the_concat():
    from opfuse.rules.aliasing import split_through_refusal
    g = _split_cat_graph()
    split, cat = g.node("split"), g.node("cat")
    assert split_through_refusal(g, split, cat, {"split_out0", "split_out1", "m"}) is None
    assert _reason(split_through_refusal(g, split, cat, {"split_out0", "m"})) == \
        ("condition", "not every output of Split 'split' is written in place into Concat 'cat'")
    assert _reason(split_through_refusal(g, split, cat, {"split_out0", "split_out1"}, {"c"})) == \
        ("condition", "'c' is already placed in another Concat")
    for order in (("b", "a", "m"), ("a", "m", "b")):
        g = _split_cat_graph(order)
        assert _reason(split_through_refusal(g, g.node("split"), g.node("cat"), {"split_out0", "split_out1", "m"})) == \
            ("condition", "the outputs of Split 'split' are not one run of consecutive inputs of Concat 'cat' "
                          "in order")
    g = _split_cat_graph(x_out=True)
    assert _reason(split_through_refusal(g, g.node("split"), g.node("cat"), {"split_out0", "split_out1"})) == \
        ("condition", "'c' is a graph output")
    g = _split_cat_graph(split_axis=2)  # (1, 4, 3, 3) along axis 2: the parts interleave
    assert _reason(split_through_refusal(g, g.node("split"), g.node("cat"), {"split_out0", "split_out1"})) == \
        ("condition", "Split 'split' is not a view of its input")


def _split_decisions(decisions):
    return [(d.verdict, d.nodes, d.kind, d.reason) for d in decisions if d.rule == "split_through_concat"]


def test_the_plan_marks_a_split_through_its_concat_and_refuses_it_otherwise():
    plan, decisions = plan_of(_split_cat_graph(), disabled=frozenset({"injective", "elementwise_chain", "epilogue"}))
    z = {g.name: (g.attrs.get("zero_copy"), g.attrs.get("through_concat")) for g in plan.groups}
    assert z["split"] == ("view", "cat") and z["cat"] == ("concat", None)
    assert _split_decisions(decisions) == [
        ("fused", ("split", "cat"), "", "'c' placed in the output of Concat 'cat'; the Split moves nothing")]
    # the Split's outputs in another order: the Concat still takes them in place, the Split copies
    plan, decisions = plan_of(_split_cat_graph(("b", "a", "m")), disabled=frozenset({"injective", "elementwise_chain",
                                                                                    "epilogue"}))
    z = {g.name: (g.attrs.get("zero_copy"), g.attrs.get("through_concat")) for g in plan.groups}
    assert z["split"] == (None, None) and z["cat"] == ("concat", None)
    assert _split_decisions(decisions) == [
        ("refused", ("split", "cat"), "condition", "the outputs of Split 'split' are not one run of consecutive "
                                                   "inputs of Concat 'cat' in order")]
