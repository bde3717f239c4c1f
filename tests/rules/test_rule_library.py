"""Every rule of the library on small hand-built graphs: a positive case and refusals with reasons.

Rewrites are also checked numerically against the reference executor on the original graph.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from opfuse.rules.activations import HARD_SWISH, SILU
from opfuse.rules.attention import ATTENTION
from opfuse.rules.conv import CONV_ACT, CONV_BN_ACT, CONV_CONCAT, CONV_RESIDUAL
from opfuse.rules.elementwise import ELEMENTWISE_CHAIN
from opfuse.rules.gelu import ERF_GELU
from opfuse.rules.horizontal import MATMUL_EPILOGUE, PARALLEL_MATMUL
from opfuse.rules.normalization import LAYERNORM

from rule_helpers import same_outputs

F32 = np.float32
RNG = np.random.default_rng(7)


def arr(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, shape).astype(F32)


def conv_input(b, c=2):
    return b.input("x", (1, c, 4, 4))


def conv(b, x, cout=3, name="conv"):
    return b.op("Conv", x, b.const(f"{name}_w", arr(cout, x.shape[1], 1, 1)), name=name)


def bn(b, x, name="bn", mean=None):
    c = x.shape[1]
    mean = mean if mean is not None else b.const(f"{name}_mean", arr(c))
    return b.op("BatchNormalization", x, b.const(f"{name}_s", arr(c, lo=0.5)), b.const(f"{name}_b", arr(c)),
                mean, b.const(f"{name}_v", arr(c, lo=0.5, hi=1.5)), name=name)


# Conv epilogues ------------------------------------------------------------------------------------------

def test_conv_bn_act(decide):
    b = GraphBuilder("cba")
    y = b.op("Relu", bn(b, conv(b, conv_input(b))), name="relu")
    out = decide(b.build(y), [CONV_BN_ACT])
    assert out.taken("conv_bn_act") == [["conv", "bn", "relu"]]


def test_conv_bn_act_refuses_non_constant_statistics(decide):
    b = GraphBuilder("cba_bad")
    x = conv_input(b)
    mean = b.input("running_mean", (3,))
    y = b.op("Relu", bn(b, conv(b, x), mean=mean), name="relu")
    out = decide(b.build(y), [CONV_BN_ACT])
    assert out.taken("conv_bn_act") == []
    assert out.refused("conv_bn_act", "condition") == ["BatchNormalization 'bn' mean is not a constant"]


def test_conv_act_and_clip_bounds(decide):
    b = GraphBuilder("ca")
    x = conv_input(b)
    y1 = b.op("Clip", conv(b, x, name="c1"), b.const("lo", np.array(0, F32)), b.const("hi", np.array(6, F32)),
              name="relu6")
    hi = b.input("dynamic_hi", ())
    y2 = b.op("Clip", conv(b, x, name="c2"), b.const("lo2", np.array(0, F32)), hi, name="clip_dyn")
    out = decide(b.build(y1, y2), [CONV_ACT])
    assert out.taken("conv_act") == [["c1", "relu6"]]
    assert out.refused("conv_act", "condition") == ["Clip 'clip_dyn' operand 'dynamic_hi' is not a constant"]


def test_conv_residual_add(decide):
    b = GraphBuilder("res")
    x = b.input("x", (1, 3, 4, 4))
    y = b.op("Relu", b.op("Add", x, bn(b, conv(b, x)), name="add"), name="relu")
    out = decide(b.build(y), [CONV_RESIDUAL])
    assert out.taken("conv_residual_add") == [["conv", "bn", "add", "relu"]]


@pytest.mark.parametrize("residual, reason", [
    ("const", "'r' is a constant: 'add' is a bias add, not a residual"),
    ("broadcast", "residual 'r' (1, 3, 1, 1) is broadcast to (1, 3, 4, 4)"),
])
def test_conv_residual_refusals(decide, residual, reason):
    b = GraphBuilder("res_bad")
    x = b.input("x", (1, 3, 4, 4))
    r = b.const("r", arr(1, 3, 4, 4)) if residual == "const" else b.input("r", (1, 3, 1, 1))
    y = b.op("Add", conv(b, x), r, name="add")
    out = decide(b.build(y), [CONV_RESIDUAL])
    assert out.taken("conv_residual_add") == []
    assert out.refused("conv_residual_add", "condition") == [reason]


@pytest.mark.parametrize("axis, ok", [(1, True), (-3, True), (2, False)])
def test_conv_concat(decide, axis, ok):
    b = GraphBuilder("cat")
    x = conv_input(b, c=3)
    y = b.op("Concat", conv(b, x, name="c1"), conv(b, x, name="c2"), b.op("Relu", x, name="other"),
             name="cat", axis=axis)
    out = decide(b.build(y), [CONV_CONCAT])
    if ok:
        assert out.taken("conv_concat") == [["c1", "c2", "cat"]]
    else:
        assert out.refused("conv_concat", "condition") == \
            ["Concat 'cat' joins axis 2, not the channel axis: slices are not contiguous"]


# Attention and MatMul rules ------------------------------------------------------------------------------

def attention_graph(axis=-1, scale_const=True):
    b = GraphBuilder("attn")
    q = b.input("q", (2, 4, 8))
    k = b.input("kt", (2, 8, 4))
    v = b.input("v", (2, 4, 8))
    s = b.op("MatMul", q, k, name="qk")
    scale = b.const("scale", np.array(math.sqrt(8), F32)) if scale_const else b.input("temperature", ())
    s = b.op("Div", s, scale, name="scale")
    p = b.op("Softmax", s, name="softmax", axis=axis)
    return b.build(b.op("MatMul", p, v, name="pv"))


def test_attention(decide):
    out = decide(attention_graph(), [ATTENTION])
    assert out.taken("attention") == [["qk", "scale", "softmax", "pv"]]


@pytest.mark.parametrize("kw, reason", [
    ({"axis": 1}, "Softmax 'softmax' normalises axis 1, not the last (key) axis"),
    ({"scale_const": False}, "'scale' does not scale the scores by a constant scalar"),
])
def test_attention_refusals(decide, kw, reason):
    out = decide(attention_graph(**kw), [ATTENTION])
    assert out.refused("attention", "condition") == [reason]


def test_parallel_matmul_on_shared_input(decide):
    b = GraphBuilder("qkv")
    x = b.input("x", (4, 8))
    outs = [b.op("MatMul", x, b.const(f"w{i}", arr(8, 8)), name=n) for i, n in enumerate(["q", "k", "v"])]
    out = decide(b.build(*outs), [PARALLEL_MATMUL])
    assert out.taken("parallel_matmul") == [["q", "k", "v"]]


def test_parallel_gemm_refuses_mixed_transposition(decide):
    b = GraphBuilder("qkv_bad")
    x = b.input("x", (8, 8))
    outs = [b.op("Gemm", x, b.const(f"w{i}", arr(8, 8)), name=f"g{i}", transA=int(i == 2)) for i in range(3)]
    out = decide(b.build(*outs), [PARALLEL_MATMUL])
    assert out.refused("parallel_matmul", "condition") == \
        ["the Gemm siblings read the shared input with different transA"]


def test_matmul_epilogue(decide):
    b = GraphBuilder("linear")
    x = b.input("x", (4, 8))
    y = b.op("Relu", b.op("Add", b.op("MatMul", x, b.const("w", arr(8, 8)), name="mm"), b.const("bias", arr(8)),
                          name="add"), name="relu")
    out = decide(b.build(y), [MATMUL_EPILOGUE])
    assert out.taken("matmul_epilogue") == [["mm", "add", "relu"]]


def test_matmul_epilogue_refuses_broadcasting_bias(decide):
    b = GraphBuilder("linear_bad")
    x = b.input("x", (4, 8))
    y = b.op("Add", b.op("MatMul", x, b.const("w", arr(8, 8)), name="mm"), b.const("bias", arr(3, 1, 8)), name="add")
    out = decide(b.build(y), [MATMUL_EPILOGUE])
    assert out.refused("matmul_epilogue", "condition") == \
        ["bias 'bias' (3, 1, 8) broadcasts the product (4, 8) to (3, 4, 8)"]


# Elementwise chains ----------------------------------------------------------------------------------------

def test_elementwise_chain(decide):
    b = GraphBuilder("ew")
    x = b.input("x", (4, 8))
    y = b.op("Add", b.op("Mul", b.op("Relu", x, name="relu"), b.const("c", arr(8)), name="mul"),
             b.const("d", arr(8)), name="add")
    out = decide(b.build(y), [ELEMENTWISE_CHAIN])
    assert out.taken("elementwise_chain") == [["relu", "mul", "add"]]


def test_elementwise_chain_refuses_two_iteration_spaces_then_fuses_the_rest(decide):
    b = GraphBuilder("ew_bcast")
    x = b.input("x", (1, 8))
    big = b.input("big", (4, 8))
    y = b.op("Sigmoid", b.op("Add", b.op("Relu", x, name="relu"), big, name="add"), name="sig")
    out = decide(b.build(y), [ELEMENTWISE_CHAIN])
    refusals = [(list(d.nodes), d.reason) for d in out.decisions if not d.taken]
    reason = "output (1, 8) of 'relu' differs from the chain's iteration space (4, 8)"
    # the whole chain is refused, then its largest parts are offered: one still mixes spaces
    assert refusals == [(["relu", "add", "sig"], reason), (["relu", "add"], reason)]
    assert out.taken("elementwise_chain") == [["add", "sig"]]


# Recognition rewrites -----------------------------------------------------------------------------------------

def silu_graph(dtype="float32"):
    b = GraphBuilder("silu")
    x = b.input("x", (2, 8), dtype)
    y = b.op("Mul", x, b.op("Sigmoid", x, name="sig"), name="mul")
    return b.build(b.op("Relu", y, name="after"))


def test_silu_rewrite(decide):
    g = silu_graph()
    before = g.copy()
    out = decide(g, [SILU])
    assert out.taken("recognize_silu") == [["sig", "mul"]] and out.ops() == ["Silu", "Relu"]
    assert g.nodes[0].outputs[0].name == "mul"          # the replaced value keeps its name
    same_outputs(before, g)


def test_silu_refuses_integers(decide):
    out = decide(silu_graph("int32"), [SILU])
    assert out.refused("recognize_silu", "condition") == ["'x' is int32, not a float tensor"]


def hswish_graph(form: str, scale: float = 6.0, alpha: float | None = 1 / 6):
    """``form``: "hardsigmoid" (``alpha=None``: the ONNX defaults), or the op ("Div"/"Mul")
    applying ``scale`` after the product, or "div_before" (``x * (clip / scale)``)."""
    b = GraphBuilder("hswish")
    x = b.input("x", (2, 8))
    if form == "hardsigmoid":
        kw = {} if alpha is None else {"alpha": alpha, "beta": 0.5}
        return b.build(b.op("Mul", x, b.op("HardSigmoid", x, name="hs", **kw), name="mul"))
    clip = b.op("Clip", b.op("Add", x, b.const("three", np.array(3, F32)), name="add"),
                b.const("zero", np.array(0, F32)), b.const("six", np.array(6, F32)), name="clip")
    s = b.const("scale", np.array(scale, F32))
    if form == "div_before":
        return b.build(b.op("Mul", x, b.op("Div", clip, s, name="div"), name="out"))
    return b.build(b.op(form, b.op("Mul", x, clip, name="mul"), s, name="out"))


@pytest.mark.parametrize("form, scale", [("hardsigmoid", None), ("Div", 6.0), ("Mul", 1 / 6), ("div_before", 6.0)])
def test_hard_swish_forms(decide, form, scale):
    g = hswish_graph(form, scale or 6.0)
    before = g.copy()
    out = decide(g, [HARD_SWISH])
    assert out.ops() == ["HardSwish"]
    same_outputs(before, g)


@pytest.mark.parametrize("kw, reason", [
    ({"form": "hardsigmoid", "alpha": 0.2}, "HardSigmoid 'hs' has alpha=0.2, beta=0.5; hard-swish needs 1/6 and 1/2"),
    ({"form": "hardsigmoid", "alpha": None}, "HardSigmoid 'hs' has alpha=0.2, beta=0.5; hard-swish needs 1/6 and 1/2"),
    ({"form": "Div", "scale": 5.0}, "Div constant 'scale' is 5, not 6"),
])
def test_hard_swish_refusals(decide, kw, reason):
    out = decide(hswish_graph(**kw), [HARD_SWISH])
    assert out.refused("recognize_hardswish", "condition") == [reason]
    assert "HardSwish" not in out.ops()


def gelu_graph(form: str = "div", k: float | None = None):
    b = GraphBuilder("gelu")
    x = b.input("x", (2, 8))
    if form == "div":
        s = b.op("Div", x, b.const("k", np.array(k or math.sqrt(2), F32)), name="div")
    else:
        s = b.op("Mul", x, b.const("k", np.array(k or 1 / math.sqrt(2), F32)), name="div")
    one_plus = b.op("Add", b.op("Erf", s, name="erf"), b.const("one", np.array(1, F32)), name="add")
    half = b.const("half", np.array(0.5, F32))
    if form == "half_first":
        y = b.op("Mul", b.op("Mul", x, half, name="mul_x"), one_plus, name="out")
    elif form == "half_inner":
        y = b.op("Mul", x, b.op("Mul", one_plus, half, name="mul_half"), name="out")
    else:
        y = b.op("Mul", b.op("Mul", x, one_plus, name="mul_x"), half, name="out")
    return b.build(y)


@pytest.mark.parametrize("form", ["div", "mul", "half_first", "half_inner"])
def test_erf_gelu_forms(decide, form):
    g = gelu_graph(form)
    before = g.copy()
    out = decide(g, [ERF_GELU])
    assert out.ops() == ["Gelu"] and g.nodes[0].attrs["approximate"] == "none"
    same_outputs(before, g)


def test_erf_gelu_refuses_wrong_constant(decide):
    out = decide(gelu_graph(k=2.0), [ERF_GELU])
    assert out.refused("recognize_gelu_erf", "condition") == ["Div constant 'k' is 2, not 1.41421"]
    assert "Gelu" not in out.ops()


def layernorm_graph(square="pow", exponent=2.0, axes2=(-1,), gamma_shape=(8,), axes1=(-1,)):
    b = GraphBuilder("ln")
    x = b.input("x", (2, 4, 8))
    mean = b.op("ReduceMean", x, name="mean", axes=list(axes1))
    d = b.op("Sub", x, mean, name="sub")
    sq = b.op("Pow", d, b.const("exponent", np.array(exponent, F32)), name="pow") if square == "pow" else \
        b.op("Mul", d, d, name="pow")
    var = b.op("ReduceMean", sq, name="var", axes=list(axes2))
    std = b.op("Sqrt", b.op("Add", var, b.const("eps", np.array(1e-5, F32)), name="add_eps"), name="sqrt")
    y = b.op("Mul", b.op("Div", d, std, name="div"), b.const("gamma", arr(*gamma_shape, lo=0.5)), name="mul")
    return b.build(b.op("Add", y, b.const("beta", arr(8)), name="add"))


@pytest.mark.parametrize("square", ["pow", "mul"])
def test_layernorm_rewrite(decide, square):
    g = layernorm_graph(square)
    before = g.copy()
    out = decide(g, [LAYERNORM])
    assert out.ops() == ["LayerNormalization"]
    ln = g.nodes[0]
    assert ln.attrs["axis"] == 2 and ln.attrs["epsilon"] == pytest.approx(1e-5)
    same_outputs(before, g, atol=1e-4)


@pytest.mark.parametrize("kw, reason", [
    ({"exponent": 3.0}, "Pow exponent 'exponent' is not 2"),
    ({"axes2": (-2,)}, "the two ReduceMeans reduce different axes ([2] and [1])"),
    ({"axes1": (1,), "axes2": (1,)}, "ReduceMean axes [1] are not the trailing axes of a rank-3 tensor"),
])
def test_layernorm_refusals(decide, kw, reason):
    out = decide(layernorm_graph(**kw), [LAYERNORM])
    assert out.refused("recognize_layernorm", "condition") == [reason]
    assert "LayerNormalization" not in out.ops()


def test_layernorm_refuses_gamma_varying_outside_but_keeps_the_normalisation(decide):
    # the refusal names the Mul only: the normalisation without the affine part still matches
    g = layernorm_graph(gamma_shape=(4, 1))
    before = g.copy()
    out = decide(g, [LAYERNORM])
    assert out.refused("recognize_layernorm", "condition") == ["scale 'gamma' (4, 1) varies outside the normalised axes"]
    assert out.ops() == ["LayerNormalization", "Mul", "Add"]
    same_outputs(before, g, atol=1e-4)


def test_layernorm_with_broadcast_gamma_is_reshaped(decide):
    g = layernorm_graph(gamma_shape=(1, 1, 8))
    before = g.copy()
    out = decide(g, [LAYERNORM])
    assert out.ops() == ["LayerNormalization"]
    assert g.nodes[0].inputs[1].shape == (8,)
    same_outputs(before, g, atol=1e-4)
