"""The memory plan's own soundness check, its report and its constants, against expectations
worked out by hand (mutation testing found each of these unchecked; see tests/MUTATION.md).

``MemoryPlan.conflicts()`` is the oracle of the plan tests in tests/memory, tests/codegen and
tests/e2e: a check that reports nothing passes them all, so here it is given plans that are wrong
on purpose and must say so.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cg_support import group_by_names
from opfuse.ir.plan import FusionPlan
from opfuse.memory import plan_memory
from opfuse.memory.plan import Alias, Location, MemoryPlan
from opfuse.memory.static import static_values
from opfuse.ops import GraphBuilder


def _hand_plan(values: dict[str, tuple[int, int, int, int]], aliases=(), arena: int | None = None) -> MemoryPlan:
    """A plan of arena tensors ``name -> (offset, nbytes, first kernel, last kernel)``, as given."""
    graph = SimpleNamespace(values={n: SimpleNamespace(nbytes=size) for n, (_, size, _, _) in values.items()})
    top = max((off + size for off, size, _, _ in values.values()), default=0)
    return MemoryPlan(graph, None, {}, {n: Location("arena", 0, off) for n, (off, _, _, _) in values.items()},
                      {n: (s, e) for n, (_, _, s, e) in values.items()},
                      {n: (off, size, s, e) for n, (off, size, s, e) in values.items()},
                      {n: n for n in values}, list(aliases), top if arena is None else arena, 0)


def test_disjoint_bytes_or_disjoint_times_are_sound():
    assert _hand_plan({"a": (0, 64, 0, 2), "b": (64, 64, 0, 2)}).conflicts() == []
    assert _hand_plan({"a": (0, 64, 0, 1), "b": (0, 64, 2, 3)}).conflicts() == []


@pytest.mark.parametrize("first, second", [((0, 2), (2, 4)), ((2, 4), (0, 2)), ((0, 4), (1, 2))])
def test_shared_bytes_while_both_live_are_reported(first, second):
    """Two tensors on the same bytes and both live at kernel 2 (touching or nested lives)."""
    problems = _hand_plan({"a": (0, 64, *first), "b": (0, 128, *second)}).conflicts()
    assert len(problems) == 1
    assert "'a'" in problems[0] and "'b'" in problems[0] and "overlap" in problems[0]


def test_every_pair_is_checked_not_only_neighbours():
    # a and c clash; b, between them by name, clashes with neither (other bytes, or another time).
    by_bytes = _hand_plan({"a": (0, 64, 0, 1), "b": (64, 64, 0, 1), "c": (0, 64, 0, 1)}).conflicts()
    by_time = _hand_plan({"a": (0, 64, 0, 0), "b": (0, 64, 2, 2), "c": (0, 64, 0, 0)}).conflicts()
    for problems in (by_bytes, by_time):
        assert len(problems) == 1 and "'a'" in problems[0] and "'c'" in problems[0]


def test_an_inplace_handoff_is_sound_only_between_its_own_pair_at_one_kernel():
    handoff = {"a": (0, 64, 0, 2), "b": (0, 64, 2, 4)}
    assert _hand_plan(handoff, [Alias("b", "a", 0, "inplace")]).conflicts() == []
    # The pair shares two kernels: not a hand-off.
    assert len(_hand_plan({"a": (0, 64, 0, 3), "b": (0, 64, 2, 4)},
                          [Alias("b", "a", 0, "inplace")]).conflicts()) == 1
    # b lives only at kernel 3, inside a's life: a still lives after b was written over it.
    assert len(_hand_plan({"a": (0, 64, 1, 5), "b": (0, 64, 3, 3)},
                          [Alias("b", "a", 0, "inplace")]).conflicts()) == 1
    # An in-place alias between two other tensors does not excuse a and b.
    other = {**handoff, "c": (64, 64, 0, 1), "d": (64, 64, 1, 2)}
    problems = _hand_plan(other, [Alias("d", "c", 64, "inplace")]).conflicts()
    assert len(problems) == 1 and "'a'" in problems[0] and "'b'" in problems[0]


@pytest.mark.parametrize("kind", ["view", "concat"])
def test_views_and_concat_inputs_are_the_bytes_they_lie_in(kind):
    # x is written into the first half of cat by its producer (kernel 0) and read by kernel 1.
    mem = _hand_plan({"cat": (0, 128, 1, 3), "x": (0, 64, 0, 1)}, [Alias("x", "cat", 0, kind)])
    assert mem.conflicts() == []


def test_a_block_off_the_alignment_is_reported():
    problems = _hand_plan({"a": (0, 64, 0, 1), "b": (96, 32, 0, 1)}).conflicts()
    assert problems == ["block 'b' at offset 96 is not 64-byte aligned"]


def test_a_tensor_past_the_arena_is_reported():
    problems = _hand_plan({"a": (0, 128, 0, 1)}, arena=64).conflicts()
    assert len(problems) == 1 and "past the arena" in problems[0] and "128" in problems[0]


def _tiny(shape=(1, 3)):
    """x -> Relu -> Neg -> y: one arena tensor (the Relu's), 12 bytes at (1, 3)."""
    b = GraphBuilder("tiny")
    x = b.input("x", shape)
    return b.build(b.op("Neg", b.op("Relu", x, name="relu"), name="neg"))


def test_report_of_a_plan_worked_out_by_hand():
    mem = plan_memory(FusionPlan.unfused(_tiny()))
    # One 12-byte float tensor in the arena, aligned to 64 bytes; live alone, so the bound is 12.
    assert mem.report() == {"arena_bytes": 64, "arena_lower_bound_bytes": 12, "arena_ratio": 5.3333,
                            "arena_unshared_bytes": 12, "arena_values": 1,
                            "views": 0, "concat_aliases": 0, "inplace": 0}


def test_report_of_a_plan_without_arena():
    b = GraphBuilder("one")
    g = b.build(b.op("Relu", b.input("x", (2, 2)), name="relu"))
    r = plan_memory(FusionPlan.unfused(g)).report()
    assert (r["arena_bytes"], r["arena_lower_bound_bytes"], r["arena_ratio"], r["arena_values"]) == (0, 0, 1.0, 0)


def test_summary_in_megabytes():
    # a = Relu(x) and n = Neg(a) are both live at the Add: 2 x 1.5 MiB, no reuse possible.
    b = GraphBuilder("mb")
    x = b.input("x", (1, 3 << 17))  # 1.5 MiB of float32
    a = b.op("Relu", x, name="relu")
    g = b.build(b.op("Add", a, b.op("Neg", a, name="neg"), name="add"))
    mem = plan_memory(FusionPlan.unfused(g))
    assert mem.summary() == "memory reduced from 3.00 MB -> 3.00 MB (lower bound 3.00 MB, ratio 1.000)"


def test_a_static_value_is_located_in_the_weights():
    b = GraphBuilder("static")
    x = b.input("x", (2, 3))
    two = b.op("Add", b.const("one", np.ones((2, 3), np.float32)), b.const("k", np.float32(1)), name="two")
    g = b.build(b.op("Mul", x, two, name="mul"))
    mem = plan_memory(FusionPlan.unfused(g))
    assert mem.location(g.values["two"]) == Location("static")
    assert mem.location(g.values["x"]) == Location("input", 0, 0)


def test_nodes_of_constants_are_folded_exactly_in_their_dtype():
    """Every node whose inputs are all constants is computed at build time, in its own dtype (int64
    above 2**53 stays exact), wherever it sits in the graph; a node reading data is not."""
    big = np.array([2**62 + 1, -(2**60) - 3], np.int64)
    b = GraphBuilder("fold")
    x = b.input("x", (2,), "int64")
    early = b.op("Add", x, b.const("one", np.int64(1)), name="early")  # reads data: not static
    s = b.op("Add", b.const("big", big), b.const("z", np.int64(0)), name="sum")
    neg = b.op("Neg", s, name="neg")
    g = b.build(b.op("Add", early, neg, name="out"))
    static = static_values(g)
    assert id(g.values["early"]) not in static and id(g.values["out"]) not in static
    for name, want in (("sum", big), ("neg", -big)):
        got = static[id(g.values[name])]
        assert got.dtype == np.int64 and np.array_equal(got, want), name


def test_a_view_of_a_graph_input_or_output_lies_in_the_callers_buffer():
    b = GraphBuilder("views")
    x = b.input("x", (2, 6))
    y = b.op("Relu", x, name="relu")
    rx = b.op("Reshape", x, b.const("s", np.array([3, 4], np.int64)), name="rx")
    ry = b.op("Reshape", y, b.const("s2", np.array([12], np.int64)), name="ry")
    g = b.build(y, b.op("Neg", rx, name="nx"), b.op("Sigmoid", ry, name="sy"))
    for inplace in (True, False):  # views do not depend on in-place writes being allowed
        mem = plan_memory(FusionPlan.unfused(g), inplace=inplace)
        assert mem.location(rx) == Location("input", 0, 0)
        assert mem.location(ry) == Location("output", 0, 0)
        assert {(a.value, a.base, a.offset, a.kind) for a in mem.aliases} == {("rx", "x", 0, "view"),
                                                                              ("ry", "relu", 0, "view")}


def _concat_offsets(shapes, axis):
    """Byte offsets, from the Concat output's, of its inputs' bytes (aliased Concat group)."""
    b = GraphBuilder("cat")
    parts = [b.op(op, b.input(f"x{i}", s), name=f"p{i}")
             for i, (op, s) in enumerate(zip(["Relu", "Neg", "Sigmoid"], shapes, strict=False))]
    g = b.build(b.op("Tanh", b.op("Concat", *parts, axis=axis, name="cat"), name="out"))
    mem = plan_memory(group_by_names(g, [("concat", ["cat"])]))
    base = mem.location(g.values["cat"]).offset
    return [mem.location(p).offset - base for p in parts], mem.report()["concat_aliases"]


def test_concat_inputs_lie_at_their_slices_on_any_axis():
    # Along axis 0 every slice is contiguous: 1, 2 and 4 rows of 3 floats.
    assert _concat_offsets([(1, 3), (2, 3), (4, 3)], 0) == ([0, 12, 36], 3)
    # The last axis, counted from the end, after unit axes: 3 then 5 floats.
    assert _concat_offsets([(1, 3), (1, 5)], -1) == ([0, 12], 2)


def _split_offsets(shape, split, **axis):
    b = GraphBuilder("split")
    x = b.op("Relu", b.input("x", shape), name="relu")
    parts = b.op("Split", x, split=split, num_outputs=len(split), name="split", **axis)
    g = b.build(*[b.op("Neg", p, name=f"n{i}") for i, p in enumerate(parts)])
    mem = plan_memory(FusionPlan.unfused(g))
    return [mem.location(p).offset - mem.location(x).offset for p in parts]


def test_split_outputs_are_views_at_their_slices():
    assert _split_offsets((6, 2), [1, 2, 3]) == [0, 8, 24]  # no axis attribute: axis 0
    assert _split_offsets((1, 6), [2, 4], axis=-1) == [0, 8]


def test_concat_aliasing_skips_what_cannot_move_and_keeps_the_rest(tmp_path):
    """x is the caller's, a is also a graph output (it stays in the caller's buffer) and d is read
    twice (one value cannot lie at two slices): only c is written into its slice; the C code
    copies the others and matches the reference."""
    from opfuse.runtime.native import build
    from opfuse.runtime.reference import random_inputs, run

    b = GraphBuilder("cat_skip")
    x = b.input("x", (1, 2))
    a = b.op("Relu", b.input("x1", (1, 2)), name="a")
    c = b.op("Neg", b.input("x2", (1, 2)), name="c")
    d = b.op("Sigmoid", b.input("x3", (1, 2)), name="d")
    k = b.op("Add", b.const("k1", np.ones((1, 2), np.float32)), b.const("k2", np.float32(2)), name="k")
    g = b.build(b.op("Tanh", b.op("Concat", x, a, c, d, d, k, axis=1, name="cat"), name="out"), a)
    by = {n.name: n for n in g.nodes}
    plan = group_by_names(g, [("concat", ["k", "cat"])])  # a static node in the group changes nothing
    for kind, attrs in (("concat", {}), ("single", {"alias_inputs": ["c"]})):  # kind or attribute
        for grp in plan.groups:
            if by["cat"] in grp.nodes:
                grp.kind, grp.attrs = kind, attrs
        mem = plan_memory(plan)
        assert {(al.value, al.offset - mem.location(g.values["cat"]).offset) for al in mem.aliases
                if al.kind == "concat"} == {("c", 16)}
        assert mem.location(a).region == "output"
        feeds = random_inputs(g, 0)
        got, want = build(g, plan, memory=mem, cache_dir=tmp_path).run(feeds), run(g, feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)


def test_a_node_of_constants_with_an_omitted_optional_input_is_folded():
    b = GraphBuilder("clip")
    x = b.input("x", (3,))
    c = b.op("Clip", b.const("c", np.array([-2.0, 0.5, 7.0], np.float32)), None, b.const("hi", np.float32(1.0)),
             name="clip")
    g = b.build(b.op("Add", x, c, name="add"))
    np.testing.assert_array_equal(static_values(g)[id(g.values["clip"])], np.array([-2.0, 0.5, 1.0], np.float32))


def test_a_group_with_a_folded_output_before_a_live_one_places_both():
    b = GraphBuilder("folded_first")
    k = b.op("Neg", b.const("k0", np.ones((2, 3), np.float32)), name="k")  # folded; also a graph output
    add = b.op("Add", b.input("x", (2, 3)), k, name="add")
    g = b.build(k, b.op("Relu", add, name="relu"))
    plan = group_by_names(g, [("elementwise", ["k", "add"])])
    assert [v.name for v in next(grp for grp in plan.groups if len(grp.nodes) == 2).outputs(g)] == ["k", "add"]
    mem = plan_memory(plan)
    assert mem.location(k) == Location("static")
    assert mem.location(add).region == "arena" and mem.lifetimes["add"] == (0, 1)


def test_a_view_group_with_a_folded_node_is_still_a_view():
    b = GraphBuilder("folded_view")
    r = b.op("Relu", b.input("x", (2, 3)), name="relu")
    k = b.op("Neg", b.const("k0", np.ones((6,), np.float32)), name="k")  # folded at build time
    rs = b.op("Reshape", r, b.const("s", np.array([6], np.int64)), name="rs")
    g = b.build(b.op("Add", rs, k, name="add"))
    mem = plan_memory(group_by_names(g, [("injective", ["k", "rs"])]))
    assert mem.location(rs) == mem.location(r)
    assert [(a.value, a.kind) for a in mem.aliases if a.kind == "view"] == [("rs", "view")]
