"""``rules.plan_check.verify_plan`` on plans broken on purpose, one invariant of its docstring at a time, with the
exact messages (a group that is no legal kernel, a kind recorded wrong, a stale boundary, horizontal members that
do not partition the group, are no legal kernels, do not read the shared input or reach one another). Found by
mutation testing (tests/MUTATION.md)."""
from __future__ import annotations

import copy

import pytest

from opfuse.errors import ModelError
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.rules.plan_check import verify_plan
from fusion_cases import plan_of, randn


def _plan():
    """conv -> relu (epilogue); relu read by MaxPool mp and AveragePool ap (one horizontal pass, each with its
    elementwise epilogue e1 / e2); Concat of e1, e2 (aliased, elided); Sigmoid out."""
    b = GraphBuilder("h")
    x = b.input("x", (1, 2, 4, 4))
    c = b.op("Relu", b.op("Conv", x, b.const("w", randn((2, 2, 1, 1))), name="conv"), name="relu")
    mp = b.op("MaxPool", c, kernel_shape=[2, 2], name="mp")
    ap = b.op("AveragePool", c, kernel_shape=[2, 2], name="ap")
    cat = b.op("Concat", b.op("Exp", mp, name="e1"), b.op("Neg", ap, name="e2"), axis=1, name="cat")
    plan, _ = plan_of(b.build(b.op("Sigmoid", cat, name="out")))
    assert [(g.name, g.kind) for g in plan.groups] == [("conv", "conv_epilogue"), ("mp", "horizontal"),
                                                      ("cat", "concat"), ("out", "single")]
    return plan


def _group(plan, name):
    return next(g for g in plan.groups if g.name == name)


def test_the_plan_as_formed_passes():
    verify_plan(_plan())


def test_a_kind_recorded_wrong_or_an_illegal_group_is_named():
    plan = _plan()
    _group(plan, "conv").kind = "elementwise"
    with pytest.raises(ModelError) as e:
        verify_plan(plan)
    assert str(e.value) == "fusion group 'conv' is recorded as elementwise but is conv_epilogue"
    plan = _plan()
    _group(plan, "out").kind = "elementwise"
    with pytest.raises(ModelError, match="fusion group 'out' is recorded as elementwise but is single"):
        verify_plan(plan)
    # a Concat recorded as concat is a single op underneath
    plan = _plan()
    assert _group(plan, "cat").kind == "concat"
    verify_plan(plan)
    # an illegal group: Conv and the pooling after it in one group
    plan = _plan()
    conv, hz = _group(plan, "conv"), _group(plan, "mp")
    g = plan.graph
    merged = FusionGroup("conv", conv.nodes + [g.node("mp")], "conv_epilogue", conv.anchor, dict(conv.attrs))
    rest = FusionGroup("ap", [g.node("ap"), g.node("e1"), g.node("e2")], "reduction", g.node("ap"), {})
    plan2 = FusionPlan(g, [merged, rest] + [x for x in plan.groups if x not in (conv, hz)])
    with pytest.raises(ModelError, match=r"^fusion group 'conv' \(conv_epilogue\) is not a legal kernel: "):
        verify_plan(plan2)


def test_a_stale_boundary_is_named_with_both_sides():
    plan = _plan()
    _group(plan, "out").attrs["inputs"] = ["e1"]
    with pytest.raises(ModelError) as e:
        verify_plan(plan)
    assert str(e.value) == "fusion group 'out' boundary is stale: recorded ['e1'] -> ['out'], actual ['cat'] -> ['out']"
    plan = _plan()
    _group(plan, "conv").attrs["outputs"] = []
    with pytest.raises(ModelError) as e:
        verify_plan(plan)
    assert str(e.value) == "fusion group 'conv' boundary is stale: recorded ['x', 'w'] -> [], actual ['x', 'w'] -> " \
                           "['relu']"
    plan = _plan()
    del _group(plan, "cat").attrs["outputs"]
    with pytest.raises(ModelError, match="fusion group 'cat' boundary is stale: recorded"):
        verify_plan(plan)
    plan = _plan()
    del _group(plan, "mp").attrs["inputs"]   # checked for horizontal groups too
    with pytest.raises(ModelError, match="fusion group 'mp' boundary is stale: recorded None"):
        verify_plan(plan)


def test_horizontal_members_must_partition_the_group():
    for members in ([["mp", "e1"]], [["mp", "e1"], ["ap", "e2"], ["e2"]], [["mp", "e1", "e1"], ["ap", "e2"]],
                    [["mp", "e1"], ["ap", "e2", "out"]]):
        plan = _plan()
        _group(plan, "mp").attrs["members"] = members
        with pytest.raises(ModelError) as e:
            verify_plan(plan)
        assert str(e.value) == f"horizontal group 'mp': members {members} do not partition its nodes"
    plan = _plan()
    del _group(plan, "mp").attrs["members"]
    with pytest.raises(ModelError, match=r"horizontal group 'mp': members \[\] do not partition its nodes"):
        verify_plan(plan)
    plan = _plan()
    _group(plan, "mp").attrs["members"] = [["e1", "mp"], ["e2", "ap"]]   # order inside a member is free
    verify_plan(plan)


def test_horizontal_members_must_be_legal_kernels_reading_the_shared_input():
    plan = _plan()
    _group(plan, "mp").attrs["members"] = [["mp", "e1", "ap"], ["e2"]]
    with pytest.raises(ModelError, match=r"^horizontal group 'mp': member \['mp', 'e1', 'ap'\] is not a legal "
                                         r"kernel: "):
        verify_plan(plan)
    plan = _plan()
    _group(plan, "mp").attrs["shared_input"] = "x"
    with pytest.raises(ModelError) as e:
        verify_plan(plan)
    assert str(e.value) == "horizontal group 'mp': member ['mp', 'e1'] does not read 'x'"
    plan = _plan()
    _group(plan, "mp").attrs["members"] = [["mp"], ["e1"], ["ap", "e2"]]
    with pytest.raises(ModelError) as e:
        verify_plan(plan)
    assert str(e.value) == "horizontal group 'mp': member ['e1'] does not read 'relu'"


def test_horizontal_members_must_not_reach_one_another():
    # two readers of x where one reads the other: a horizontal group recorded over them is refused
    b = GraphBuilder("reach")
    x = b.input("x", (4,))
    r = b.op("Relu", x, name="r")
    a = b.op("Add", x, r, name="a")
    g = b.build(a)
    grp = FusionGroup("r", [g.node("r"), g.node("a")], "horizontal", g.node("r"),
                      {"members": [["r"], ["a"]], "shared_input": "x", "inputs": ["x"], "outputs": ["a"]})
    with pytest.raises(ModelError) as e:
        verify_plan(FusionPlan(g, [grp]))
    assert str(e.value) == "horizontal group 'r': member ['r'] reaches member ['a']"
    grp2 = copy.copy(grp)
    grp2.attrs = dict(grp.attrs, members=[["a"], ["r"]])
    with pytest.raises(ModelError) as e:
        verify_plan(FusionPlan(g, [grp2]))
    assert str(e.value) == "horizontal group 'r': member ['r'] reaches member ['a']"


def test_structure_is_checked_first():
    plan = _plan()
    plan.groups.reverse()
    with pytest.raises(ModelError):
        verify_plan(plan)
