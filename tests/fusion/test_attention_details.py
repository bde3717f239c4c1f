"""The attention group (``rules.attention``) part by part, each expectation worked out by hand from the module's
docstring (the seed's BERT case, 7.4.4: scores MatMul, scale/mask chain, Softmax over the key axis, PV MatMul,
data movement before it as prologue, relabelling moves after it as epilogue) and its exact refusal texts. Found
by mutation testing (tests/MUTATION.md)."""
from __future__ import annotations

import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.rules.attention import attention_structure, find_attention, score_chain
from opfuse.rules.decisions import Refusal
from fusion_cases import plan_of, randn, refusals

SEQ, HEADS, DIM = 4, 2, 3
PROLOGUE = ["split", "rq", "tq", "rk", "tk", "rv", "tv"]
CORE = ["qk", "div", "add", "sm", "pv"]


def attention(*, after_pv=("Transpose", "Reshape"), extra_reader=None, output_too=None, mask=True, axis=-1):
    """x -> proj (MatMul) -> split (Split in q, k, v) -> r* (Reshape to heads) -> t* (Transpose);
    qk = MatMul(tq, tk); div = qk / sqrt(DIM); add = div + mask; sm = Softmax; pv = MatMul(sm, tv); then
    ``after_pv`` (tm: Transpose to (1, SEQ, HEADS, DIM), merge: Reshape to (1, SEQ, HEADS * DIM), or a Slice).
    ``extra_reader`` names a node whose output a Neg 'extra' also reads (a graph output);
    ``output_too`` names a node whose output is also a graph output."""
    b = GraphBuilder("att")
    x = b.input("x", (1, SEQ, HEADS * DIM))
    proj = b.op("MatMul", x, b.const("w", randn((HEADS * DIM, 3 * HEADS * DIM))), name="proj")
    q, k, v = b.op("Split", proj, axis=2, split=[HEADS * DIM] * 3, num_outputs=3, name="split")
    heads = b.const("heads", np.array([1, SEQ, HEADS, DIM]))
    tq = b.op("Transpose", b.op("Reshape", q, heads, name="rq"), perm=[0, 2, 1, 3], name="tq")
    tk = b.op("Transpose", b.op("Reshape", k, heads, name="rk"), perm=[0, 2, 3, 1], name="tk")
    tv = b.op("Transpose", b.op("Reshape", v, heads, name="rv"), perm=[0, 2, 1, 3], name="tv")
    s = b.op("Div", b.op("MatMul", tq, tk, name="qk"), b.const("scale", np.float32(np.sqrt(DIM))), name="div")
    if mask:
        s = b.op("Add", s, b.input("mask", (1, 1, 1, SEQ)), name="add")
    y = b.op("MatMul", b.op("Softmax", s, axis=axis, name="sm"), tv, name="pv")
    for op in after_pv:
        if op == "Transpose":
            y = b.op("Transpose", y, perm=[0, 2, 1, 3], name="tm")
        elif op == "Reshape":
            y = b.op("Reshape", y, b.const("merge_shape", np.array([1, SEQ, HEADS * DIM])), name="merge")
        else:
            y = b.op("Slice", y, b.const("st", np.array([0])), b.const("en", np.array([1])),
                     b.const("ax", np.array([3])), name="slice")
    outs = [y]
    if extra_reader is not None:
        outs.append(b.op("Neg", b.graph.node(extra_reader).outputs[0], name="extra"))
    if output_too is not None:
        outs.append(b.graph.node(output_too).outputs[0])
    return b.build(*outs)


def _names(nodes):
    return [n.name for n in nodes]


def _reason(r):
    assert isinstance(r, Refusal)
    return r.kind.value, r.reason


def test_the_whole_attention_and_its_parts():
    g = attention()
    nodes = find_attention(g, g.node("sm"))
    assert _names(nodes) == ["split", "rq", "tq", "rk", "tk", "rv", "tv", "qk", "div", "add", "sm", "pv", "tm",
                             "merge"]
    got = attention_structure(nodes, g)
    assert got == {"qk": g.node("qk"), "scale_ops": ["div", "add"], "softmax": "sm", "pv": "pv",
                   "prologue": PROLOGUE, "epilogue": ["tm", "merge"], "q": "tq", "k": "tk", "v": "tv"}
    # with the order and the outputs given, the same set
    order = {id(n): i for i, n in enumerate(g.nodes)}
    assert find_attention(g, g.node("sm"), order, frozenset(id(v) for v in g.outputs)) == nodes
    # the rule groups exactly that
    plan, _ = plan_of(g)
    (att,) = [grp for grp in plan.groups if grp.kind == "attention"]
    assert _names(att.nodes) == _names(nodes)


