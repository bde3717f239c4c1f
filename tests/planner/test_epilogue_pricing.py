"""An epilogue on a compute-bound anchor is priced by its measured ratio to the stream fusing saves
(``ops.elementwise.EPILOGUE_STREAM_RATIO``, ``GroupAnalysis.epilogue_stream_bytes``), and the same op in a kernel of
its own by the same ratio (``GroupAnalysis.arithmetic_stream_bytes``, overlapping that kernel's stream): the planner
fuses a cheap one (Relu, Sigmoid, SiLU, HardSwish, Gelu's erf form through gelu.py's polynomial), which saves its
stream, and an exp-heavy one (Tanh, Gelu's tanh form, Softplus), predicted at parity but for the kernel launch
(measured at parity, ``benchmarks/bench_epilogues.py``); a
fused side priced higher (here by a correction factor) is refused with the reason in the decision log and
``explain``; ops before the anchor are not priced so."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.compiler import CompileOptions, plan_model
from opfuse.cost.analysis import analyze_group
from opfuse.cost.model import CostModel
from opfuse.ops import GraphBuilder
from opfuse.ops.elementwise import EPILOGUE_STREAM_RATIO, OPS_PER_ELEMENT, epilogue_stream_ratio
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


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Silu", "HardSwish", "Gelu"])
def test_cheap_epilogue_is_fused(act):
    comp = plan_model(conv_act(act), CompileOptions())
    assert groups_of(comp) == [("Conv", act)]
    assert not [d for d in comp.decisions if d.kind == RefusalKind.NOT_CHOSEN.value]


EXP_HEAVY = [("Tanh", {}), ("Gelu", {"approximate": "tanh"}), ("Softplus", {})]


@pytest.mark.parametrize("act,attrs", EXP_HEAVY)
def test_exp_heavy_epilogue_priced_alike_apart_is_fused(act, attrs):
    """Its arithmetic costs the same fused and in a kernel of its own (ratio >= 1: more than the stream that kernel
    moves), so the two plans differ by the kernel launch fusing saves, and the planner fuses."""
    g = conv_act(act, attrs)
    cm = CostModel(get_profile("host"))
    conv, a = g.nodes
    fused = cm.group_cost(g, [conv, a]).latency_s
    apart = cm.group_cost(g, [conv]).latency_s + cm.group_cost(g, [a]).latency_s
    assert apart - fused == pytest.approx(get_profile("host").launch_overhead_s)
    comp = plan_model(g, CompileOptions())
    assert groups_of(comp) == [("Conv", act)]
    assert not [d for d in comp.decisions if d.kind == RefusalKind.NOT_CHOSEN.value]


def test_fused_side_priced_higher_is_refused_with_its_reason(monkeypatch):
    """The other side of the decision: with the anchor's groups priced 50% higher (a correction factor, as ``opfuse
    profile --fit`` saves), Conv + Tanh fused costs more than apart, and the refusal gives both predictions and the
    epilogue's ratio."""
    from opfuse.cost.correction import Corrections
    from opfuse.ops.registry import Category
    from opfuse.planner import api

    def load(target, path=None, *, profile=None):
        return Corrections(target, alphas={Category.OUT_ELEMWISE_FUSABLE.name: 0.5})
    monkeypatch.setattr(api, "load_corrections", load)
    comp = plan_model(conv_act("Tanh"), CompileOptions())
    assert groups_of(comp) == [("Conv",), ("Tanh",)]
    refused = [d for d in comp.decisions if d.kind == RefusalKind.NOT_CHOSEN.value]
    assert len(refused) == 1 and set(refused[0].nodes) == {"conv", "act"}
    reason = refused[0].reason
    assert "us fused against" in reason and "compute-bound Conv" in reason and "Tanh 1.25x" in reason
    fused_us, apart_us = (float(reason.split(": ")[1].split(" us")[0]),
                          float(reason.split("against ")[1].split(" us")[0]))
    assert fused_us > apart_us
    explain = comp.fusion_report.explain_text()
    assert "not chosen" in explain and "EPILOGUE_STREAM_RATIO" in explain


@pytest.mark.parametrize("act,attrs", [("Sigmoid", {}), *EXP_HEAVY, ("Relu", {})])
def test_kernel_alone_priced_by_the_same_ratio(act, attrs):
    """A standalone kernel of a listed op takes max(its stream, ratio x its stream): compute-bound at the ratio
    (Tanh, Gelu's tanh form, Softplus), its stream below 1 (Sigmoid); an op the table does not list (Relu) is its
    stream."""
    g = conv_act(act, attrs)
    p = get_profile("host")
    a_node = g.nodes[-1]
    a = analyze_group(g, [a_node])
    ratio = epilogue_stream_ratio(a_node)
    stream = 2 * a_node.outputs[0].nbytes / p.mem_bandwidth
    assert a.arithmetic_stream_bytes == pytest.approx((ratio or 0.0) * 2 * a_node.outputs[0].nbytes)
    assert a.epilogue_stream_bytes == 0
    cost = CostModel(p).group_cost(g, [a_node])
    assert cost.t_memory == pytest.approx(stream)
    assert cost.t_predicted - cost.t_overhead == pytest.approx(max(stream, (ratio or 0.0) * stream))
    assert (cost.bound == "compute") == (ratio is not None and ratio > 1)


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
    a = analyze_group(g, list(g.nodes))
    assert a.epilogue_stream_bytes == 0 and a.arithmetic_stream_bytes == 0  # a Tanh before the anchor: its FLOPs
    b = GraphBuilder("chain")
    x = b.input("x", (1 << 16,))
    g = b.build(b.op("Softplus", b.op("Tanh", x)))
    a = analyze_group(g, list(g.nodes))
    assert a.epilogue_stream_bytes == 0  # no anchor: priced as a chain, by the same ratios
    assert a.arithmetic_stream_bytes == pytest.approx(
        (EPILOGUE_STREAM_RATIO["Tanh"] + EPILOGUE_STREAM_RATIO["Softplus"]) * 2 * 4 * (1 << 16))


def test_gelu_forms_priced_apart():
    for attrs, key in (({}, "Gelu"), ({"approximate": "tanh"}, "GeluTanh")):
        g = conv_act("Gelu", attrs)
        act = g.nodes[-1]
        a = analyze_group(g, [act])
        assert a.base_flops == OPS_PER_ELEMENT[key] * act.outputs[0].size


def test_epilogue_of_a_deep_reduction_is_not_priced_so():
    """Past ``EPILOGUE_EXPOSED_MAX_DEPTH`` multiply-adds per output (bert_layer's MatMul, K = 768) the epilogue
    hides in part in the K loop and fusing measured faster: priced at its FLOPs. The planner keeps MatMul + Add +
    Gelu at both depths: at the bound the Gelu's arithmetic is priced alike in the Add + Gelu kernel apart."""
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
        assert groups_of(comp) == [("MatMul", "Add", "Gelu")], (k, groups_of(comp))  # fused either way (see below)


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
