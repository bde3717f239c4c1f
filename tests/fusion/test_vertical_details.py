"""The vertical rules' start and path conditions (``rules.vertical``) one by one, each expectation worked out by
hand from the module's docstring (which groups may start a merge, which paths to the post-dominator belong to
which family) and their exact refusal texts, which the decision log and ``explain`` show. Found by mutation
testing (tests/MUTATION.md)."""
from __future__ import annotations

import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.rules.kernel_shape import GroupShape
from opfuse.rules.partition import Partition
from opfuse.rules.vertical import (_accepts_chain, _accepts_epilogue, _accepts_injective, _accepts_prologue,
                                   _row_normalization_target, _starts_chain, _starts_epilogue, _starts_injective,
                                   _starts_prologue)
from fusion_cases import plan_of, randn, refusals


def _graph():
    """x -> mm (MatMul) -> add1 (+bias) -> add2 (+x) -> t (Transpose) -> ln (LayerNormalization) -> rs (ReduceSum)
    -> r (Relu); x -> c (Conv over x4) -> e (Exp); sm (Softmax of x); sh (Shape of x)."""
    b = GraphBuilder("v")
    x = b.input("x", (8, 8))
    mm = b.op("MatMul", x, b.const("w", randn((8, 8))), name="mm")
    a2 = b.op("Add", b.op("Add", mm, b.const("bias", randn((8,), 1)), name="add1"), x, name="add2")
    t = b.op("Transpose", a2, perm=[1, 0], name="t")
    ln = b.op("LayerNormalization", t, b.const("g", np.ones(8, np.float32)), name="ln")
    r = b.op("Relu", b.op("ReduceSum", ln, axes=[1], keepdims=1, name="rs"), name="r")
    x4 = b.input("x4", (1, 2, 4, 4))
    e = b.op("Exp", b.op("Conv", x4, b.const("wc", randn((2, 2, 1, 1), 2)), name="c"), name="e")
    sm = b.op("Softmax", x, axis=-1, name="sm")
    return b.build(r, e, sm)


def _p(g, groups=None):
    """Single-op groups, except the given ones (node names, kind, anchor name or None)."""
    specs = []
    taken = set()
    for names, kind, anchor in groups or []:
        specs.append(([g.node(n) for n in names], GroupShape(kind, g.node(anchor) if anchor else None), {}))
        taken.update(names)
    specs += [([n], GroupShape("single", n), {}) for n in g.nodes if n.name not in taken]
    return Partition(g, specs)


def _reason(r):
    return None if r is None else (r.kind.value, r.reason)


def test_which_groups_start_a_merge():
    g = _graph()
    p = _p(g, [(["add1", "add2"], "elementwise", None), (["c", "e"], "conv_epilogue", "c"),
               (["rs", "r"], "reduction", "rs")])
    gid = {n.name: p.gid(n) for n in g.nodes}
    # an elementwise group (single or elementwise, all members elementwise) starts a prologue or a chain
    for start in (_starts_prologue, _starts_chain):
        assert start(p, gid["add1"], g.node("add1"))
        assert not start(p, gid["mm"], g.node("mm"))
        assert not start(p, gid["t"], g.node("t"))
        assert not start(p, gid["rs"], g.node("r"))       # a reduction group, though r is elementwise
    # an epilogue starts from an anchor op alone or from an anchored group
    assert _starts_epilogue(p, gid["mm"], g.node("mm"))
    assert _starts_epilogue(p, gid["ln"], g.node("ln"))
    assert not _starts_epilogue(p, gid["add1"], g.node("add1"))
    assert not _starts_epilogue(p, gid["t"], g.node("t"))
    assert _starts_epilogue(p, gid["c"], g.node("e"))
    assert _starts_epilogue(p, gid["rs"], g.node("r"))
    p2 = _p(g, [(["c", "e"], "conv_epilogue", None), (["add1", "add2"], "elementwise", "add1")])
    assert not _starts_epilogue(p2, p2.gid(g.node("c")), g.node("c"))   # an anchored kind needs its anchor
    assert not _starts_epilogue(p2, p2.gid(g.node("add1")), g.node("add1"))
    # data movement starts from a group of data movement and elementwise ops holding some data movement
    assert _starts_injective(p, gid["t"], g.node("t"))
    assert not _starts_injective(p, gid["add1"], g.node("add1"))
    assert not _starts_injective(p, gid["mm"], g.node("mm"))
    p3 = _p(g, [(["add2", "t"], "injective", None)])
    assert _starts_injective(p3, p3.gid(g.node("t")), g.node("t"))
    p4 = _p(g, [(["add2", "t"], "elementwise", None)])
    assert not _starts_injective(p4, p4.gid(g.node("t")), g.node("t"))
    p5 = _p(g, [(["t", "ln"], "injective", None)])
    assert not _starts_injective(p5, p5.gid(g.node("t")), g.node("t"))


