"""The fusion driver (``rules.driver``), the rule library, ``FusionOptions`` and the decision records, each
expectation worked out by hand from their docstrings: rules run by priority (the library's order breaks ties),
every site judged by the rule's condition, the one legality, then the user's disabling, each refusal logged once
with its reason, and the statistics counted. Found by mutation testing (tests/MUTATION.md)."""
from __future__ import annotations

import pytest

from opfuse.ops import GraphBuilder
from opfuse.patterns import Op
from opfuse.rules import FusionOptions, form_groups, unfused_plan
from opfuse.rules.decisions import (FUSED, REFUSED, Decision, FusionLog, Refusal, RefusalKind, RuleStats, disabled,
                                    refuse, refused, taken)
from opfuse.rules.driver import seed_nodes
from opfuse.rules.library import (default_rules, fusion_rule_names, fusion_rules, recognition_rules, rule_by_name)
from opfuse.rules.options import MAX_OPS_PER_GROUP
from opfuse.rules.rule import Fuse, Replacement, Rule
from opfuse.rules.site import Site


def chain():
    """x -> a (Relu) -> b (Exp) -> c (Neg) -> d (Abs)."""
    b = GraphBuilder("chain")
    v = b.input("x", (4,))
    for name, op in (("a", "Relu"), ("b", "Exp"), ("c", "Neg"), ("d", "Abs")):
        v = b.op(op, v, name=name)
    return b.build(v)


def pair_rule(name, first, second, priority=1.0, condition=None, detail=None):
    """Proposes merging the group of node ``first`` with the group of node ``second``."""
    def propose(grouping, matches):
        p = grouping.p
        yield Site({p.gid(grouping.graph.node(first)), p.gid(grouping.graph.node(second))}, [first, second],
                   detail or f"{first}+{second}")
    return Rule(name, Op("Relu"), condition=condition, action=Fuse(propose), priority=priority)


def _groups(plan):
    return [[n.name for n in g.nodes] for g in plan.groups]


def test_rules_run_by_priority_and_the_first_takes_the_ops():
    g = chain()
    low, high = pair_rule("low", "a", "b", priority=1), pair_rule("high", "b", "c", priority=2)
    plan, dec = form_groups(g, [low, high])
    # high merges b and c first; low then merges a into that group
    assert _groups(plan) == [["a", "b", "c"], ["d"]]
    assert [(d.rule, d.verdict) for d in dec] == [("high", FUSED), ("low", FUSED)]
    # equal priorities: the list's order
    g = chain()
    first, second = pair_rule("first", "b", "c"), pair_rule("second", "c", "d")
    _, dec = form_groups(g, [first, second])
    assert [d.rule for d in dec] == ["first", "second"]
    g = chain()
    _, dec = form_groups(g, [second, first])
    assert [d.rule for d in dec] == ["second", "first"]


def test_a_merge_records_the_rule_and_the_decision_its_detail():
    g = chain()
    plan, dec = form_groups(g, [pair_rule("r", "a", "b", detail="a into b")])
    ab = plan.groups[0]
    assert [n.name for n in ab.nodes] == ["a", "b"] and ab.attrs["rule"] == "r" and ab.kind == "elementwise"
    assert [(d.pass_name, d.rule, d.verdict, d.nodes, d.reason) for d in dec] == \
        [("fuse", "r", "fused", ("a", "b"), "a into b")]


def test_the_condition_refuses_before_the_legality_and_a_disabled_rule_still_logs():
    g = chain()
    plan, dec = form_groups(g, [pair_rule("r", "a", "b", condition=lambda grouping, site: refuse("no thanks"))])
    assert _groups(plan) == [["a"], ["b"], ["c"], ["d"]]
    assert [(d.verdict, d.kind, d.reason) for d in dec] == [("refused", "condition", "no thanks")]
    # the legality: over the size limit
    g = chain()
    plan, dec = form_groups(g, [pair_rule("r", "a", "b")], FusionOptions(max_ops_per_group=1))
    assert [(d.verdict, d.kind, d.reason) for d in dec] == [("refused", "resource",
                                                            "2 ops exceed the limit of 1 per kernel")]
    # disabled: refused as disabled, the legal merge not made
    g = chain()
    plan, dec = form_groups(g, [pair_rule("r", "a", "b")], FusionOptions(disabled=frozenset({"r"})))
    assert _groups(plan) == [["a"], ["b"], ["c"], ["d"]]
    assert [(d.verdict, d.kind, d.reason) for d in dec] == [("refused", "disabled", "rule 'r' is disabled")]
    # an illegal site of a disabled rule says why it is illegal
    g = chain()
    _, dec = form_groups(g, [pair_rule("r", "a", "b")], FusionOptions(max_ops_per_group=1, disabled={"r"}))
    assert [(d.kind, d.reason) for d in dec] == [("resource", "2 ops exceed the limit of 1 per kernel")]


