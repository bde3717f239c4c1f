"""Horizontal merging of sibling MatMuls (Q/K/V) and the seed's three conditions."""

from opfuse.ops import GraphBuilder
from rewrite_cases import applied, assert_same_outputs, ops, randn, refusals, rewritten

RULE = "horizontal_matmul"


def projections(b, x, biases=(True, False, True), sizes=(8, 8, 6)):
    w0 = b.const("wq", randn((8, sizes[0]), 1))
    outs = []
    for i, (name, bias, n) in enumerate(zip(("query", "key", "value"), biases, sizes, strict=True)):
        w = w0 if i == 0 else b.const(f"w{name}", randn((8, n), 2 + i))
        y = b.op("MatMul", x, w, name=f"{name}_matmul")
        if bias:
            y = b.op("Add", y, b.const(f"b{name}", randn(n, 10 + i)), name=f"{name}_add")
        outs.append(y)
    return outs


def attention_over(b, q, k, v):
    scores = b.op("MatMul", k, b.op("Transpose", q, perm=[0, 2, 1]))
    return b.op("MatMul", b.op("Softmax", scores, axis=-1), v)


def test_qkv_feeding_attention_becomes_one_matmul_and_split():
    b = GraphBuilder("qkv")
    x = b.input("x", (1, 3, 8))
    g0, g1, res = rewritten(b.build(attention_over(b, *projections(b, x))))
    assert ops(g1).count("Split") == 1 and ops(g1).count("Add") == 1
    mm = next(n for n in g1.nodes if n.op_type == "MatMul")
    assert mm.name == "query_key_value_matmul" and mm.inputs[1].shape == (8, 8 + 8 + 6)
    assert sorted(res.provenance.of(mm.name)) == ["key_matmul", "query_matmul", "value_matmul"]
    assert applied(res, RULE) == 1
    assert_same_outputs(g0, g1)


def test_one_row_split_is_a_view_so_any_reader_is_fine():
    b = GraphBuilder("one_row")
    x = b.input("x", (1, 1, 8))
    g0, g1, res = rewritten(b.build(*[b.op("Relu", y) for y in projections(b, x)]))
    assert applied(res, RULE) == 1
    assert_same_outputs(g0, g1)


def test_refused_when_the_split_would_be_a_copy_kernel():
    b = GraphBuilder("copy_split")
    x = b.input("x", (1, 3, 8))
    g0, g1, res = rewritten(b.build(*[b.op("Relu", y) for y in projections(b, x)]))
    assert ops(g1).count("MatMul") == 3
    assert any("the Split would be a copy kernel" in r for r in refusals(res, RULE))


def test_refused_when_a_weight_is_shared():
    b = GraphBuilder("qkv_shared")
    x = b.input("x", (1, 3, 8))
    out = attention_over(b, *projections(b, x))
    other = b.op("MatMul", b.input("z", (2, 8)), b.graph.values["wq"], name="other_matmul")
    g0, g1, res = rewritten(b.build(out, other))
    assert ops(g1).count("MatMul") == 6
    assert any("weight 'wq' is shared with node 'other_matmul'" in r for r in refusals(res, RULE))
    assert_same_outputs(g0, g1)


def test_refused_over_the_resource_limits():
    b = GraphBuilder("qkv_big")
    x = b.input("x", (1, 3, 8))
    g = b.build(attention_over(b, *projections(b, x)))
    g0, g1, res = rewritten(g, max_merged_weight_bytes=256)
    assert ops(g1).count("MatMul") == 5
    assert any("resource" not in r and "exceeds the limit of 256 bytes" in r for r in refusals(res, RULE))
    g0, g1, res = rewritten(g, max_horizontal_members=2)
    assert any("3 siblings exceed the limit of 2" in r for r in refusals(res, RULE))


def test_refused_when_disabled():
    b = GraphBuilder("qkv_off")
    x = b.input("x", (1, 3, 8))
    g0, g1, res = rewritten(b.build(attention_over(b, *projections(b, x))), disabled=frozenset({RULE}))
    assert ops(g1).count("MatMul") == 5
    assert any("is disabled" in r for r in refusals(res, RULE))
