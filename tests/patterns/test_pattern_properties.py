"""Property tests on random small DAGs: the matcher against a brute-force enumerator.

* sound and complete: the matcher's matches are exactly the brute force's;
* commutative inputs: swapping the operands of every Add/Mul changes no match;
* incremental matching: after nodes are taken or a node is rewritten, the maintained matches
  equal those of a fresh matcher.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opfuse.patterns import Matcher, Op, find_matches
from opfuse.patterns.match import Match
from opfuse.rules.rewrite import apply_replacement
from opfuse.rules.rule import Replacement

from pattern_brute_force import brute_force_matches
from pattern_random_graphs import UNARY, build, dag_specs, property_patterns

PATTERNS = property_patterns()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def names(matches) -> set[frozenset]:
    return {frozenset(n.name for n in m.nodes) for m in matches}


@pytest.mark.parametrize("name", sorted(PATTERNS))
@SETTINGS
@given(spec=dag_specs())
def test_matcher_equals_brute_force(name, spec):
    g = build(spec)
    pattern = PATTERNS[name]
    assert names(find_matches(g, pattern)) == brute_force_matches(g, pattern)


@pytest.mark.parametrize("name", ["elementwise_chain", "fan_in", "fan_out_sink", "chain_of_pairs", "star",
                                  "bounded_repeat", "chain_entry_slot"])
@SETTINGS
@given(spec=dag_specs(), cap=st.integers(1, 4))
def test_size_cap_equals_brute_force(name, spec, cap):
    """With ``max_nodes``, repetitions stop growing at the cap (fixed parts are not capped)."""
    g = build(spec)
    pattern = PATTERNS[name]
    got = names(Matcher(g, max_nodes=cap).matches(pattern))
    assert got == brute_force_matches(g, pattern, max_nodes=cap)


@SETTINGS
@given(spec=dag_specs())
def test_commuted_inputs_match_the_same(spec):
    g, swapped = build(spec), build(spec, swap_commutative=True)
    for name, pattern in PATTERNS.items():
        assert names(find_matches(g, pattern)) == names(find_matches(swapped, pattern)), name


# Incremental re-matching searches a region bounded by the largest possible match (repetitions
# capped at ``max_repeat``): larger graphs and a small cap exercise that bound.
LIMITS = [(2, None), (64, None), (64, 3)]   # (max_repeat, max_nodes)


@pytest.mark.parametrize("max_repeat, cap", LIMITS)
@SETTINGS
@given(spec=dag_specs(max_nodes=12), data=st.data())
def test_incremental_block_equals_fresh(max_repeat, cap, spec, data):
    g = build(spec)
    m = Matcher(g, max_repeat=max_repeat, max_nodes=cap)
    for p in PATTERNS.values():
        m.matches(p)
    taken = data.draw(st.lists(st.sampled_from(g.nodes), max_size=2, unique=True))
    m.block(taken)
    fresh = Matcher(g, max_repeat=max_repeat, max_nodes=cap)
    fresh.blocked = {id(n) for n in taken}
    for name, p in PATTERNS.items():
        assert names(m.matches(p)) == names(fresh.matches(p)), name
        assert all(id(n) not in fresh.blocked for mt in m.matches(p) for n in mt.nodes)


@pytest.mark.parametrize("max_repeat, cap", LIMITS)
@SETTINGS
@given(spec=dag_specs(max_nodes=12), data=st.data())
def test_incremental_rewrite_equals_fresh(max_repeat, cap, spec, data):
    g = build(spec)
    m = Matcher(g, max_repeat=max_repeat, max_nodes=cap)
    for p in PATTERNS.values():
        m.matches(p)
    outs = {id(v) for v in g.outputs}
    unary = [n for n in g.nodes if n.op_type in UNARY and (n.outputs[0].uses or id(n.outputs[0]) in outs)]
    if not unary:
        return
    victim = data.draw(st.sampled_from(unary))
    new_op = data.draw(st.sampled_from([u for u in UNARY if u != victim.op_type]))
    one = Match(Op(victim.op_type), (victim,), graph=g)
    done = apply_replacement(g, one, Replacement(new_op, [victim.inputs[0]]), m.pos, "swapped")
    assert not isinstance(done, str)
    g.verify()
    m.update(added=[done.node], removed=done.removed, touched=done.touched,
             positions={id(done.node): done.position})
    fresh = Matcher(g, max_repeat=max_repeat, max_nodes=cap)
    for name, p in PATTERNS.items():
        assert names(m.matches(p)) == names(fresh.matches(p)), name


@pytest.mark.parametrize("name", ["elementwise_chain", "fan_in", "optional", "chain_of_pairs", "star"])
@SETTINGS
@given(spec=dag_specs(), data=st.data())
def test_ban_exposes_the_next_largest(name, spec, data):
    """After maximal matches are banned, the matches are the maximal ones among the rest."""
    g = build(spec)
    p = PATTERNS[name]
    m = Matcher(g)
    banned = []
    for _ in range(2):
        current = m.matches(p)
        if not current:
            break
        victim = data.draw(st.sampled_from(current))
        # the whole match, or a few of its nodes as the culprits
        culprits = data.draw(st.lists(st.sampled_from(victim.nodes), min_size=1, unique=True) | st.none())
        m.ban(p, victim, culprits)
        banned.append(frozenset(n.name for n in (victim.nodes if culprits is None else culprits)))
    assert names(m.matches(p)) == brute_force_matches(g, p, banned)
