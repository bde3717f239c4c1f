"""One BERT-base encoder layer (Devlin et al., 2019) in the op-by-op form PyTorch exports at opset 17.

Input ``input``: hidden states ``[1, 128, 768]``; output ``output``: the same shape. No attention
mask. With ``S = 128`` tokens, ``H = 12`` heads of ``D = 64``:

    Q, K, V   = x Wq + bq, x Wk + bk, x Wv + bv                   MatMul + Add each
    Qh, Vh    = Transpose(Reshape(Q|V, [1, S, H, D]), [0,2,1,3])   [1, H, S, D]
    Kt        = Transpose(Reshape(K, [1, S, H, D]), [0,2,3,1])     [1, H, D, S]
    A         = Softmax(MatMul(Qh, Kt) / sqrt(D), axis=-1)         [1, H, S, S]
    C         = Reshape(Transpose(MatMul(A, Vh), [0,2,1,3]), [1, S, H*D])
    h         = LayerNorm(x + C Wo + bo)
    output    = LayerNorm(h + GELU(h W1 + b1) W2 + b2)             W1: 768x3072, W2: 3072x768

LayerNorm is decomposed as ``u = mean(x); d = x - u; y = d / sqrt(mean(d^2) + eps) * gamma + beta``
(ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) and GELU is the erf form
``0.5 * x * (1 + erf(x / sqrt(2)))`` exported as Div, Erf, Add, Mul, Mul.
"""
from __future__ import annotations

import math

import numpy as np
import onnx

from opfuse.zoo._build import BN_BETA_STD, BN_GAMMA_RANGE, ModelBuilder, Stats, gaussian_stats, gelu

BERT_SEED = 401
SEQ_LEN = 128
HIDDEN = 768
HEADS = 12
HEAD_DIM = HIDDEN // HEADS
FFN = 3072
LN_EPSILON = 1e-12  # HuggingFace BertLayerNorm's epsilon
# LayerNorm affine parameters, drawn like the BatchNorm ones so they are not the identity.
LN_GAMMA_RANGE = BN_GAMMA_RANGE
LN_BETA_STD = BN_BETA_STD


def layer_norm(b: ModelBuilder, x: str, name: str, output: str | None = None) -> str:
    """Decomposed LayerNorm over the last axis (ReduceMean keeps ``axes`` as an attribute at opset 17)."""
    mean = b.node("ReduceMean", [x], f"{name}_mean", axes=[-1], keepdims=1)
    d = b.node("Sub", [x, mean], f"{name}_sub")
    sq = b.node("Pow", [d, b.const(f"{name}.exponent", 2.0)], f"{name}_pow")
    var = b.node("ReduceMean", [sq], f"{name}_var", axes=[-1], keepdims=1)
    std = b.node("Sqrt", [b.node("Add", [var, b.const(f"{name}.eps", LN_EPSILON)], f"{name}_add_eps")],
                 f"{name}_sqrt")
    y = b.node("Div", [d, std], f"{name}_div")
    gamma = b.rng.uniform(*LN_GAMMA_RANGE, HIDDEN)
    beta = b.rng.standard_normal(HIDDEN) * LN_BETA_STD
    y = b.node("Mul", [y, b.const(f"{name}.weight", gamma)], f"{name}_scale")
    # d / std has zero mean and unit second moment per row, so the output's moment is
    # E[gamma^2] + E[beta^2] (over the features).
    stats = Stats(float(np.mean(beta)), float(np.mean(gamma ** 2) + np.mean(beta ** 2)))
    return b.node("Add", [y, b.const(f"{name}.bias", beta)], f"{name}_shift", output=output,
                  stats=stats)


def gelu_erf(b: ModelBuilder, x: str, name: str) -> str:
    """``0.5 * x * (1 + erf(x / sqrt(2)))`` as Div -> Erf -> Add(1) -> Mul(x) -> Mul(0.5)."""
    y = b.node("Div", [x, b.const(f"{name}.sqrt2", math.sqrt(2.0))], f"{name}_div")
    y = b.node("Erf", [y], f"{name}_erf")
    y = b.node("Add", [y, b.const(f"{name}.one", 1.0)], f"{name}_add")
    y = b.node("Mul", [x, y], f"{name}_mul")
    return b.node("Mul", [y, b.const(f"{name}.half", 0.5)], f"{name}_mul_half",
                  stats=gaussian_stats(gelu, b.stats[x]))


def split_heads(b: ModelBuilder, x: str, name: str, shape: str, perm: list[int]) -> str:
    return b.node("Transpose", [b.node("Reshape", [x, shape], f"{name}_reshape")], f"{name}_transpose",
                  perm=perm)


def build_bert_layer() -> onnx.ModelProto:
    """BERT-base encoder layer on ``[1, 128, 768]``."""
    b = ModelBuilder("bert_layer", BERT_SEED)
    x = b.input("input", (1, SEQ_LEN, HIDDEN))
    heads_shape = b.const("heads_shape", [1, SEQ_LEN, HEADS, HEAD_DIM], dtype=np.int64)
    hidden_shape = b.const("hidden_shape", [1, SEQ_LEN, HIDDEN], dtype=np.int64)

    q = split_heads(b, b.linear(x, "query", HIDDEN, HIDDEN), "query", heads_shape, [0, 2, 1, 3])
    k = split_heads(b, b.linear(x, "key", HIDDEN, HIDDEN), "key", heads_shape, [0, 2, 3, 1])
    v = split_heads(b, b.linear(x, "value", HIDDEN, HIDDEN), "value", heads_shape, [0, 2, 1, 3])
    scores = b.node("MatMul", [q, k], "scores")
    scores = b.node("Div", [scores, b.const("scores.scale", math.sqrt(HEAD_DIM))], "scores_scale")
    probs = b.node("Softmax", [scores], "attention_probs", axis=-1)
    # Each context row is a convex combination of V rows: at most V's second moment.
    ctx = b.node("MatMul", [probs, v], "context", stats=b.stats[v])
    ctx = b.node("Transpose", [ctx], "context_transpose", perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, hidden_shape], "context_reshape")
    attn = b.linear(ctx, "attention_output", HIDDEN, HIDDEN)
    h = layer_norm(b, b.add(attn, x, "attention_residual"), "attention_ln")

    f = gelu_erf(b, b.linear(h, "intermediate", HIDDEN, FFN), "gelu")
    f = b.linear(f, "output_dense", FFN, HIDDEN)
    y = layer_norm(b, b.add(f, h, "output_residual"), "output_ln", output="output")
    return b.build([(y, (1, SEQ_LEN, HIDDEN))],
                   doc="BERT-base encoder layer, 1x128x768, 12 heads, decomposed LayerNorm, erf GELU")
