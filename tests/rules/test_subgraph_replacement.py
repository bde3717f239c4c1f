"""A rewrite rule's ``Subgraph`` (``rules/rule.py``): several new ops in place of a match (``rules/rewrite.py``,
``apply_subgraph``). The new ops go where the match was, in their order; they keep the names the rule gave them
where the graph without the match leaves them free; stand-ins are bound to the real values; the output takes the
replaced value's name; a replacement of the wrong type or with an unbound stand-in is refused and leaves the
graph as it was."""
import numpy as np

from opfuse.ir.graph import Graph, Node, TensorType, Value
from opfuse.ops.registry import infer_node
from opfuse.patterns import Const, Op, Var
from opfuse.rules import apply_rules
from opfuse.rules.rule import Rule, Subgraph
from rule_helpers import same_outputs

F32 = np.dtype(np.float32)


def times_four(graph_output: bool = False) -> Graph:
    """x -> Mul(x, 4) -> [Relu] -> y."""
    g = Graph("g")
    x = g.add_input("x", (2, 3), F32)
    four = g.add_const("four", np.float32(4))
    m = g.add_node("Mul", [x, four], name="mul", output_names=["m"])
    m.outputs[0].type = TensorType((2, 3), F32)
    if graph_output:
        g.outputs = [m.outputs[0]]
        return g
    r = g.add_node("Relu", [m.outputs[0]], name="relu", output_names=["y"])
    r.outputs[0].type = TensorType((2, 3), F32)
    g.outputs = [r.outputs[0]]
    return g


def _scratch(x: Value, names=("mul", "twice"), out_dtype=F32, bind=True) -> Subgraph:
    """``t = x + x; u = t + t`` (``4x`` exactly) as a scratch graph reading a stand-in of ``x``."""
    s = Graph("scratch")
    stand = s.add_value(Value(x.name, x.type))
    nodes = []
    t = Value("t")
    nodes.append(Node(names[0], "Add", [stand, stand], [t]))
    last = stand if out_dtype == F32 else None
    if out_dtype != F32:
        c = Value("c")
        nodes.append(Node("cast", "Cast", [t], [c], {"to": 11}))  # float64: the wrong type
        last = c
    u = Value("u")
    nodes.append(Node(names[1], "Add", [last if out_dtype != F32 else t, last if out_dtype != F32 else t], [u]))
    for n in nodes:
        for v, ty in zip(n.outputs, infer_node(n), strict=True):
            v.type = ty
        s.insert_node(n)
    return Subgraph(s, {x.name: x} if bind else {}, u, reason="4x as two additions")


def _rule(**kw) -> Rule:
    x = Var("x")
    return Rule("times_four", Op("Mul")(x, Const()).named("mul"), action=lambda m: _scratch(m["x"], **kw))


def test_the_subgraph_replaces_the_match_in_place_with_the_rules_names():
    g = times_four()
    before = g.copy()
    out = apply_rules(g, [_rule()])
    (d,) = out.decisions
    assert (d.rule, d.verdict, d.reason) == ("times_four", "rewritten", "4x as two additions")
    assert [(n.op_type, n.name) for n in g.nodes] == [("Add", "mul"), ("Add", "twice"), ("Relu", "relu")]
    # the match's names are free again: the first new node takes the Mul's own; the output takes its value's
    assert g.nodes[1].outputs[0].name == "m" and g.nodes[0].outputs[0].name == "t"
    assert g.nodes[0].inputs[0] is g.values["x"] and g.nodes[2].inputs[0] is g.nodes[1].outputs[0]
    g.verify()
    same_outputs(before, g, rtol=0, atol=0)


def test_a_replaced_graph_output_keeps_its_name():
    g = times_four(graph_output=True)
    before = g.copy()
    apply_rules(g, [_rule()])
    assert [v.name for v in g.outputs] == ["m"] and g.outputs[0].producer.name == "twice"
    g.verify()
    same_outputs(before, g, rtol=0, atol=0)


def test_a_replacement_of_another_type_is_refused_and_the_graph_kept():
    g = times_four()
    ops = [(n.op_type, n.name) for n in g.nodes]
    out = apply_rules(g, [_rule(out_dtype=np.dtype(np.float64))])
    (d,) = out.decisions
    assert d.verdict == "refused" and d.reason.startswith("the replacement computes") and "float64" in d.reason
    assert [(n.op_type, n.name) for n in g.nodes] == ops
    g.verify()


def test_an_unbound_stand_in_is_refused():
    g = times_four()
    out = apply_rules(g, [_rule(bind=False)])
    (d,) = out.decisions
    assert (d.verdict, d.reason) == ("refused", "stand-in 'x' is not bound to a value of the graph")
    assert [n.op_type for n in g.nodes] == ["Mul", "Relu"]


def test_new_ops_are_named_apart_from_the_nodes_not_the_values():
    """A new op named like a remaining node ("relu", whose value is "y") takes the next free node name; one
    named like a value but no node ("x", the input) keeps its name: node and value names are apart."""
    g = times_four()
    before = g.copy()
    apply_rules(g, [_rule(names=("relu", "x"))])
    assert [(n.op_type, n.name) for n in g.nodes] == [("Add", "relu_1"), ("Add", "x"), ("Relu", "relu")]
    g.verify()
    same_outputs(before, g, rtol=0, atol=0)


def test_without_a_reason_the_decision_names_the_op_computing_the_output():
    from dataclasses import replace
    g = times_four()
    x = Var("x")
    rule = Rule("times_four", Op("Mul")(x, Const()).named("mul"),
                action=lambda m: replace(_scratch(m["x"]), reason=""))
    (d,) = apply_rules(g, [rule]).decisions
    assert (d.verdict, d.reason) == ("rewritten", "replaced by Add 'twice'")