def test_normalization_prologue_targets_and_paths():
    g = _graph()
    p = _p(g)
    node = g.node
    assert _row_normalization_target(p, node("ln")) and _row_normalization_target(p, node("sm"))
    assert not _row_normalization_target(p, node("rs"))     # a reduction, not a row normalization
    assert not _row_normalization_target(p, node("add2"))
    assert _accepts_prologue(p, p.gid(node("add2")), node("ln"), [node("ln")]) is None
    assert _reason(_accepts_prologue(p, p.gid(node("add1")), node("add2"), [node("add2")])) == \
        ("condition", "'add2' is not (in) a row normalization")
    assert _reason(_accepts_prologue(p, p.gid(node("add1")), node("rs"), [node("rs")])) == \
        ("condition", "'rs' is not (in) a row normalization")
    assert _reason(_accepts_prologue(p, p.gid(node("add2")), node("ln"), [node("t"), node("ln")])) == \
        ("category", "'t' (Transpose) on the way to 'ln' is not elementwise")
    # the normalization's own group may hold more than the normalization
    q = _p(g, [(["t", "ln"], "reduction", "ln")])
    assert q.kind(q.gid(node("ln"))) == "reduction"
    assert _row_normalization_target(q, node("ln"))
    assert _accepts_prologue(q, q.gid(node("add2")), node("ln"), [node("t"), node("ln")]) is None
    # ... but not as an elementwise or injective group
    for kind in ("elementwise", "injective"):
        q = _p(g, [(["t", "ln"], kind, "ln")])
        assert not _row_normalization_target(q, node("ln"))
        assert _reason(_accepts_prologue(q, q.gid(node("add2")), node("ln"), [node("ln")])) == \
            ("condition", "'ln' is not (in) a row normalization")
    q = _p(g, [(["t", "ln"], "reduction", None)])
    assert not _row_normalization_target(q, node("ln"))


def test_epilogue_paths():
    g = _graph()
    p = _p(g)
    node = g.node
    mm, c = p.gid(node("mm")), p.gid(node("c"))
    assert _accepts_epilogue(p, mm, node("add2"), [node("add1"), node("add2")]) is None
    assert _accepts_epilogue(p, c, node("e"), [node("e")]) is None
    assert _reason(_accepts_epilogue(p, mm, node("ln"), [node("add1"), node("add2"), node("t"), node("ln")])) == \
        ("category", "'t' (Transpose) is not elementwise: it cannot be an epilogue of 'mm' (MatMul)")
    # the target itself, a single op, is judged with its group by the legality check
    assert _accepts_epilogue(p, mm, node("t"), [node("add1"), node("add2"), node("t")]) is None
    assert _reason(_accepts_epilogue(p, c, node("mm"), [node("mm")])) == \
        ("category", "two out-elementwise-fusable ops 'c' (Conv) and 'mm' (MatMul) are never fused into one "
                     "kernel (no Conv -> Conv)")
    assert _accepts_epilogue(p, p.gid(node("rs")), node("r"), [node("r")]) is None
    # d's own group is judged as a whole
    q = _p(g, [(["t", "ln"], "reduction", "ln")])
    assert _accepts_epilogue(q, q.gid(node("mm")), node("ln"), [node("add1"), node("add2"), node("t"),
                                                                 node("ln")]) is None
    q = _p(g, [(["add2", "t"], "injective", None)])
    assert _accepts_epilogue(q, q.gid(node("mm")), node("t"), [node("add1"), node("add2"), node("t")]) is None
    assert _accepts_epilogue(q, q.gid(node("mm")), node("add2"), [node("add1"), node("add2"), node("t")]) is None


def test_chain_paths():
    g = _graph()
    p = _p(g)
    node = g.node
    a1 = p.gid(node("add1"))
    assert _accepts_chain(p, a1, node("t"), [node("add2"), node("t")]) is None     # data movement
    assert _accepts_chain(p, a1, node("rs"), [node("add2"), node("rs")]) is None   # a reduction as the target
    assert _reason(_accepts_chain(p, a1, node("r"), [node("rs"), node("r")])) == \
        ("category", "'rs' (ReduceSum) on the path is neither elementwise nor data movement")
    assert _reason(_accepts_chain(p, a1, node("mm"), [node("add2"), node("mm")])) == \
        ("category", "elementwise ops are not fused into the input of 'mm' (MatMul): out-elementwise-fusable "
                     "ops take epilogues only")
    # a node of the target's group passes whatever it is
    q = _p(g, [(["rs", "r"], "reduction", "rs")])
    assert _accepts_chain(q, q.gid(node("add1")), node("r"), [node("rs"), node("r")]) is None


