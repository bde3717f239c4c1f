"""``rules/rewrite.py``'s one-escaping-output requirement: a match whose intermediate is also a graph output has two
escaping outputs, and a replacement by one op is declined naming both (mutation testing, tests/MUTATION.md)."""
import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.patterns import Op
from opfuse.rules import apply_rules
from opfuse.rules.rule import Replacement, Rule


def _relu_neg():
    b = GraphBuilder("g")
    x = b.input("x", (2, 3))
    r = b.op("Relu", x, name="relu")
    return b, x, r, b.op("Neg", r, name="neg")


def _rule(replaces=None):
    return Rule("relu_neg", Op("Relu").named("relu").keep() >> Op("Neg").named("neg"),
                action=lambda m: Replacement("Abs", [m["relu"].input(0)], replaces=replaces))


def test_a_match_with_two_escaping_outputs_is_declined_naming_both():
    b, x, r, n = _relu_neg()
    g = b.build(n, r)
    out = apply_rules(g, [_rule()])
    assert [n.op_type for n in g.nodes] == ["Relu", "Neg"]
    assert [(d.verdict, d.reason) for d in out.decisions] == [
        ("refused", f"a rewrite replaces exactly one escaping output; the match has '{r.name}', '{n.name}'")]


def test_one_escaping_output_is_replaced_in_place():
    b, x, r, n = _relu_neg()
    g = b.build(n)
    out = apply_rules(g, [_rule()])
    assert [n.op_type for n in g.nodes] == ["Abs"] and [d.verdict for d in out.decisions] == ["rewritten"]
    assert g.outputs[0].name == n.name
    feed = np.array([[-1.0, 2.0, -3.0], [0.5, -0.5, 4.0]], np.float32)
    from opfuse.runtime.reference import run
    np.testing.assert_array_equal(run(g, {"x": feed})[n.name], np.abs(feed))


def test_a_replacement_for_a_value_that_does_not_escape_is_declined():
    """``replaces`` names the Relu's output, read only inside the match: not the match's one escaping output."""
    b, x, r, n = _relu_neg()
    g = b.build(n)
    out = apply_rules(g, [_rule(replaces=r)])
    assert [n.op_type for n in g.nodes] == ["Relu", "Neg"]
    assert [(d.verdict, d.reason) for d in out.decisions] == [
        ("refused", f"a rewrite replaces exactly one escaping output; the match has '{n.name}'")]


def test_the_new_op_is_named_apart_from_the_nodes_not_the_values():
    """The replacement's name (``<root>_<op>``: "neg_abs") is free among the values but taken by a node (whose
    value is "other"): the new op takes the next free node name."""
    b, x, r, n = _relu_neg()
    g = b.build(n)
    taken = g.add_node("Sigmoid", [x], name="neg_abs", output_names=["other"])
    taken.outputs[0].type = x.type
    g.outputs.append(taken.outputs[0])
    apply_rules(g, [_rule()])
    assert sorted((n.op_type, n.name) for n in g.nodes) == [("Abs", "neg_abs_1"), ("Sigmoid", "neg_abs")]
    g.verify()
