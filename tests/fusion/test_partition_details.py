"""``rules.partition.Partition`` on small graphs, each expectation worked out by hand from the module's docstring
(found by mutation testing, tests/MUTATION.md): the plan order is a topological order of the group graph with ties
broken by the earliest first node, also when a group edge runs from a later first node to an earlier one; a merge
that would let a path leave the merged groups and come back is a cycle; ``union`` keeps the group graph and the
ranks right for later questions; what a merged group keeps of its parts' attributes; what ``group`` records."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import ModelError
from opfuse.ir.graph import Graph, TensorType
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.rules.kernel_shape import GroupShape
from opfuse.rules.partition import Partition
from fusion_cases import edge_graph

T = TensorType((4,), np.float32)


def _graph(edges: list[tuple[str, str, list[str]]], outputs: list[str]) -> Graph:
    return edge_graph(edges, outputs, T)


def _groups(g: Graph, *groups: str, kind: str = "elementwise", attrs: dict | None = None):
    """Groups given as 'a+b+c' (node names)."""
    return [([g.node(n) for n in spec.split("+")], GroupShape(kind, None), dict(attrs or {})) for spec in groups]


def _names(p: Partition, gids) -> list[str]:
    return ["+".join(n.name for n in p.members[g]) for g in gids]


def _by_name(p: Partition) -> dict[str, int]:
    return {"+".join(n.name for n in p.members[g]): g for g in p.members}


def _ordered_by_key(p: Partition) -> list[str]:
    return _names(p, sorted(p.members, key=p.order_key))


def _inverted():
    """p, q read x; s reads p and q; t reads s. Group {p, s} has its first node (p) before q, yet reads q."""
    return _graph([("p", "Relu", ["x"]), ("q", "Exp", ["x"]), ("s", "Add", ["p", "q"]), ("t", "Neg", ["s"])], ["t"])


def test_plan_order_without_inversions_is_the_first_node_order():
    g = _inverted()
    p = Partition(g)
    assert _names(p, p.groups_in_order()) == ["p", "q", "s", "t"]
    assert [p.position(gid) for gid in p.groups_in_order()] == [0, 1, 2, 3]
    assert _ordered_by_key(p) == ["p", "q", "s", "t"]
    assert p.successors(p.gid(g.node("p"))) == {p.gid(g.node("s"))}
    assert p.predecessors(p.gid(g.node("s"))) == {p.gid(g.node("p")), p.gid(g.node("q"))}
    assert p.predecessors(p.gid(g.node("p"))) == set()
    # by default every op is its own single group, anchored at itself, without attributes
    assert all((p.kind(p.gid(n)), p.shape[p.gid(n)].anchor, p.attrs[p.gid(n)]) == ("single", n, {}) for n in g.nodes)


def test_plan_order_follows_an_edge_from_a_later_first_node():
    g = _inverted()
    p = Partition(g, _groups(g, "p+s", "q", "t"))
    # {q} (first node 1) must run before {p, s} (first node 0), which reads it
    assert _names(p, p.groups_in_order()) == ["q", "p+s", "t"]
    assert _ordered_by_key(p) == ["q", "p+s", "t"]
    ids = _by_name(p)
    assert (p.position(ids["q"]), p.position(ids["p+s"]), p.position(ids["t"])) == (0, 1, 2)
    assert [fg.name for fg in p.to_plan().groups] == ["q", "p", "t"]


def test_ready_groups_are_taken_by_earliest_first_node():
    # a, b, c read x; d reads c and a: groups {a, d}, {b}, {c}: {c} precedes {a, d}; {b} is free
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["x"]), ("c", "Neg", ["x"]), ("d", "Add", ["c", "a"])], ["d", "b"])
    p = Partition(g, _groups(g, "a+d", "b", "c"))
    assert _names(p, p.groups_in_order()) == ["b", "c", "a+d"]
    g = _graph([("a", "Relu", ["x"]), ("c", "Neg", ["x"]), ("b", "Exp", ["x"]), ("d", "Add", ["c", "a"])], ["d", "b"])
    p = Partition(g, _groups(g, "a+d", "b", "c"))
    assert _names(p, p.groups_in_order()) == ["c", "a+d", "b"]


def test_union_creates_and_removes_inversions():
    g = _inverted()
    p = Partition(g)
    ids = _by_name(p)
    ps = p.union([ids["p"], ids["s"]], GroupShape("elementwise", None))
    assert _names(p, p.groups_in_order()) == ["q", "p+s", "t"]
    assert _ordered_by_key(p) == ["q", "p+s", "t"]
    assert p.successors(ids["q"]) == {ps} and p.predecessors(ps) == {ids["q"]}
    assert p.successors(ps) == {ids["t"]} and p.predecessors(ids["t"]) == {ps}
    pqs = p.union([ps, ids["q"]], GroupShape("elementwise", None))
    assert _names(p, p.groups_in_order()) == ["p+q+s", "t"]
    assert p.predecessors(pqs) == set() and p.successors(pqs) == {ids["t"]}
    # with no inversion left the order is the first-node order again: a group added before the others stays first
    assert _ordered_by_key(p) == ["p+q+s", "t"]


def test_union_of_a_group_that_reads_a_later_one_keeps_the_order_right():
    # u reads x; v reads x; w reads u and v; z reads w. {v, w} first, then {u} into it
    g = _graph([("u", "Relu", ["x"]), ("v", "Exp", ["x"]), ("w", "Add", ["u", "v"]), ("z", "Neg", ["w"])], ["z"])
    p = Partition(g)
    ids = _by_name(p)
    vw = p.union([ids["v"], ids["w"]], GroupShape("elementwise", None))
    assert _names(p, p.groups_in_order()) == ["u", "v+w", "z"]
    p.union([vw, ids["z"]], GroupShape("elementwise", None))
    assert _names(p, p.groups_in_order()) == ["u", "v+w+z"]


def _detour():
    """a -> b -> c -> d and a -> d; e reads x only; f reads d."""
    return _graph([("a", "Relu", ["x"]), ("e", "Sigmoid", ["x"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"]),
                   ("d", "Add", ["a", "c"]), ("f", "Tanh", ["d"])], ["f", "e"])


def test_creates_cycle_exactly_when_a_path_leaves_and_comes_back():
    g = _detour()
    p = Partition(g)
    ids = _by_name(p)
    assert p.creates_cycle([ids["a"], ids["d"]])
    assert p.creates_cycle([ids["a"], ids["c"]])
    assert p.creates_cycle([ids["b"], ids["d"]])
    assert p.creates_cycle([ids["a"], ids["e"], ids["d"]])
    assert not p.creates_cycle([ids["a"], ids["b"]])
    assert not p.creates_cycle([ids["a"], ids["b"], ids["c"], ids["d"]])
    assert not p.creates_cycle([ids["d"], ids["f"]])
    assert not p.creates_cycle([ids["e"], ids["f"]])
    assert not p.creates_cycle([ids["a"], ids["e"]])
    with pytest.raises(ModelError, match="merging these groups would create a cycle"):
        p.union([ids["a"], ids["d"]], GroupShape("elementwise", None))
    # nothing changed
    assert _names(p, p.groups_in_order()) == ["a", "e", "b", "c", "d", "f"]


def test_cycle_checks_after_merges_see_the_merged_group_graph():
    g = _detour()
    p = Partition(g)
    ids = _by_name(p)
    ae = p.union([ids["a"], ids["e"]], GroupShape("elementwise", None))
    assert p.creates_cycle([ae, ids["d"]]) and p.creates_cycle([ae, ids["c"]])
    bc = p.union([ids["b"], ids["c"]], GroupShape("elementwise", None))
    assert p.creates_cycle([ae, ids["d"]])
    assert not p.creates_cycle([bc, ids["d"]])
    bcd = p.union([bc, ids["d"]], GroupShape("elementwise", None))
    assert not p.creates_cycle([ae, bcd])
    assert p.creates_cycle([ae, ids["f"]])     # a -> b..d -> f
    assert _names(p, p.groups_in_order()) == ["a+e", "b+c+d", "f"]


def test_ranks_after_a_merge_keep_descendants_after_the_merged_group():
    # m descends from a and is placed between a and b; merging a and b must rank m after the merged group,
    # so that a later merge of {a, b} with n (which reads m) is seen as a cycle
    g = _graph([("a", "Relu", ["x"]), ("m", "Exp", ["a"]), ("b", "Neg", ["x"]), ("n", "Add", ["m", "b"])], ["n"])
    p = Partition(g)
    ids = _by_name(p)
    ab = p.union([ids["a"], ids["b"]], GroupShape("elementwise", None))
    assert p.creates_cycle([ab, ids["n"]])
    assert not p.creates_cycle([ab, ids["m"]])
    assert _names(p, p.groups_in_order()) == ["a+b", "m", "n"]
    # a group between the merged ones that does not descend from them keeps its place before the merged group
    g = _graph([("a", "Relu", ["x"]), ("k", "Exp", ["x"]), ("b", "Neg", ["a"]), ("n", "Add", ["k", "b"])], ["n"])
    p = Partition(g)
    ids = _by_name(p)
    ab = p.union([ids["a"], ids["b"]], GroupShape("elementwise", None))
    assert not p.creates_cycle([ab, ids["n"]])
    kn = p.union([ids["k"], ids["n"]], GroupShape("elementwise", None))
    assert _names(p, p.groups_in_order()) == ["a+b", "k+n"]
    assert not p.creates_cycle([ab, kn])


def test_union_merges_attributes_and_origin_in_node_order():
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"])], ["c"])
    groups = [([g.node("a")], GroupShape("single", g.node("a")), {"origin": ["A0", "A1"], "keep": 1, "members": 2}),
              ([g.node("b")], GroupShape("single", g.node("b")), {"inputs": ["x"], "outputs": ["b"], "domain": (4,),
                                                                  "member_kinds": ["x"], "shared_input": "x"}),
              ([g.node("c")], GroupShape("single", g.node("c")), {"origin": ["C0"], "keep": 3, "other": 4})]
    p = Partition(g, groups)
    ids = _by_name(p)
    gid = p.union([ids["c"], ids["b"], ids["a"]], GroupShape("elementwise", None), {"other": 5})
    assert p.attrs[gid] == {"origin": ["A0", "A1", "C0"], "keep": 3, "other": 5}
    assert p.kind(gid) == "elementwise" and [n.name for n in p.members[gid]] == ["a", "b", "c"]
    # no origin at all: none is written
    p = Partition(g)
    ids = _by_name(p)
    gid = p.union([ids["a"], ids["b"]], GroupShape("elementwise", None))
    assert p.attrs[gid] == {}
    assert p.nodes_of([gid, ids["c"]]) == list(g.nodes)


def test_group_records_its_anchor_boundary_and_origin():
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"]), ("d", "Abs", ["a"])], ["c", "d"])
    b = g.node("b")
    p = Partition(g, [([g.node("a"), b], GroupShape("elementwise", b, {"qk": 1, "mode": "m"}), {"tag": 1}),
                      ([g.node("c")], GroupShape("single", None), {}), ([g.node("d")], GroupShape("single", None), {})])
    ids = _by_name(p)
    fg = p.group(ids["a+b"], {"a": ["A"], "b": ["B1", "B2"]})
    assert (fg.name, fg.kind, fg.anchor, [n.name for n in fg.nodes]) == ("b", "elementwise", b, ["a", "b"])
    assert fg.attrs == {"mode": "m", "tag": 1, "inputs": ["x"], "outputs": ["a", "b"], "origin": ["A", "B1", "B2"]}
    fc = p.group(ids["c"])
    assert (fc.name, fc.anchor.name) == ("c", "c") and fc.attrs == {"inputs": ["b"], "outputs": ["c"]}
    plan = p.to_plan({"c": ["C"]})
    assert [(x.name, x.attrs["origin"]) for x in plan.groups] == [("b", []), ("c", ["C"]), ("d", [])]


def test_from_plan_keeps_groups_kinds_anchors_and_attributes():
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"])], ["c"])
    a, b, c = g.nodes
    plan = FusionPlan(g, [FusionGroup("b", [a, b], "elementwise", b, {"tag": 1}), FusionGroup("c", [c], "single", c)])
    p = Partition.from_plan(plan)
    ids = _by_name(p)
    assert set(ids) == {"a+b", "c"}
    assert (p.kind(ids["a+b"]), p.shape[ids["a+b"]].anchor, p.attrs[ids["a+b"]]) == ("elementwise", b, {"tag": 1})
    assert p.successors(ids["a+b"]) == {ids["c"]}
    plan.groups[0].attrs["tag"] = 2
    assert p.attrs[ids["a+b"]] == {"tag": 1}   # a copy


def test_a_cyclic_partition_is_refused():
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"])], ["c"])
    with pytest.raises(ModelError, match="fusion partition has a cycle between groups"):
        Partition(g, _groups(g, "a+c", "b"))


def test_a_merge_ranks_every_descendant_in_its_window_after_the_merged_group():
    # a -> m1 -> m2 -> n and b -> n, in the order a, m1, m2, b, n: merging a and b must rank m1 and m2 (both
    # descend from a) after the merged group, so that {a+b, m2} is seen to leave through m1 and come back
    g = _graph([("a", "Relu", ["x"]), ("m1", "Exp", ["a"]), ("m2", "Neg", ["m1"]), ("b", "Abs", ["x"]),
                ("n", "Add", ["m2", "b"])], ["n"])
    p = Partition(g)
    ids = _by_name(p)
    ab = p.union([ids["a"], ids["b"]], GroupShape("elementwise", None))
    assert p.creates_cycle([ab, ids["m2"]])
    assert p.creates_cycle([ab, ids["n"]])
    assert not p.creates_cycle([ab, ids["m1"]])
    assert _names(p, p.groups_in_order()) == ["a+b", "m1", "m2", "n"]


def test_the_plan_order_stays_right_while_inversions_come_and_go_two_at_a_time():
    # p1, p2, q1, q2 read x; s1 reads p1, q1; s2 reads p2, q2. Groups {p1, s1}, {p2, s2} both read a later group.
    g = _graph([("p1", "Relu", ["x"]), ("p2", "Exp", ["x"]), ("q1", "Neg", ["x"]), ("q2", "Abs", ["x"]),
                ("s1", "Add", ["p1", "q1"]), ("s2", "Mul", ["p2", "q2"])], ["s1", "s2"])
    p = Partition(g, _groups(g, "p1+s1", "p2+s2", "q1", "q2"))
    assert _names(p, p.groups_in_order()) == ["q1", "p1+s1", "q2", "p2+s2"]
    ids = _by_name(p)
    # merging q1 into {p1, s1} removes one inversion; the other remains
    p.union([ids["p1+s1"], ids["q1"]], GroupShape("elementwise", None))
    assert _names(p, p.groups_in_order()) == ["p1+q1+s1", "q2", "p2+s2"]
    assert _ordered_by_key(p) == ["p1+q1+s1", "q2", "p2+s2"]


def test_union_takes_attributes_in_node_order_whatever_the_group_ids():
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"])], ["b"])
    groups = [([g.node("b")], GroupShape("single", g.node("b")), {"origin": ["B"], "keep": "b"}),
              ([g.node("a")], GroupShape("single", g.node("a")), {"origin": ["A"], "keep": "a"})]
    p = Partition(g, groups)
    ids = _by_name(p)
    assert ids["b"] < ids["a"]
    gid = p.union([ids["a"], ids["b"]], GroupShape("elementwise", None))
    assert p.attrs[gid] == {"origin": ["A", "B"], "keep": "b"}


def test_the_cycle_errors_say_so_exactly():
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"])], ["c"])
    with pytest.raises(ModelError) as e:
        Partition(g, _groups(g, "a+c", "b"))
    assert str(e.value) == "fusion partition has a cycle between groups"
    p = Partition(g)
    ids = _by_name(p)
    with pytest.raises(ModelError) as e:
        p.union([ids["a"], ids["c"]], GroupShape("elementwise", None))
    assert str(e.value) == "fusion partition: merging these groups would create a cycle"