def test_a_site_the_action_already_refused_is_logged_with_its_refusal():
    def propose(grouping, matches):
        yield Site({grouping.p.gid(matches[0].nodes[0])}, ["a"], refusal=Refusal(RefusalKind.RESOURCE, "too far"))
    g = chain()
    _, dec = form_groups(g, [Rule("r", Op("Relu"), action=Fuse(propose))])
    assert [(d.verdict, d.kind, d.reason, d.nodes) for d in dec] == [("refused", "resource", "too far", ("a",))]


def test_statistics_count_seeds_sites_applications_and_refusals():
    g = chain()
    stats: dict = {}

    def propose(grouping, matches):
        p, gr = grouping.p, grouping.graph
        yield Site({p.gid(gr.node("a")), p.gid(gr.node("b"))}, ["a", "b"])
        yield Site({p.gid(gr.node("c")), p.gid(gr.node("d"))}, ["c", "d"], refusal=refuse("no"))
        yield Site({p.gid(gr.node("c")), p.gid(gr.node("d"))}, ["c", "d"])
    rule = Rule("r", Op("Relu") | Op("Exp"), action=Fuse(propose))
    plan, dec = form_groups(g, [rule], stats=stats)
    st = stats["r"]
    assert (st.attempts, st.matches, st.applied, st.refused) == (2, 3, 2, 1) and st.seconds > 0
    assert _groups(plan) == [["a", "b"], ["c", "d"]]


def test_a_marking_site_applies_its_function():
    marked = []

    def propose(grouping, matches):
        yield Site({grouping.p.gid(matches[0].nodes[0])}, ["a"], "marked", apply=lambda gr, s: marked.append(s))
    _, dec = form_groups(chain(), [Rule("m", Op("Relu"), action=Fuse(propose))])
    assert len(marked) == 1 and [(d.verdict, d.reason) for d in dec] == [("fused", "marked")]
    _, dec = form_groups(chain(), [Rule("m", Op("Relu"), action=Fuse(propose))],
                         FusionOptions(disabled=frozenset({"m"})))
    assert len(marked) == 1 and [d.kind for d in dec] == ["disabled"]


def test_the_driver_takes_fusion_rules_only():
    rw = Rule("rw", Op("Relu"), action=lambda m: Replacement("Neg", [m.nodes[0].inputs[0]]))
    with pytest.raises(TypeError, match="'rw' is a rewrite rule: the fusion driver runs fusion rules"):
        form_groups(chain(), [rw])


def test_a_merge_tells_the_action_its_new_group():
    seen = []

    def propose(grouping, matches):
        p, gr = grouping.p, grouping.graph
        s = Site({p.gid(gr.node("a")), p.gid(gr.node("b"))}, ["a", "b"])
        yield s
        seen.append(s.facts.get("gid"))
        yield Site({s.facts["gid"], p.gid(gr.node("c"))}, ["ab", "c"])
    plan, _ = form_groups(chain(), [Rule("r", Op("Relu"), action=Fuse(propose))])
    assert seen[0] is not None and _groups(plan) == [["a", "b", "c"], ["d"]]


def test_unfused_plan_and_seed_nodes():
    g = chain()
    plan = unfused_plan(g)
    assert _groups(plan) == [["a"], ["b"], ["c"], ["d"]]
    assert [(grp.name, grp.kind, grp.attrs["origin"], grp.attrs["inputs"], grp.attrs["outputs"])
            for grp in plan.groups] == [("a", "single", ["a"], ["x"], ["a"]), ("b", "single", ["b"], ["a"], ["b"]),
                                        ("c", "single", ["c"], ["b"], ["c"]), ("d", "single", ["d"], ["c"], ["d"])]
    from opfuse.patterns import find_matches
    assert [n.name for n in seed_nodes(find_matches(g, Op("Exp") | Op("Abs")))] == ["b", "d"]


# the library ----------------------------------------------------------------------------------------

