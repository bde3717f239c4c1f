"""An epilogue on a compute-bound anchor is priced by its measured ratio to the stream fusing saves
(``ops.elementwise.EPILOGUE_STREAM_RATIO``, ``GroupAnalysis.epilogue_stream_bytes``): the planner fuses a cheap
one (Relu, Sigmoid, SiLU, HardSwish) into a Conv whose output comes from and goes to memory and refuses an
exp-heavy one (Tanh, Gelu, Softplus), which measured slower fused (``benchmarks/bench_epilogues.py``), with the
reason in the decision log and ``explain``; ops before the anchor or without one are not priced so."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.compiler import CompileOptions, plan_model
from opfuse.cost.analysis import analyze_group
from opfuse.cost.model import CostModel
from opfuse.ops import GraphBuilder
from opfuse.ops.elementwise import EPILOGUE_STREAM_RATIO, OPS_PER_ELEMENT
from opfuse.rules.decisions import RefusalKind
from opfuse.targets import get_profile

SHAPE = (1, 32, 200, 152)  # bench_epilogues' case: a 7.8 MB output


def conv_act(act: str, attrs: dict | None = None, shape=SHAPE):
    rng = np.random.default_rng(0)
    b = GraphBuilder(f"conv_{act.lower()}")
    x = b.input("x", shape)
    w = b.const("w", (rng.standard_normal((64, shape[1], 1, 1)) * 0.3).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(64).astype(np.float32))
    y = b.op("Conv", x, w, bias, name="conv")
    return b.build(b.op(act, y, name="act", **(attrs or {})))


def groups_of(comp) -> list[tuple[str, ...]]:
    return [tuple(g.op_types) for g in comp.plan.groups]


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Silu", "HardSwish"])
def test_cheap_epilogue_is_fused(act):
    comp = plan_model(conv_act(act), CompileOptions())
    assert groups_of(comp) == [("Conv", act)]
    assert not [d for d in comp.decisions if d.kind == RefusalKind.NOT_CHOSEN.value]


@pytest.mark.parametrize("act,attrs", [("Tanh", {}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
                                       ("Softplus", {})])
def test_exp_heavy_epilogue_on_compute_bound_anchor_is_refused_with_its_reason(act, attrs):
    comp = plan_model(conv_act(act, attrs), CompileOptions())
    assert groups_of(comp) == [("Conv",), (act,)]
    refused = [d for d in comp.decisions if d.kind == RefusalKind.NOT_CHOSEN.value]
    assert len(refused) == 1 and set(refused[0].nodes) == {"conv", "act"}
    reason = refused[0].reason
    assert "us fused against" in reason and "compute-bound Conv" in reason and "EPILOGUE_STREAM_RATIO" in reason
    assert act in reason
    fused_us, apart_us = (float(reason.split(": ")[1].split(" us")[0]),
                          float(reason.split("against ")[1].split(" us")[0]))
    assert fused_us > apart_us
    explain = comp.fusion_report.explain_text()
    assert "not chosen" in explain and "EPILOGUE_STREAM_RATIO" in explain


def test_same_epilogue_fused_by_the_rules_planner():
    """Legality is untouched: the rules' own grouping still fuses it (profitability alone refuses it)."""
    comp = plan_model(conv_act("Tanh"), CompileOptions(planner="rules"))
    assert groups_of(comp) == [("Conv", "Tanh")]


def test_epilogue_priced_at_its_ratio_of_the_stream():
    g = conv_act("Tanh")
    p = get_profile("host")
    cm = CostModel(p)
    conv, act = g.nodes
    a = analyze_group(g, [conv, act])
    out_bytes = act.outputs[0].nbytes
    assert a.epilogue_stream_bytes == pytest.approx(EPILOGUE_STREAM_RATIO["Tanh"] * 2 * out_bytes)
    assert a.epilogue_flops == OPS_PER_ELEMENT["Tanh"] * act.outputs[0].size
    fused, alone = cm.group_cost(g, [conv, act]), cm.group_cost(g, [conv])
    assert fused.bound == "compute"
    assert fused.t_compute - alone.t_compute == pytest.approx(a.epilogue_stream_bytes / p.mem_bandwidth)


def test_ops_before_an_anchor_or_without_one_are_not_priced_so():
    b = GraphBuilder("tanh_conv")
    x = b.input("x", SHAPE)
    t = b.op("Tanh", x, name="pre")
    w = b.const("w", np.ones((64, 32, 1, 1), np.float32))
    y = b.op("Conv", t, w, name="conv")
    g = b.build(b.op("Relu", y))
    assert analyze_group(g, list(g.nodes)).epilogue_stream_bytes == 0
    b = GraphBuilder("chain")
    x = b.input("x", (1 << 16,))
    g = b.build(b.op("Softplus", b.op("Tanh", x)))
    assert analyze_group(g, list(g.nodes)).epilogue_stream_bytes == 0


def test_gelu_forms_priced_apart():
    for attrs, key in (({}, "Gelu"), ({"approximate": "tanh"}, "GeluTanh")):
        g = conv_act("Gelu", attrs)
        act = g.nodes[-1]
        a = analyze_group(g, [act])
        assert a.base_flops == OPS_PER_ELEMENT[key] * act.outputs[0].size


def test_epilogue_of_a_deep_reduction_is_not_priced_so():
    """Past ``EPILOGUE_EXPOSED_MAX_DEPTH`` multiply-adds per output (bert_layer's MatMul, K = 768) the epilogue
    hides in part in the K loop and fusing measured faster: the planner keeps MatMul + Add + Gelu."""
    from opfuse.cost.analysis import EPILOGUE_EXPOSED_MAX_DEPTH
    rng = np.random.default_rng(0)
    for k, fused in ((EPILOGUE_EXPOSED_MAX_DEPTH + 256, True), (EPILOGUE_EXPOSED_MAX_DEPTH, False)):
        b = GraphBuilder("matmul_gelu")
        x = b.input("x", (128, k))
        w = b.const("w", (rng.standard_normal((k, 3072)) * 0.05).astype(np.float32))
        bias = b.const("bias", rng.standard_normal(3072).astype(np.float32))
        y = b.op("Gelu", b.op("Add", b.op("MatMul", x, w), bias))
        g = b.build(y)
        a = analyze_group(g, list(g.nodes))
        assert (a.epilogue_stream_bytes == 0) == fused, k
        comp = plan_model(g, CompileOptions())
        assert (groups_of(comp) == [("MatMul", "Add", "Gelu")]) == fused, (k, groups_of(comp))


def test_epilogue_of_a_memory_bound_anchor_hides_in_its_stream():
    """A depthwise convolution is memory-bound: its Tanh (or Gelu) epilogue is priced at its FLOPs only, and fused
    measured 0.88-0.91 of unfused (3x3, 64 channels at 200x152, cold caches): the planner keeps it fused."""
    rng = np.random.default_rng(0)
    for act in ("Tanh", "Gelu"):
        b = GraphBuilder(f"dw_{act.lower()}")
        x = b.input("x", (1, 64, 200, 152))
        w = b.const("w", (rng.standard_normal((64, 1, 3, 3)) * 0.3).astype(np.float32))
        y = b.op("Conv", x, w, name="conv", group=64, pads=[1, 1, 1, 1])
        g = b.build(b.op(act, y, name="act"))
        a = analyze_group(g, list(g.nodes))
        assert a.epilogue_stream_bytes > 0 and not CostModel(get_profile("host")).prices_epilogue(a)
        assert groups_of(plan_model(g, CompileOptions())) == [("Conv", act)]