def test_score_chain_walks_back_through_the_scale_and_mask():
    g = attention()
    assert score_chain(g.node("sm"), g) == (g.node("qk"), [g.node("div"), g.node("add")])
    ids = {id(g.node(n)) for n in ("qk", "div", "add", "sm")}
    assert score_chain(g.node("sm"), g, ids) == (g.node("qk"), [g.node("div"), g.node("add")])
    ids.discard(id(g.node("qk")))
    assert _reason(score_chain(g.node("sm"), g, ids)) == ("condition", "Softmax 'sm' input is not a MatMul's scores")
    g = attention(mask=False)
    assert score_chain(g.node("sm"), g) == (g.node("qk"), [g.node("div")])


def _softmax_of(*ops):
    """x (2, 4, 4) -> ops... -> Softmax 'sm' -> MatMul 'pv' with v."""
    b = GraphBuilder("s")
    x = b.input("x", (2, 4, 4))
    y = x
    for op in ops:
        if op == "MatMul":
            y = b.op("MatMul", y, b.input("kt", (2, 4, 4)), name="mm")
        elif op == "Transpose":
            y = b.op("Transpose", y, perm=[0, 2, 1], name="t")
        elif op == "AddSmall":   # the scores plus a computed, narrower mask: the walk follows the wider operand
            y = b.op("Add", b.op("Relu", b.input("m", (1, 1, 4)), name="mask"), y, name="addm")
        else:
            y = b.op(op, y, name=op.lower())
    sm = b.op("Softmax", y, axis=-1, name="sm")
    return b.build(b.op("MatMul", sm, b.input("v", (2, 4, 3)), name="pv"))


def test_score_chain_refusals_and_the_widest_operand():
    g = _softmax_of("MatMul", "AddSmall", "Relu")
    assert score_chain(g.node("sm"), g) == (g.node("mm"), [g.node("addm"), g.node("relu")])
    g = _softmax_of("MatMul", "Transpose", "Relu")
    assert _reason(score_chain(g.node("sm"), g)) == \
        ("condition", "'t' (Transpose) between the scores and Softmax 'sm' is not elementwise")
    g = _softmax_of()
    assert _reason(score_chain(g.node("sm"), g)) == ("condition", "Softmax 'sm' input is not a MatMul's scores")
    g = _softmax_of("Relu")    # an elementwise op of a graph input only
    assert _reason(score_chain(g.node("sm"), g)) == ("condition", "Softmax 'sm' input is not a MatMul's scores")
    assert _reason(find_attention(g, g.node("sm"))) == \
        ("condition", "Softmax 'sm' input is not a MatMul's scores")


def test_a_softmax_must_feed_one_matmul_as_its_a_operand():
    b = GraphBuilder("two")
    x = b.input("x", (2, 4, 4))
    sm = b.op("Softmax", b.op("MatMul", x, b.input("kt", (2, 4, 4)), name="mm"), axis=-1, name="sm")
    g = b.build(b.op("MatMul", sm, b.input("v", (2, 4, 3)), name="pv1"),
                b.op("MatMul", sm, b.input("v2", (2, 4, 3)), name="pv2"))
    assert _reason(find_attention(g, g.node("sm"))) == ("condition", "Softmax 'sm' does not feed one MatMul")
    nodes = [g.node(n) for n in ("mm", "sm", "pv1")]
    assert _reason(attention_structure(nodes, g)) == \
        ("condition", "the probabilities of Softmax 'sm' must feed exactly one MatMul as A")
    b = GraphBuilder("as_b")
    x = b.input("x", (2, 4, 4))
    sm = b.op("Softmax", b.op("MatMul", x, b.input("kt", (2, 4, 4)), name="mm"), axis=-1, name="sm")
    g = b.build(b.op("MatMul", b.input("v", (2, 4, 4)), sm, name="pv"))
    assert _reason(find_attention(g, g.node("sm"))) == ("condition", "Softmax 'sm' does not feed one MatMul")
    assert _reason(attention_structure([g.node(n) for n in ("mm", "sm", "pv")], g)) == \
        ("condition", "the probabilities of Softmax 'sm' must feed exactly one MatMul as A")


