"""The rewrite engine (``rules.resolve``): the cases mutation testing found untested (tests/MUTATION.md, resolve.py's
survivors). Each expectation is worked out by hand from the module docstring and the seed's greedy (7.2.3: score =
benefit / cost * priority, a kept 32-byte value is worth 2 * 32; ties by size, rule order, graph position)."""
from __future__ import annotations

import pytest

import opfuse.rules.resolve as resolve
from opfuse.errors import ModelError
from opfuse.ops import GraphBuilder
from opfuse.patterns import Op, par
from opfuse.rules import FusionOptions, Replacement, Rule, apply_rules
from opfuse.rules.conflicts import DependencyRules
from rule_helpers import RESOLVE_SHAPE, chain, summary, to_op

SHAPE = RESOLVE_SHAPE  # float32: 32 bytes a value


def test_decisions_default_to_the_pass_name_rules_and_stats_name_their_rule():
    out = apply_rules(chain("Relu", "Sigmoid"), [Rule("r", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"))])
    assert [d.pass_name for d in out.decisions] == ["rules"]
    assert out.stats["r"].rule == "r"


def test_max_repeat_bounds_a_repetition():
    relus = Rule("relus", Op("Relu").plus(), action=to_op("Neg"))
    out = apply_rules(chain("Relu", "Relu", "Relu", "Relu"), [relus])
    assert [(d.verdict, d.nodes) for d in out.decisions] == [("rewritten", ("c0", "c1", "c2", "c3"))]
    # Relu.plus() is one Relu and a chain of up to max_repeat more (patterns.template): with 1, windows of two;
    # the first wins, the one it overlaps is refused, the last one fits
    g = chain("Relu", "Relu", "Relu", "Relu")
    out = apply_rules(g, [relus], max_repeat=1)
    assert [(d.verdict, d.nodes) for d in out.decisions] == [
        ("rewritten", ("c0", "c1")), ("refused", ("c1", "c2")), ("rewritten", ("c2", "c3"))]
    assert [n.op_type for n in g.nodes] == ["Neg", "Neg"]


def test_a_rewrite_declined_by_its_action_records_its_reason_and_score():
    g = chain("Relu", "Sigmoid")
    r = Rule("r", Op("Relu") >> Op("Sigmoid"), action=lambda m: "the action says no")
    assert summary(apply_rules(g, [r])) == [("r", "refused", ("c0", "c1"), "rewrite", "the action says no", 32.0)]
    assert [n.op_type for n in g.nodes] == ["Relu", "Sigmoid"]


def test_a_replacement_of_another_type_is_declined_banned_and_the_shorter_chains_come_forward():
    g = chain("Relu", "Relu", "Relu")
    produced = g.outputs[0].type
    out = apply_rules(g, [Rule("relus", Op("Relu").plus(), action=to_op("Shape"))])
    # 3 nodes keep 2 values inside: 2 * 2 * 32 / 3; 2 nodes: 2 * 32 / 2; one node keeps nothing: 0. A declined
    # match is banned, so the largest chains it held come forward: both pairs, then every single Relu.
    assert [(d.rule, d.verdict, d.nodes, d.kind, d.score) for d in out.decisions] == [
        ("relus", "refused", ("c0", "c1", "c2"), "rewrite", 128 / 3),
        ("relus", "refused", ("c0", "c1"), "rewrite", 32.0),
        ("relus", "refused", ("c1", "c2"), "rewrite", 32.0),
        ("relus", "refused", ("c0",), "rewrite", 0.0),
        ("relus", "refused", ("c1",), "rewrite", 0.0),
        ("relus", "refused", ("c2",), "rewrite", 0.0)]
    for d in out.decisions:
        assert d.reason.startswith("Shape infers ") and "int64" in d.reason
        assert d.reason.endswith(f", the match produced {produced}")
    assert [n.op_type for n in g.nodes] == ["Relu", "Relu", "Relu"]
    assert (out.stats["relus"].refused, out.stats["relus"].applied, out.rewrites) == (6, 0, 0)


def test_the_new_op_is_named_after_the_producer_of_the_replaced_output_not_the_last_node():
    # a = Relu(x); s = Sigmoid(a) (the output); d = Exp(a), read by no one, last in graph order
    b = GraphBuilder("dead")
    x = b.input("x", SHAPE)
    a = b.op("Relu", x, name="a")
    s = b.op("Sigmoid", a, name="s")
    b.op("Exp", a, name="d")
    g = b.build(s)
    assert [n.name for n in g.nodes] == ["a", "s", "d"]
    r = Rule("r", Op("Relu") >> par(Op("Sigmoid"), Op("Exp")), action=to_op("Neg"))
    (d,) = apply_rules(g, [r]).decisions
    assert (d.verdict, d.nodes, d.reason) == ("rewritten", ("a", "s", "d"), "replaced by Neg 's_neg'")


class _Clock:
    """A ``time`` stand-in whose ``perf_counter`` moves one second a call: every timed step counts 1."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def test_every_timed_step_of_a_rule_adds_to_its_seconds():
    # two chains a0 -> a1, b0 -> b1 rewritten one after the other. Timed steps: each offer round (3: the first,
    # and one after each rewrite), the condition and the score of each match offered (2 x 2), each rewrite (2)
    b = GraphBuilder("two")
    x = b.input("x", SHAPE)
    g = b.build(b.op("Sigmoid", b.op("Relu", x, name="a0"), name="a1"),
                b.op("Sigmoid", b.op("Relu", x, name="b0"), name="b1"))
    real = resolve.time
    resolve.time = _Clock()
    try:
        out = apply_rules(g, [Rule("r", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"))])
    finally:
        resolve.time = real
    assert out.rewrites == 2
    assert out.stats["r"].seconds == 3 + 2 * 2 + 2


def test_overlap_refusals_of_one_rule_come_in_graph_order():
    # a = Relu(x) read by six ops; "pair" matches a (kept) with each reader; "one" rewrites a alone and wins
    # (benefit 100), displacing all six pairs. The readers are made in the reverse of their graph order, so an order
    # by anything but graph position (node ids, sets) would show.
    b = GraphBuilder("fan")
    x = b.input("x", SHAPE)
    a = b.op("Relu", x, name="a")
    ops = ["Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Sqrt"]
    outs = [b.op(op, a, name=f"u{i}") for i, op in reversed(list(enumerate(ops)))]
    g = b.build(*reversed(outs))
    g.nodes[1:] = sorted(g.nodes[1:], key=lambda n: n.name)
    assert [n.name for n in g.nodes] == ["a", "u0", "u1", "u2", "u3", "u4", "u5"]
    one = Rule("one", Op("Relu"), action=to_op("Elu"), benefit=lambda m: 100.0)
    pair = Rule("pair", Op("Relu").keep() >> Op(*ops), action=to_op("Neg"))
    out = apply_rules(g, [pair, one])
    assert [(d.rule, d.verdict, d.nodes, d.kind) for d in out.decisions] == [
        ("one", "rewritten", ("a",), "")] + [("pair", "refused", ("a", f"u{i}"), "overlap") for i in range(6)]
    assert all(d.reason == "node 'a' was rewritten by rule 'one'" for d in out.decisions[1:])


def test_overlap_refusals_come_in_rule_order():
    # six rules each matching the Relu alone (score 0) wait while "w" (score 32) rewrites it with the Sigmoid
    g = chain("Relu", "Sigmoid")
    singles = [Rule(f"s{i}", Op("Relu"), action=to_op("Neg")) for i in range(6)]
    w = Rule("w", Op("Relu") >> Op("Sigmoid"), action=to_op("Abs"))
    out = apply_rules(g, [*singles, w])
    assert [(d.rule, d.verdict, d.kind) for d in out.decisions] == [("w", "rewritten", "")] + [
        (f"s{i}", "refused", "overlap") for i in range(6)]


def test_a_disabled_rule_records_each_match_once_also_after_a_rewrite_nearby():
    # c0 Relu -> c1 Sigmoid -> c2 Tanh: "st" rewrites c1, c2 into an Exp next to c0; the disabled "d" matches c0
    # before and the new Exp after
    g = chain("Relu", "Sigmoid", "Tanh")
    st = Rule("st", Op("Sigmoid") >> Op("Tanh"), action=to_op("Exp"))
    d = Rule("d", Op("Relu", "Exp"), action=to_op("Neg"))
    out = apply_rules(g, [st, d], disabled={"d"})
    assert [(x.rule, x.verdict, x.nodes, x.kind) for x in out.decisions] == [
        ("d", "refused", ("c0",), "disabled"), ("st", "rewritten", ("c1", "c2"), ""),
        ("d", "refused", ("c2_exp",), "disabled")]
    assert (out.stats["d"].matches, out.stats["d"].refused) == (2, 2)


def test_a_displaced_match_still_waiting_in_the_queue_does_not_stop_it():
    # "st" (priority 2) wins c1, c2 and displaces "rs" (c0, c1); rs's queue entry comes next, then "en" on
    # another branch, which must still be applied
    b = GraphBuilder("g")
    x = b.input("x", SHAPE)
    c = b.op("Tanh", b.op("Sigmoid", b.op("Relu", x, name="c0"), name="c1"), name="c2")
    e = b.op("Neg", b.op("Exp", x, name="e0"), name="e1")
    g = b.build(c, e)
    rs = Rule("rs", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"))
    st = Rule("st", Op("Sigmoid") >> Op("Tanh"), action=to_op("Abs"), priority=2)
    en = Rule("en", Op("Exp") >> Op("Neg"), action=to_op("Abs"))
    out = apply_rules(g, [rs, st, en])
    assert [(d.rule, d.verdict, d.nodes) for d in out.decisions] == [
        ("st", "rewritten", ("c1", "c2")), ("rs", "refused", ("c0", "c1")), ("en", "rewritten", ("e0", "e1"))]


def _exp_relu_sigmoid():
    b = GraphBuilder("g")
    x = b.input("x", SHAPE)
    return b.build(b.op("Sigmoid", b.op("Relu", b.op("Exp", x, name="c0"), name="c1"), name="c2"))


P = Rule("p", Op("Exp"), action=to_op("Relu"), benefit=lambda m: 100.0)


def test_a_match_outgrown_by_a_rewrite_is_refused_by_its_own_nodes():
    # p turns c0 into a Relu: relus' waiting match [c1] (score 0) is no longer maximal, [c0_relu, c1] (score 32)
    # is offered and wins; [c1] is refused as an overlap, named by its node though the rewrite removed it
    g = _exp_relu_sigmoid()
    out = apply_rules(g, [P, Rule("relus", Op("Relu").plus(), action=to_op("Neg"))])
    assert summary(out) == [
        ("p", "rewritten", ("c0",), "", "replaced by Relu 'c0_relu'", 100.0),
        ("relus", "rewritten", ("c0_relu", "c1"), "", "replaced by Neg 'c1_neg'", 32.0),
        ("relus", "refused", ("c1",), "overlap", "node 'c1' was rewritten by rule 'relus'", 0.0)]
    assert [n.op_type for n in g.nodes] == ["Neg", "Sigmoid"]


def test_an_outgrown_match_popped_first_is_skipped_and_the_queue_goes_on():
    # as above, but one Relu alone scores 10 and two 1 / 2: the outgrown [c1] leaves the queue first, unrecorded
    g = _exp_relu_sigmoid()
    relus = Rule("relus", Op("Relu").plus(), action=to_op("Neg"), benefit=lambda m: 10.0 if len(m.nodes) == 1 else 1.0)
    out = apply_rules(g, [P, relus])
    assert summary(out) == [
        ("p", "rewritten", ("c0",), "", "replaced by Relu 'c0_relu'", 100.0),
        ("relus", "rewritten", ("c0_relu", "c1"), "", "replaced by Neg 'c1_neg'", 0.5)]


def test_a_match_read_by_no_one_is_declined_with_the_reason():
    # d = Relu(x) is read by no one and is no graph output: a rewrite has no output of it to replace (its value,
    # read by nothing outside, counts as kept inside: 2 * 32 over 1 op)
    b = GraphBuilder("dead")
    x = b.input("x", SHAPE)
    b.op("Relu", x, name="d")
    g = b.build(b.op("Sigmoid", x, name="s"))
    out = apply_rules(g, [Rule("r", Op("Relu"), action=to_op("Neg"))])
    assert summary(out) == [("r", "refused", ("d",), "rewrite",
                             "a rewrite replaces exactly one escaping output; the match has none", 64.0)]
    assert [n.name for n in g.nodes] == ["d", "s"]


def test_an_outgrown_match_displaced_by_a_rewrite_taking_part_of_it_keeps_graph_order():
    # c0 Exp -> c1 Relu -> c2 Relu -> c3 Sigmoid. p (100) makes c0 a Relu; relus' waiting [c1, c2] (32) is outgrown
    # by [c0_relu, c1, c2] (2 * 2 * 32 / 3); pair (150 / 2 = 75; c2's output may escape) takes [c0_relu, c1] first
    # (before [c1, c2] by position), displacing both relus matches and its own [c1, c2]: the outgrown one is named
    # c1 (removed) then c2 (kept). Then relus rewrites c2 alone (its output read outside: score 0).
    b = GraphBuilder("g")
    x = b.input("x", SHAPE)
    g = b.build(b.op("Sigmoid", b.op("Relu", b.op("Relu", b.op("Exp", x, name="c0"), name="c1"), name="c2"),
                     name="c3"))
    relus = Rule("relus", Op("Relu").plus(), action=to_op("Neg"))
    pair = Rule("pair", Op("Relu") >> Op("Relu").keep(), action=to_op("Neg"), benefit=lambda m: 150.0)
    out = apply_rules(g, [P, relus, pair])
    assert summary(out) == [
        ("p", "rewritten", ("c0",), "", "replaced by Relu 'c0_relu'", 100.0),
        ("pair", "rewritten", ("c0_relu", "c1"), "", "replaced by Neg 'c1_neg'", 75.0),
        ("relus", "refused", ("c0_relu", "c1", "c2"), "overlap", "node 'c0_relu' was rewritten by rule 'pair'",
         128 / 3),
        ("relus", "refused", ("c1", "c2"), "overlap", "node 'c1' was rewritten by rule 'pair'", 32.0),
        ("pair", "refused", ("c1", "c2"), "overlap", "node 'c1' was rewritten by rule 'pair'", 75.0),
        ("relus", "rewritten", ("c2",), "", "replaced by Neg 'c2_neg'", 0.0)]
    assert [n.op_type for n in g.nodes] == ["Neg", "Neg", "Sigmoid"]


def test_equal_matches_go_by_graph_position_even_when_offered_later():
    # a0 Exp -> a1 Sigmoid and b0 Relu -> b1 Sigmoid: "r" waits on b; p makes a0 a Relu, and r's match on a
    # (offered after b's, the same score and size) goes first: it is earlier in the graph
    b = GraphBuilder("g")
    x = b.input("x", SHAPE)
    g = b.build(b.op("Sigmoid", b.op("Exp", x, name="a0"), name="a1"),
                b.op("Sigmoid", b.op("Relu", x, name="b0"), name="b1"))
    r = Rule("r", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"))
    out = apply_rules(g, [P, r])
    assert [(d.rule, d.verdict, d.nodes) for d in out.decisions] == [
        ("p", "rewritten", ("a0",)), ("r", "rewritten", ("a0_relu", "a1")), ("r", "rewritten", ("b0", "b1"))]


def test_a_one_node_graph_allows_four_rewrites():
    def again(m):
        return Replacement("Relu", [m.nodes[0].inputs[0]])
    with pytest.raises(ModelError, match="did not reach a fixed point after 5 rewrites"):
        apply_rules(chain("Relu"), [Rule("again", Op("Relu"), action=again)])


def test_a_working_set_over_the_budget_is_refused_and_the_single_ops_fit():
    # 3 Relus keep 2 values of 32 bytes inside, 2 keep one; a single op keeps none: only those fit 31 bytes
    g = chain("Relu", "Relu", "Relu")
    out = apply_rules(g, [Rule("relus", Op("Relu").plus(), action=to_op("Neg"))],
                      limits=FusionOptions(max_working_set_bytes=31))
    assert [(d.verdict, d.nodes, d.reason) for d in out.decisions] == [
        ("refused", ("c0", "c1", "c2"), "working set of 64 bytes exceeds the on-chip budget of 31 bytes"),
        ("refused", ("c0", "c1"), "working set of 32 bytes exceeds the on-chip budget of 31 bytes"),
        ("refused", ("c1", "c2"), "working set of 32 bytes exceeds the on-chip budget of 31 bytes"),
        ("rewritten", ("c0",), "replaced by Neg 'c0_neg'"), ("rewritten", ("c1",), "replaced by Neg 'c1_neg'"),
        ("rewritten", ("c2",), "replaced by Neg 'c2_neg'")]


def test_a_random_op_may_not_move_across_another():
    # with Exp counted as a random op: m0 Exp -> m2 Relu would move m0's draw past m1's (an Exp between them)
    b = GraphBuilder("rng")
    x = b.input("x", SHAPE)
    m0 = b.op("Exp", x, name="m0")
    m1 = b.op("Exp", x, name="m1")
    g = b.build(b.op("Relu", m0, name="m2"), m1)
    out = apply_rules(g, [Rule("rr", Op("Exp") >> Op("Relu"), action=to_op("Neg"))],
                      deps=DependencyRules(rng_ops=frozenset({"Exp"})))
    assert summary(out) == [("rr", "refused", ("m0", "m2"), "dependency",
                             "random op 'm0' would move across random op 'm1' and change the order of draws", 32.0)]