def test_injective_paths():
    g = _graph()
    p = _p(g)
    node = g.node
    t = p.gid(node("t"))
    assert _accepts_injective(p, t, node("add2"), [node("add1"), node("add2")]) is None
    assert _reason(_accepts_injective(p, t, node("ln"), [node("ln")])) == \
        ("category", "'ln' (LayerNormalization) is not data movement or elementwise: an index map cannot pass "
                     "through it")
    for kind in ("elementwise", "injective"):
        q = _p(g, [(["add1", "add2"], kind, None)])
        assert _accepts_injective(q, q.gid(node("t")), node("add2"), [node("add1"), node("add2")]) is None
    q = _p(g, [(["rs", "r"], "reduction", "rs")])
    assert _reason(_accepts_injective(q, t, node("r"), [node("r")])) == \
        ("condition", "'r' already belongs to a reduction group")


def test_the_path_limit_is_a_resource_refusal_naming_both_ends():
    b = GraphBuilder("limit")
    x = b.input("x", (4,))
    r = b.op("Relu", x, name="r")
    j = b.op("Add", b.op("Neg", b.op("Exp", r, name="e1"), name="e2"), b.op("Abs", r, name="e3"), name="j")
    plan, dec = plan_of(b.build(j), max_ops_per_group=3)
    assert "elementwise_chain: more than 3 ops between 'r' and 'j'" in [
        f"{d.rule}: {d.reason}" for d in dec if d.kind == "resource"]
    plan, dec = plan_of(b.build(j), max_ops_per_group=5)
    assert not any("ops between" in x for x in refusals(dec, "elementwise_chain"))
    assert len(plan.groups) == 1


# the shared action and condition, built afresh (the library's rules are built when the module is imported) ----

def _chain_rule(reverse=False, target=None):
    from opfuse.patterns import Op
    from opfuse.rules.rule import Rule
    from opfuse.rules.vertical import ELEMENTWISE, grow_to_post_dominator, path_condition
    return Rule("chain", Op(category=ELEMENTWISE), condition=path_condition(_accepts_chain),
                action=grow_to_post_dominator(_starts_chain, reverse=reverse, target=target))


def _run(graph, rule, **options):
    from opfuse.rules import FusionOptions, form_groups
    plan, dec = form_groups(graph, [rule], FusionOptions(**options))
    return sorted(sorted(n.name for n in g.nodes) for g in plan.groups), \
        [(d.verdict, d.kind, d.nodes, d.reason) for d in dec]


def _line():
    b = GraphBuilder("line")
    x = b.input("x", (4,))
    return b.build(b.op("Neg", b.op("Exp", b.op("Relu", x, name="a"), name="b"), name="c"))


def _diamond():
    """a feeds b and c, which meet in d (the output)."""
    b = GraphBuilder("diamond")
    x = b.input("x", (4,))
    a = b.op("Relu", x, name="a")
    return b.build(b.op("Add", b.op("Exp", a, name="b"), b.op("Neg", a, name="c"), name="d"))


def test_grow_to_post_dominator_in_graph_order_and_reversed():
    groups, dec = _run(_line(), _chain_rule())
    assert groups == [["a", "b", "c"]]
    assert dec == [("fused", "", ("a", "b"), "'a' fused into 'b'"), ("fused", "", ("b", "c"), "'b' fused into 'c'")]
    groups, dec = _run(_line(), _chain_rule(reverse=True))
    assert groups == [["a", "b", "c"]]
    assert dec == [("fused", "", ("b", "c"), "'b' fused into 'c'"), ("fused", "", ("a", "b"), "'a' fused into 'b'")]
    # only targets the rule wants
    groups, dec = _run(_line(), _chain_rule(target=lambda p, d: d.op_type == "Neg"))
    assert groups == [["a"], ["b", "c"]] and [d[2] for d in dec] == [("b", "c")]


def test_grow_to_post_dominator_takes_the_paths_and_skips_a_target_already_in_the_group():
    groups, dec = _run(_diamond(), _chain_rule())
    assert groups == [["a", "b", "c", "d"]]
    assert dec == [("fused", "", ("a", "d"), "'a' fused into 'd'")]


def test_grow_to_post_dominator_refuses_paths_over_the_limit():
    groups, dec = _run(_diamond(), _chain_rule(), max_ops_per_group=2)
    assert dec == [("refused", "resource", ("a", "d"), "more than 2 ops between 'a' and 'd'"),
                   ("fused", "", ("b", "d"), "'b' fused into 'd'"),
                   ("refused", "resource", ("c", "d"), "3 ops exceed the limit of 2 per kernel")]
    assert groups == [["a"], ["b", "d"], ["c"]]


def test_path_condition_judges_the_site_with_the_rules_accepts():
    b = GraphBuilder("into_matmul")
    x = b.input("x", (4, 4))
    g = b.build(b.op("MatMul", b.op("Relu", x, name="a"), b.const("w", randn((4, 4))), name="m"))
    groups, dec = _run(g, _chain_rule())
    assert groups == [["a"], ["m"]]
    assert dec == [("refused", "category", ("a", "m"), "elementwise ops are not fused into the input of 'm' (MatMul): "
                                                        "out-elementwise-fusable ops take epilogues only")]
