"""Which lowering builds each stage: one entry per anchor op (tinygrad-style rules as data)."""
from __future__ import annotations

from typing import Callable

from opfuse.codegen.stages import GroupAnalysis, Stage


def _matmul(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """An int8 MatMul (8-bit activations, constant weights: ``qmatmul.py``) or the GEMM."""
    from opfuse.codegen import gemm, qmatmul
    if qmatmul.int8_matmul_applies(stage.anchor_node, ev.static):
        return qmatmul.lower_int8_matmul(kc, ev, stage)
    return gemm.lower_matmul(kc, ev, stage, analysis)


def _table() -> dict[str, Callable]:
    from opfuse.codegen import concat, conv, det, gemm, norm, pool, recurrent, reduce, sampling, scan, scatter, topk
    return {
        "Conv": conv.lower_conv,
        "ConvTranspose": conv.lower_conv_transpose,
        "MatMul": _matmul,
        "Gemm": gemm.lower_gemm,
        "MaxPool": _max_pool,
        "AveragePool": pool.lower_pool,
        "GlobalAveragePool": reduce.lower_reduce,
        "ReduceMean": reduce.lower_reduce,
        "ReduceSum": reduce.lower_reduce,
        "ReduceMax": reduce.lower_reduce,
        "Softmax": norm.lower_softmax,
        "LayerNormalization": norm.lower_layernorm,
        "Concat": concat.lower_concat,
        **{op: reduce.lower_reduction for op in (*reduce.REDUCTIONS, reduce.LOG_SUM_EXP)},
        "ArgMax": reduce.lower_arg_reduce,
        "ArgMin": reduce.lower_arg_reduce,
        "LogSoftmax": norm.lower_log_softmax,
        "Hardmax": norm.lower_hardmax,
        "CumSum": scan.lower_cumsum,
        "CumProd": scan.lower_cumsum,
        "ScatterND": scatter.lower_scatter,
        "ScatterElements": scatter.lower_scatter,
        "TopK": topk.lower_topk,
        "GridSample": sampling.lower_grid_sample,
        "Col2Im": sampling.lower_col2im,
        "DeformConv": sampling.lower_deform_conv,
        "RoiAlign": sampling.lower_roi_align,
        "MaxUnpool": sampling.lower_max_unpool,
        "Det": det.lower_det,
        **{op: recurrent.lower_recurrent for op in ("LSTM", "GRU", "RNN")},
    }


def _max_pool(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """MaxPool: ``pool.py``'s kernels, or one that also finds the Indices when they are read."""
    from opfuse.codegen import pool, sampling
    if len(stage.anchor_node.outputs) > 1:
        return sampling.lower_max_pool_indices(kc, ev, stage, analysis)
    return pool.lower_pool(kc, ev, stage, analysis)


_ANCHORS: dict[str, Callable] | None = None


def anchor_lowerings() -> dict[str, Callable]:
    global _ANCHORS
    if _ANCHORS is None:
        _ANCHORS = _table()
    return _ANCHORS


def lower_stage(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    if stage.kind == "pointwise":
        from opfuse.codegen.pointwise import lower_pointwise
        return lower_pointwise(kc, ev, stage, analysis)
    if stage.kind == "horizontal":
        from opfuse.codegen.horizontal import lower_horizontal
        return lower_horizontal(kc, ev, stage, analysis)
    if stage.kind == "attention":
        from opfuse.codegen.attention import lower_attention
        return lower_attention(kc, ev, stage, analysis)
    node = stage.anchor_node
    fn = anchor_lowerings().get(node.op_type)
    if fn is None:
        raise kc.error(f"op {node.op_type} (node '{node.name}') has no C kernel")
    return fn(kc, ev, stage, analysis)