def test_attention_structure_refusals():
    g = attention()
    whole = find_attention(g, g.node("sm"))
    # two Softmaxes, or none
    assert _reason(attention_structure([n for n in whole if n.op_type != "Softmax"], g)) == \
        ("category", "two MatMuls share a kernel only around one Softmax (attention)")
    # Softmax over another axis
    g2 = attention(axis=2)
    assert _reason(attention_structure(find_attention(g2, g2.node("sm")), g2)) == \
        ("condition", "Softmax 'sm' is not over the last (key) axis")
    g2 = attention(axis=3)
    assert isinstance(attention_structure(find_attention(g2, g2.node("sm")), g2), dict)
    # the probabilities read outside
    g2 = attention(output_too="sm")
    assert _reason(attention_structure([g2.node(n.name) for n in whole], g2)) == \
        ("condition", "the probabilities of Softmax 'sm' must feed exactly one MatMul as A")
    # scores read outside: the MatMul's and the scaled ones
    for name in ("qk", "div", "add"):
        g2 = attention(extra_reader=name)
        assert _reason(attention_structure([g2.node(n.name) for n in whole], g2)) == \
            ("condition", f"the scores '{name}' are also read outside the attention kernel")
        g2 = attention(output_too=name)
        assert _reason(attention_structure([g2.node(n.name) for n in whole], g2)) == \
            ("condition", f"the scores '{name}' are also read outside the attention kernel")
    # a prologue value read outside
    g2 = attention(extra_reader="rk")
    assert _reason(attention_structure([g2.node(n.name) for n in whole], g2)) == \
        ("condition", "prologue value of 'rk' is also read outside the attention kernel")
    g2 = attention(output_too="tv")
    assert _reason(attention_structure([g2.node(n.name) for n in whole], g2)) == \
        ("condition", "prologue value of 'tv' is also read outside the attention kernel")
    # an op that is not data movement around the core
    g2 = attention()
    assert _reason(attention_structure([g2.node("proj")] + [g2.node(n.name) for n in whole], g2)) == \
        ("category", "'proj' (MatMul) is not data movement: only index maps surround attention")
    # the output read before the head merge is complete
    for name in ("pv", "tm"):
        g2 = attention(output_too=name)
        assert _reason(attention_structure([g2.node(n.name) for n in whole], g2)) == \
            ("condition", f"'{name}' is read outside before the head merge is complete")
    # the last value of the chain is the kernel's output: reading it outside is fine
    g2 = attention(extra_reader="merge")
    assert isinstance(attention_structure([g2.node(n.name) for n in whole], g2), dict)


def test_only_relabelling_moves_finish_an_attention_kernel():
    g = attention(after_pv=("Slice",))
    nodes = find_attention(g, g.node("sm"))
    assert _names(nodes) == PROLOGUE + CORE      # the Slice is not taken
    assert attention_structure(nodes, g)["epilogue"] == []
    assert _reason(attention_structure(nodes + [g.node("slice")], g)) == \
        ("category", "'slice' (Slice) after the attention output does not relabel elements: only "
                     "Reshape/Transpose-like moves finish an attention kernel")
    g = attention(after_pv=("Transpose", "Slice"))
    assert _names(find_attention(g, g.node("sm"))) == PROLOGUE + CORE + ["tm"]


def test_the_epilogue_stops_at_a_value_read_twice_or_a_graph_output():
    g = attention(output_too="tm")
    assert _names(find_attention(g, g.node("sm"))) == PROLOGUE + CORE + ["tm"]
    g = attention(extra_reader="tm")
    assert _names(find_attention(g, g.node("sm"))) == PROLOGUE + CORE + ["tm"]
    g = attention(extra_reader="pv")
    assert _names(find_attention(g, g.node("sm"))) == PROLOGUE + CORE
    g = attention(output_too="pv")
    assert _names(find_attention(g, g.node("sm"))) == PROLOGUE + CORE


def test_the_prologue_takes_data_movement_read_only_by_the_kernel():
    # k's head reshape is read elsewhere: it stays out, and so does the Split, whose k output it reads
    g = attention(extra_reader="rk")
    assert _names(find_attention(g, g.node("sm"))) == ["rq", "tq", "tk", "rv", "tv"] + CORE + ["tm", "merge"]
    g = attention(output_too="tq")
    assert _names(find_attention(g, g.node("sm"))) == ["rk", "tk", "rv", "tv", "qk", "div", "add", "sm", "pv",
                                                      "tm", "merge"]
    # a Split joins once all of its readers are in
    g = attention(extra_reader="tv")
    assert _names(find_attention(g, g.node("sm"))) == ["rq", "tq", "rk", "tk", "qk", "div", "add", "sm", "pv",
                                                      "tm", "merge"]


