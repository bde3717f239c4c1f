"""Fused groups (hand-built plans) against the reference, with kernel and memory checks."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import UnsupportedGroupError
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(7)


def W(b, *shape, scale=0.3):
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) * scale).astype(np.float32))


def check(graph, spec, cache_dir, functions=None):
    """Build ``graph`` with the fused ``spec``; compare; no group-internal value has storage."""
    plan = group_by_names(graph, spec)
    got, want, model = run_both(graph, plan, cache_dir)
    assert_close(got, want)
    for grp in plan.groups:
        for v in grp.internal_values(graph):
            assert v.name not in model.memory.locations, f"internal value '{v.name}' got storage"
    if functions is not None:
        assert model.report["functions"] == functions
    return model


def test_conv_relu(cache_dir):
    b = GraphBuilder("conv_relu")
    x = b.input("x", (1, 4, 9, 9))
    y = b.op("Relu", b.op("Conv", x, W(b, 8, 4, 3, 3), W(b, 8), pads=[1, 1, 1, 1], name="conv"), name="relu")
    check(b.build(y), [("conv_epilogue", ["conv", "relu"])], cache_dir, functions=1)


def test_conv_bn_residual_add_relu(cache_dir):
    b = GraphBuilder("residual")
    x = b.input("x", (1, 8, 7, 7))
    c = b.op("Conv", x, W(b, 8, 8, 3, 3), pads=[1, 1, 1, 1], name="conv")
    bn = b.op("BatchNormalization", c, W(b, 8), W(b, 8), W(b, 8), b.const("var", np.full(8, 0.7, np.float32)),
              name="bn")
    y = b.op("Relu", b.op("Add", bn, x, name="add"), name="relu")
    check(b.build(y), [("conv_epilogue", ["conv", "bn", "add", "relu"])], cache_dir, functions=1)


def test_preactivation_prologue_with_padding(cache_dir):
    """BN -> Relu -> Conv(pad 1): the prologue runs while packing; padding stays 0."""
    b = GraphBuilder("preact")
    x = b.input("x", (1, 3, 6, 6))
    bn = b.op("BatchNormalization", x, W(b, 3), W(b, 3), W(b, 3), b.const("v", np.ones(3, np.float32)), name="bn")
    y = b.op("Conv", b.op("Relu", bn, name="relu"), W(b, 5, 3, 3, 3), pads=[1, 1, 1, 1], name="conv")
    check(b.build(y), [("conv_epilogue", ["bn", "relu", "conv"])], cache_dir, functions=1)


def test_depthwise_bn_clip(cache_dir):
    b = GraphBuilder("dw")
    x = b.input("x", (1, 6, 10, 10))
    c = b.op("Conv", x, W(b, 6, 1, 3, 3), group=6, strides=[2, 2], pads=[1, 1, 1, 1], name="dw")
    bn = b.op("BatchNormalization", c, W(b, 6), W(b, 6), W(b, 6), b.const("v", np.ones(6, np.float32)), name="bn")
    y = b.op("Clip", bn, b.const("lo", np.float32(0)), b.const("hi", np.float32(0.5)), name="relu6")
    check(b.build(y), [("conv_epilogue", ["dw", "bn", "relu6"])], cache_dir, functions=1)


def test_matmul_add_relu_and_gemm_epilogue(cache_dir):
    b = GraphBuilder("mm")
    a = b.input("a", (2, 9, 16))
    y = b.op("Relu", b.op("Add", b.op("MatMul", a, W(b, 16, 20), name="mm"), W(b, 20), name="add"), name="relu")
    g = b.op("Tanh", b.op("Gemm", b.input("g", (5, 6)), W(b, 4, 6), W(b, 4), transB=1, name="gemm"), name="tanh")
    check(b.build(y, g), [("gemm_epilogue", ["mm", "add", "relu"]), ("gemm_epilogue", ["gemm", "tanh"])],
          cache_dir, functions=2)


def test_elementwise_chain_with_side_output(cache_dir):
    b = GraphBuilder("chain")
    x = b.input("x", (2, 3, 4, 5))
    a = b.op("Add", x, W(b, 3, 1, 1), name="add")
    m = b.op("Mul", a, b.input("y", (5,)), name="mul")
    s = b.op("Sigmoid", m, name="sig")
    check(b.build(s, a), [("elementwise", ["add", "mul", "sig"])], cache_dir, functions=1)


def test_elementwise_chain_recomputes_small_values(cache_dir):
    """A value of another shape inside the group (scale*gamma, per channel) is recomputed per element."""
    b = GraphBuilder("mixed_shapes")
    x = b.input("x", (1, 4, 3, 3))
    s = b.op("Mul", b.input("scale", (4, 1, 1)), W(b, 4, 1, 1), name="small")
    y = b.op("Relu", b.op("Mul", x, s, name="big"), name="relu")
    check(b.build(y), [("elementwise", ["small", "big", "relu"])], cache_dir, functions=1)


def test_softmax_with_prologue_and_epilogue(cache_dir):
    b = GraphBuilder("softmax")
    x = b.input("x", (2, 4, 6, 33))
    mask = b.input("mask", (2, 1, 1, 33))
    pre = b.op("Add", b.op("Mul", x, b.const("scale", np.float32(0.125)), name="scale"), mask, name="mask")
    y = b.op("Mul", b.op("Softmax", pre, name="softmax"), b.const("k", np.float32(3)), name="post")
    check(b.build(y), [("reduction", ["scale", "mask", "softmax", "post"])], cache_dir, functions=1)


def test_reductions_with_prologue_and_epilogue(cache_dir):
    b = GraphBuilder("reduce")
    x = b.input("x", (1, 8, 6, 6))
    r = b.op("Sqrt", b.op("ReduceMean", b.op("Mul", x, x, name="sq"), axes=[2, 3], name="mean"), name="sqrt")
    p = b.op("Neg", b.op("MaxPool", b.op("Relu", x, name="relu"), kernel_shape=[2, 2], strides=[2, 2],
                         name="pool"), name="neg")
    f = b.op("Flatten", b.op("GlobalAveragePool", x, name="gap"), name="flat")
    spec = [("reduction", ["sq", "mean", "sqrt"]), ("reduction", ["relu", "pool", "neg"]),
            ("reduction", ["gap", "flat"])]
    check(b.build(r, p, f), spec, cache_dir, functions=3)


def test_layernorm_with_residual_prologue(cache_dir):
    b = GraphBuilder("ln")
    x = b.input("x", (1, 10, 48))
    r = b.op("Add", x, b.input("res", (1, 10, 48)), name="residual")
    y = b.op("Relu", b.op("LayerNormalization", r, W(b, 48), W(b, 48), name="ln"), name="relu")
    check(b.build(y), [("reduction", ["residual", "ln", "relu"])], cache_dir, functions=1)


def test_injective_group(cache_dir):
    b = GraphBuilder("inj")
    x = b.input("x", (1, 6, 4, 8))
    t = b.op("Transpose", x, perm=[0, 2, 1, 3], name="t")
    r = b.op("Reshape", t, b.const("shape", np.array([1, 4, 48], np.int64)), name="r")
    y = b.op("Relu", b.op("Slice", r, b.const("s", np.array([3], np.int64)), b.const("e", np.array([40], np.int64)),
                          b.const("a", np.array([2], np.int64)), name="sl"), name="relu")
    check(b.build(y), [("injective", ["t", "r", "sl", "relu"])], cache_dir, functions=1)


def test_horizontal_matmuls_share_one_gemm(cache_dir):
    b = GraphBuilder("qkv")
    a = b.input("a", (1, 12, 32))
    outs = []
    for k, n in enumerate((16, 16, 24)):
        outs.append(b.op("Add", b.op("MatMul", a, W(b, 32, n), name=f"mm{k}"), W(b, n), name=f"add{k}"))
    model = check(b.build(*outs), [("horizontal", ["mm0", "add0", "mm1", "add1", "mm2", "add2"])], cache_dir,
                  functions=1)
    # one GEMM over the three weights: each micro-kernel defined once and called once, on the shared packed B (12
    # rows: two panels of 6 through one micro-kernel on AVX2's 6 x 16; a panel of 8 and a tail panel of 4, two
    # micro-kernels, on AVX-512's 8 x 32)
    src = model.program.source
    defined = re.findall(r"static void (opfuse_ukr_\w+)\(", src)
    calls = [ln for ln in src.splitlines() if "opfuse_ukr_" in ln and "static void" not in ln]
    assert 1 <= len(defined) <= 2 and len(calls) == len(defined)
    assert all("mm0_mm1_mm2_B" in ln for ln in calls)


def test_horizontal_convs_and_pools(cache_dir):
    b = GraphBuilder("inception")
    x = b.input("x", (1, 6, 9, 9))
    c1 = b.op("Relu", b.op("Conv", x, W(b, 8, 6, 3, 3), W(b, 8), pads=[1, 1, 1, 1], name="c1"), name="r1")
    c2 = b.op("Conv", x, W(b, 4, 6, 3, 3), pads=[1, 1, 1, 1], name="c2")
    mp = b.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="mp")
    ap = b.op("AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="ap")
    spec = [("horizontal", ["c1", "r1", "c2"]), ("horizontal", ["mp", "ap"])]
    check(b.build(c1, c2, mp, ap), spec, cache_dir, functions=2)


def test_concat_producers_write_into_slices(cache_dir):
    b = GraphBuilder("concat")
    x = b.input("x", (1, 4, 5, 5))
    c1 = b.op("Relu", b.op("Conv", x, W(b, 3, 4, 1, 1), name="c1"), name="r1")
    c2 = b.op("Sigmoid", b.op("Conv", x, W(b, 5, 4, 3, 3), pads=[1, 1, 1, 1], name="c2"), name="s2")
    cat = b.op("Concat", c1, c2, axis=1, name="cat")
    y = b.op("Neg", cat, name="neg")
    spec = [("conv_epilogue", ["c1", "r1"]), ("conv_epilogue", ["c2", "s2"]), ("concat", ["cat"])]
    model = check(b.build(y), spec, cache_dir, functions=3)
    assert model.report["concat_aliases"] == 2
    assert [k["function"] for k in model.report["c_kernels"] if k["ops"] == ["Concat"]] == [None]


def _attention_graph(heads=4, seq=40, dim=16, mask=True):
    b = GraphBuilder("attention")
    hidden = heads * dim
    x = b.input("x", (1, seq, hidden))
    qkv = {}
    for k, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        p = b.op("Add", b.op("MatMul", x, W(b, hidden, hidden, scale=0.2), name=f"{k}_mm"), W(b, hidden),
                 name=f"{k}_add")
        r = b.op("Reshape", p, b.const(f"{k}_shape", np.array([1, seq, heads, dim], np.int64)), name=f"{k}_reshape")
        qkv[k] = b.op("Transpose", r, perm=perm, name=f"{k}_t")
    s = b.op("Div", b.op("MatMul", qkv["q"], qkv["k"], name="scores"), b.const("scale", np.float32(dim ** 0.5)),
             name="scale")
    if mask:
        s = b.op("Add", s, b.input("mask", (1, 1, 1, seq)), name="mask_add")
    p = b.op("Softmax", s, axis=-1, name="softmax")
    ctx = b.op("MatMul", p, qkv["v"], name="context")
    t = b.op("Transpose", ctx, perm=[0, 2, 1, 3], name="merge_t")
    y = b.op("Reshape", t, b.const("hidden_shape", np.array([1, seq, hidden], np.int64)), name="merge_r")
    att = ["q_reshape", "q_t", "k_reshape", "k_t", "v_reshape", "v_t", "scores", "scale", "softmax", "context",
           "merge_t", "merge_r"] + (["mask_add"] if mask else [])
    proj = [("horizontal", ["q_mm", "q_add", "k_mm", "k_add", "v_mm", "v_add"])]
    return b.build(y), proj + [("attention", att)], (heads, seq)


@pytest.mark.parametrize("mask", [True, False])
def test_attention_online_softmax(cache_dir, mask):
    g, spec, (heads, seq) = _attention_graph(mask=mask)
    model = check(g, spec, cache_dir, functions=2)
    # The score matrix (heads x seq x seq floats) is never stored, not even in scratch.
    att = [k for k in model.report["c_kernels"] if k["kind"] == "attention"]
    assert len(att) == 1 and att[0]["scratch_bytes"] < heads * seq * seq * 4
    assert "scores" not in model.memory.locations


ONLINE = {"attention_one_pass_max_keys": 0}  # the online softmax over key blocks, whatever the key range


@pytest.mark.parametrize("options", [ONLINE, {}], ids=["online", "one_pass"])
def test_attention_longer_than_one_key_block(cache_dir, options):
    """150 keys: three blocks of the online softmax, or (the default up to ``attention_one_pass_max_keys``) one
    block in one pass, whose second product sets Ot: no clearing, no rescaling, no running max."""
    from opfuse.codegen.options import CodegenOptions
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, spec, _ = _attention_graph(heads=2, seq=150, dim=8)
    plan = group_by_names(g, spec)
    # the AVX-512 register block's key blocks (AVX2's 6-row block makes them 66 and 150)
    model = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(vector_isa="avx512", **options))
    feeds = reference.random_inputs(g, 0)
    assert_close(model.run(feeds), reference.run(g, feeds))
    kernel = model.program.source.split("attention [")[1]
    online = options == ONLINE
    assert ("memset(ot" in kernel) == online and ("*= a" in kernel) == online
    assert re.search(r"< 150; t0\w* \+= (\d+)\)", kernel).group(1) == ("64" if online else "152")


@pytest.mark.parametrize("options", [ONLINE, {}], ids=["online", "one_pass"])
@pytest.mark.parametrize("masked", [0, 1, 64, 149])
def test_attention_mask_hiding_leading_keys(cache_dir, masked, options):
    """A left-padding mask: the first ``masked`` keys (whole key blocks included) are -inf for
    every query. The online softmax must not turn an all -inf block into NaN, nor the one pass a row."""
    from opfuse.codegen.options import CodegenOptions
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, spec, (heads, seq) = _attention_graph(heads=2, seq=150, dim=8)
    plan = group_by_names(g, spec)
    feeds = reference.random_inputs(g, 0)
    mask = np.zeros((1, 1, 1, seq), np.float32)
    mask[..., :masked] = -np.inf
    feeds["mask"] = mask
    model = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(**options))
    got, want = model.run(feeds), reference.run(g, feeds)
    assert np.isfinite(want[g.outputs[0].name]).all()
    assert_close(got, want)


@pytest.mark.parametrize("masked", [0, 70])
def test_attention_packs_keys_and_values_once_per_head_when_heads_fill_the_threads(cache_dir, masked):
    """8 heads of 150 queries (blocks of 64, 64 and 22): with ``attention_min_tiles`` at most the heads, a tile
    takes a head's three query blocks (8 tiles, K and V packed once each); above it, a tile per block (24
    tiles). Both agree with the reference, a mask over the first key block and a half included."""
    from opfuse.codegen.options import CodegenOptions
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, spec, (heads, seq) = _attention_graph(heads=8, seq=150, dim=8)
    plan = group_by_names(g, spec)
    feeds = reference.random_inputs(g, 0)
    mask = np.zeros((1, 1, 1, seq), np.float32)
    mask[..., :masked] = -np.inf
    feeds["mask"] = mask
    want = reference.run(g, feeds)
    tiles = {}
    for least in (8, 9):
        model = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(attention_min_tiles=least))
        assert_close(model.run(feeds), want)
        tiles[least] = [ln for ln in model.program.source.splitlines() if "< 8; ++tile" in ln or "< 24; ++tile" in ln]
    assert len(tiles[8]) == 1 and "< 8; ++tile" in tiles[8][0]
    assert len(tiles[9]) == 1 and "< 24; ++tile" in tiles[9][0]



@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("seq, masked", [(64, 0), (40, 0), (150, 70), (64, 64)])
def test_the_one_pass_softmax_in_vectors_is_the_c_loops_bits(cache_dir, isa, seq, masked):
    """``attention_vector_softmax``: a whole St panel's max, exp and sums in explicit vectors give the C loops'
    bits, at 64 queries (whole panels only), 40 and 150 (a part panel in the C loops beside them), with leading
    keys masked (a score column all -inf: its max read as 0, its row NaN as the reference's), and a NaN score
    (passed over by the max as the C loop's ``s > m ? s : m`` does). ``attention_panelled_queries`` (whole query
    blocks: 64 and 40 queries, not 150) packs the same values."""
    from opfuse.codegen.options import CodegenOptions
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, spec, (heads, _) = _attention_graph(heads=2, seq=seq, dim=8)
    plan = group_by_names(g, spec)
    feeds = reference.random_inputs(g, 0)
    mask = np.zeros((1, 1, 1, seq), np.float32)
    mask[..., :masked] = -np.inf
    if seq == 150:
        mask[..., 100] = np.nan
    feeds["mask"] = mask
    got = {}
    for vec, panelled in ((True, True), (False, True), (True, False)):
        model = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(
            vector_isa=isa, attention_vector_softmax=vec, attention_panelled_queries=panelled))
        kernel = model.program.source.split("attention [")[1]
        assert ("_max_ps(" in kernel) == vec
        assert ("qd" in kernel) == (not panelled or seq == 150)  # the query-by-query pack's row pointer
        got[vec, panelled] = model.run(feeds)
    want = reference.run(g, feeds)
    for k in want:
        np.testing.assert_array_equal(got[True, True][k], got[False, True][k])
        np.testing.assert_array_equal(got[True, True][k], got[True, False][k])
    if masked < seq and seq != 150:
        assert_close(got[True, True], want)

def test_a_layernorm_reads_a_row_in_memory_in_place_and_a_computed_one_through_its_buffer(cache_dir):
    """LayerNorm over the last two axes of Relu(x): alone, it reads x's rows where they are (no copy into
    scratch); with the Relu as its prologue, the row goes through the row buffer. Both as the reference."""
    from opfuse.ir.plan import FusionPlan
    b = GraphBuilder("ln_rows")
    x = b.input("x", (3, 5, 4, 6))
    r = b.op("Relu", x, name="relu")
    g = b.build(b.op("LayerNormalization", r, W(b, 4, 6), W(b, 4, 6), axis=2, name="ln"))
    got, want, model = run_both(g, FusionPlan.unfused(g), cache_dir)
    assert_close(got, want)
    ln = model.program.source.split("[ops_LayerNormalization]")[1]
    assert "const float* restrict row" in ln and "scratch +" not in ln.split("lane")[0]
    model = check(g, [("reduction", ["relu", "ln"])], cache_dir, functions=1)
    ln = model.program.source.split("[ops_Relu_LayerNormalization]")[1]
    assert "const float* restrict row" not in ln and "scratch +" in ln.split("lane")[0]
    # Its output kept inside the group (an epilogue after it, found by the e2e fuzzer): read in place too.
    g = b.build(b.op("Neg", g.outputs[0], name="neg"))
    model = check(g, [("reduction", ["ln", "neg"])], cache_dir, functions=2)
    ln = model.program.source.split("[ops_LayerNormalization_Neg]")[1]
    assert "const float* restrict row" in ln and "ln" not in model.memory.locations


def test_layernorm_row_sums_run_in_two_chains_from_32_elements(cache_dir):
    """A LayerNorm row of at least 32 elements sums in two arrays of 16 lanes (``norm.LAYERNORM_CHAINS``),
    folded pairwise, its last elements past a multiple of 32 one by one; a shorter row in one array. Rows of
    31, 32, 33 and 100 elements (off zero, so the mean matters), as the reference."""
    from opfuse.ir.plan import FusionPlan
    b = GraphBuilder("ln_chains")
    outs = []
    for n in (31, 32, 33, 100):
        x = b.op("Add", b.input(f"x{n}", (3, n)), b.const(f"o{n}", np.full(n, 3.0, np.float32)), name=f"off{n}")
        outs.append(b.op("LayerNormalization", x, W(b, n), W(b, n), name=f"ln{n}"))
    g = b.build(*outs)
    got, want, model = run_both(g, FusionPlan.unfused(g), cache_dir)
    assert_close(got, want)
    for n in (31, 32, 33, 100):
        kernel = model.program.source.split(f"group g_ln{n}:")[1].split("/* group")[0]
        assert ("[2][16];" in kernel) == ("+= 32)" in kernel) == (n >= 32), n
    for n, rest_from in ((33, 32), (100, 96)):  # the rest of the row after the chained steps
        kernel = model.program.source.split(f"group g_ln{n}:")[1].split("/* group")[0]
        assert f" = {rest_from}; j" in kernel and f" < {n}; ++j" in kernel


def test_chained_anchors_are_refused_with_the_group_name(cache_dir):
    b = GraphBuilder("conv_conv")
    x = b.input("x", (1, 3, 5, 5))
    y = b.op("Conv", b.op("Conv", x, W(b, 3, 3, 1, 1), name="c1"), W(b, 3, 3, 1, 1), name="c2")
    g = b.build(y)
    with pytest.raises(UnsupportedGroupError, match="c1_bad_group"):
        from opfuse.ir.plan import FusionGroup, FusionPlan
        from opfuse.runtime.native import build
        build(g, FusionPlan(g, [FusionGroup("c1_bad_group", list(g.nodes), "conv_epilogue")]),
              cache_dir=cache_dir)


def test_epilogue_that_spreads_an_element_is_refused(cache_dir):
    b = GraphBuilder("spread")
    x = b.input("x", (1, 3, 1, 1))
    c = b.op("Conv", x, W(b, 3, 3, 1, 1), name="c")
    y = b.op("Add", c, b.input("big", (1, 3, 4, 4)), name="add")
    g = b.build(y)
    from opfuse.runtime.native import build
    with pytest.raises(UnsupportedGroupError, match="spread"):
        build(g, group_by_names(g, [("conv_epilogue", ["c", "add"])]), cache_dir=cache_dir)


def test_two_anchor_results_combined_are_refused(cache_dir):
    b = GraphBuilder("combine")
    x = b.input("x", (1, 3, 4, 4))
    y = b.op("Add", b.op("Conv", x, W(b, 3, 3, 1, 1), name="c1"), b.op("Conv", x, W(b, 3, 3, 1, 1), name="c2"),
             name="add")
    g = b.build(y)
    from opfuse.runtime.native import build
    with pytest.raises(UnsupportedGroupError, match="several anchors"):
        build(g, group_by_names(g, [("horizontal", ["c1", "c2", "add"])]), cache_dir=cache_dir)


def test_concat_output_read_again_through_expand(cache_dir):
    """A KV-cache update as inlined Attention writes it: the Concat is a group output and, in the
    same injective group, is unsqueezed, expanded (grouped heads) and reshaped. Expand cannot be
    an epilogue, so the Concat is computed inline: one loop nest per output shape."""
    b = GraphBuilder("kv_cache")
    past, new = b.input("past", (1, 2, 4, 8)), b.input("new", (1, 2, 3, 8))
    kv = b.op("Concat", past, new, axis=2, name="concat")
    e = b.op("Expand", b.op("Unsqueeze", kv, axes=[2], name="unsq"),
             b.const("shape", np.array([1, 2, 3, 7, 8], np.int64)), name="expand")
    y = b.op("Reshape", e, b.const("to", np.array([1, 6, 7, 8], np.int64)), name="reshape")
    g = b.build(kv, y)
    check(g, [("injective", ["concat", "unsq", "expand", "reshape"])], cache_dir, functions=1)