def test_the_library_lists_the_families_in_their_order():
    assert fusion_rule_names() == ["attention", "normalization_prologue", "dequantize_prologue", "epilogue",
                                   "concat_alias", "elementwise_chain", "injective", "horizontal"]
    assert [r.name for r in fusion_rules()] == fusion_rule_names()
    rec = recognition_rules()
    assert len(rec) == 6 and rec[-1].name == "int8_concat" and all(r.is_rewrite for r in rec)
    assert len({r.name for r in rec}) == 6 and not any(r.is_rewrite for r in fusion_rules())
    names = [r.name for r in default_rules()]   # other rewrite stages may come first
    assert names[len(names) - 14:] == [r.name for r in recognition_rules()] + fusion_rule_names()
    assert rule_by_name("epilogue").name == "epilogue"
    mine = Rule("mine", Op("Relu"))
    assert rule_by_name("mine", [mine]) is mine
    with pytest.raises(KeyError):
        rule_by_name("epilogue", [mine])
    with pytest.raises(KeyError):
        rule_by_name("no_such_rule")


# options ----------------------------------------------------------------------------------------------

def test_options_defaults_limits_and_disabling():
    o = FusionOptions()
    assert (o.max_ops_per_group, o.max_group_inputs, o.max_working_set_bytes) == (MAX_OPS_PER_GROUP, 64, None)
    assert (o.max_horizontal_members, o.max_merged_weight_bytes, o.max_folded_constant_bytes) == \
        (8, 64 << 20, 16 << 20)
    assert MAX_OPS_PER_GROUP == 32
    assert o.size_refusal(32) is None
    r = o.size_refusal(33)
    assert (r.kind, r.reason) == (RefusalKind.RESOURCE, "33 ops exceed the limit of 32 per kernel")
    d = FusionOptions(disabled=["epilogue"])
    assert d.disabled == frozenset({"epilogue"}) and d.is_disabled("epilogue") and not d.is_disabled("injective")
    assert not o.is_disabled("epilogue")
    w = d.with_(max_ops_per_group=3)
    assert (w.max_ops_per_group, w.disabled, d.max_ops_per_group) == (3, frozenset({"epilogue"}), 32)


# decisions ---------------------------------------------------------------------------------------------

def test_decision_records_labels_and_text():
    assert [k.label for k in RefusalKind] == ["rule refused", "category forbids", "cycle", "resource limit",
                                             "overlap", "rewrite declined", "disabled by user", "not chosen"]
    r = refuse("why", "n1")
    assert (r.kind, r.reason, r.culprits, str(r)) == (RefusalKind.CONDITION, "why", ("n1",), "rule refused: why")
    assert disabled("x") == Refusal(RefusalKind.DISABLED, "rule 'x' is disabled")
    t = taken("p", "r", ["a", "b"], "did it", group="g")
    assert (t.verdict, t.nodes, t.reason, t.group, t.kind, t.taken, t.label) == \
        (FUSED, ("a", "b"), "did it", "g", "", True, "")
    assert str(t) == "[p] r fused at a, b: did it"
    f = refused("p", "r", ["a"], Refusal(RefusalKind.OVERLAP, "taken"))
    assert (f.verdict, f.kind, f.reason, f.taken, f.label) == (REFUSED, "overlap", "taken", False, "overlap")
    assert str(f) == "[p] r refused (overlap) at a: taken"
    assert str(taken("p", "r", ["a"])) == "[p] r fused at a"
    d = Decision("p", "r", "rewritten", ("a",), "", "x", 1.23456789, "g")
    assert d.to_dict() == {"pass": "p", "rule": "r", "verdict": "rewritten", "kind": "", "reason": "x",
                           "nodes": ["a"], "score": 1.234568, "group": "g"}
    assert Decision("p", "r", "fused", ()).to_dict()["score"] is None


def test_the_fusion_log_keeps_each_decision_once_in_order():
    log = FusionLog()
    log.taken("r", ["a"], "d")
    log.refused("s", ["b"], refuse("no"))
    log.taken("r", ["a"], "d")
    log.refused("s", ["b"], refuse("no"))
    log.refused("s", ["b"], refuse("other"))
    assert [(d.pass_name, d.rule, d.verdict, d.reason) for d in log.decisions] == \
        [("fuse", "r", "fused", "d"), ("fuse", "s", "refused", "no"), ("fuse", "s", "refused", "other")]
    assert FusionLog("mine").pass_name == "mine"


def test_rule_stats_add_and_dict():
    a = RuleStats("r", 1, 2, 3, 4, 0.5)
    a.add(RuleStats("r", 10, 20, 30, 40, 0.25))
    assert a.to_dict() == {"rule": "r", "attempts": 11, "matches": 22, "applied": 33, "refused": 44,
                           "seconds": 0.75}