def test_the_rule_refuses_with_the_reason():
    g = attention(axis=2)
    plan, dec = plan_of(g)
    assert not any(grp.kind == "attention" for grp in plan.groups)
    assert "rule refused: Softmax 'sm' is not over the last (key) axis" in refusals(dec, "attention")
    b = GraphBuilder("noatt")
    x = b.input("x", (2, 4, 4))
    g = b.build(b.op("Softmax", b.op("Relu", x, name="relu"), axis=-1, name="sm"))
    plan, dec = plan_of(g)
    assert refusals(dec, "attention") == ["rule refused: Softmax 'sm' input is not a MatMul's scores"]


def test_the_structure_stays_inside_the_node_set():
    # without the scores MatMul in the set, the Softmax's input is no MatMul's scores of this kernel
    g = attention()
    whole = find_attention(g, g.node("sm"))
    assert _reason(attention_structure([n for n in whole if n.name != "qk"], g)) == \
        ("condition", "Softmax 'sm' input is not a MatMul's scores")


def _small(q_shape, k_shape, v_shape, dtype=np.float32):
    b = GraphBuilder("small")
    q = b.input("q", q_shape, dtype)
    sm = b.op("Softmax", b.op("MatMul", q, b.input("kt", k_shape, dtype), name="qk"), axis=-1, name="sm")
    g = b.build(b.op("MatMul", sm, b.input("v", v_shape, dtype), name="pv"))
    return g, [g.node("qk"), g.node("sm"), g.node("pv")]


def test_float32_operands_of_rank_two_or_more_only():
    g, nodes = _small((4, 3), (3, 4), (4, 2))          # rank 2 everywhere: accepted
    got = attention_structure(nodes, g)
    assert isinstance(got, dict) and (got["q"], got["k"], got["v"]) == ("q", "kt", "v")
    for shapes, dtype in ((((4, 3), (3, 4), (4, 2)), np.float64), (((3,), (3, 4), (4, 2)), np.float32),
                          (((4, 3), (3, 4), (4,)), np.float32)):
        g, nodes = _small(*shapes, dtype=dtype)
        assert _reason(attention_structure(nodes, g)) == \
            ("condition", "the attention kernel computes float32 operands of rank >= 2 only")


def test_the_prologue_looks_at_every_operand():
    # Q is a graph input (no producer); K goes through a Transpose, which joins the prologue
    b = GraphBuilder("q_input")
    q = b.input("q", (2, 4, 3))
    tk = b.op("Transpose", b.input("k", (2, 4, 3)), perm=[0, 2, 1], name="tk")
    sm = b.op("Softmax", b.op("MatMul", q, tk, name="qk"), axis=-1, name="sm")
    g = b.build(b.op("MatMul", sm, b.input("v", (2, 4, 3)), name="pv"))
    assert _names(find_attention(g, g.node("sm"))) == ["tk", "qk", "sm", "pv"]


def test_the_walk_follows_the_scores_not_a_constant_or_an_input_as_wide():
    for other in ("const", "input"):
        b = GraphBuilder("wide")
        x = b.input("x", (2, 4, 4))
        o = b.const("c", randn((2, 4, 4))) if other == "const" else b.input("m", (2, 4, 4))
        s = b.op("Add", o, b.op("MatMul", x, b.input("kt", (2, 4, 4)), name="mm"), name="add")
        sm = b.op("Softmax", s, axis=-1, name="sm")
        g = b.build(b.op("MatMul", sm, b.input("v", (2, 4, 3)), name="pv"))
        assert score_chain(g.node("sm"), g) == (g.node("mm"), [g.node("add")])


def test_the_rule_names_the_matmuls_and_the_softmax_and_goes_on_after_a_refusal():
    b = GraphBuilder("two")
    x = b.input("x", (2, 4, 4))
    outs = []
    for i in range(2):     # the first Softmax reads no scores: refused by the rule; the second grouped
        s = b.op("Relu", x, name="relu") if i == 0 else b.op("MatMul", x, b.input("kt", (2, 4, 4)), name="qk1")
        sm = b.op("Softmax", s, axis=-1, name=f"sm{i}")
        outs.append(b.op("MatMul", sm, b.input(f"v{i}", (2, 4, 3)), name=f"pv{i}"))
    plan, dec = plan_of(b.build(*outs))
    got = [(d.verdict, d.nodes, d.reason) for d in dec if d.rule == "attention"]
    assert got == [("refused", ("sm0",), "Softmax 'sm0' input is not a MatMul's scores"),
                   ("fused", ("qk1", "sm1", "pv1"), "3 ops in one attention kernel")]
    g = attention()
    _, dec = plan_of(g)
    assert [(d.verdict, d.nodes, d.reason) for d in dec if d.rule == "attention"] == \
        [("fused", ("qk", "sm", "pv"), "14 ops in one attention kernel")]
