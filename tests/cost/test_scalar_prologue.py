"""Prologue ops that run in a reduction's scalar loop are priced at the scalar rate, so the planner
puts a Relu before a small global pooling into the convolution's epilogue instead (mobilenet's
Relu + 3x3 GlobalAveragePool measured 3x the two ops unfused)."""
import numpy as np
import pytest

from opfuse.compiler import CompileOptions, plan_model
from opfuse.cost import CostModel, analyze_group
from opfuse.cost.analysis import VECTORISED_REDUCTION_MIN_RUN
from opfuse.ops import GraphBuilder
from opfuse.targets import nominal_host_profile, save_profile

from test_roofline import toy_profile


def relu_gap(h: int, w: int):
    b = GraphBuilder("relu_gap")
    x = b.input("x", (1, 64, h, w))
    return b.build(b.op("GlobalAveragePool", b.op("Relu", x, name="relu"), name="gap"))


def test_relu_before_a_short_global_pool_is_priced_scalar():
    g = relu_gap(3, 3)  # 9 elements per output: the scalar loop
    a = analyze_group(g, g.nodes)
    assert a.scalar_flops == 64 * 9  # the Relu's FLOPs, each in the scalar loop
    p = toy_profile()  # 16-byte vectors: 4 lanes
    fused = CostModel(p).group_cost(g, g.nodes)
    assert fused.t_compute == pytest.approx((a.flops + 3 * a.scalar_flops) / 1e9)


def test_relu_before_a_long_global_pool_stays_vector_priced():
    g = relu_gap(8, 8)  # 64 >= VECTORISED_REDUCTION_MIN_RUN elements per output: the lane loop
    assert 64 >= VECTORISED_REDUCTION_MIN_RUN
    a = analyze_group(g, g.nodes)
    assert a.scalar_flops == 0
    c = CostModel(toy_profile()).group_cost(g, g.nodes)
    assert c.t_compute == pytest.approx(a.flops / 1e9)


def test_relu_before_maxpool_is_not_scalar_priced():
    """MaxPool applies a Relu once per output, after the max (codegen/pool.py), whatever the window."""
    b = GraphBuilder("relu_mp")
    x = b.input("x", (1, 8, 16, 16))
    g = b.build(b.op("MaxPool", b.op("Relu", x), kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    assert analyze_group(g, g.nodes).scalar_flops == 0


@pytest.mark.parametrize("op", ["Softmax", "LayerNormalization"])
def test_a_normalization_prologue_is_not_scalar_priced(op):
    """Softmax and LayerNormalization write as many elements as they read: their rows are not the
    short reduction's scalar loop, however few elements per output (bert_layer's attention: the
    scaled scores before Softmax were priced scalar and the attention kernel lost to the ops apart)."""
    b = GraphBuilder("norm")
    x = b.input("x", (1, 4, 16, 16))
    scaled = b.op("Mul", x, b.const("s", np.float32(0.125)))
    if op == "Softmax":
        y = b.op("Softmax", scaled, axis=-1)
    else:
        y = b.op("LayerNormalization", scaled, b.const("g", np.ones(16, np.float32)),
                 b.const("b", np.zeros(16, np.float32)), axis=-1)
    g = b.build(y)
    assert analyze_group(g, g.nodes).scalar_flops == 0


@pytest.mark.parametrize("vector_bytes, into_conv", [(64, True), (32, False)], ids=["avx512", "avx2"])
def test_planner_puts_the_relu_into_the_conv_not_the_small_pool(vector_bytes, into_conv, tmp_path):
    """The nominal host profile with AVX-512's 16 lanes: the scalar Relu in the pool (576 FLOPs at 16x) outweighs
    the pool's memory time, so it goes into the convolution; with AVX2's 8 lanes it hides under the pool's memory
    time (86 < 116 ns at the nominal 60 GFLOP/s and 22 GB/s) and the convolution runs alone (no extra op)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("conv_relu_gap")
    x = b.input("x", (1, 32, 3, 3))
    y = b.op("Conv", x, b.const("w", rng.standard_normal((64, 32, 1, 1)).astype(np.float32)), name="conv")
    g = b.build(b.op("GlobalAveragePool", b.op("Relu", y, name="relu"), name="gap"))
    profile = tmp_path / "host.json"
    save_profile(nominal_host_profile().with_overrides(vector_bytes=vector_bytes), profile)
    comp = plan_model(g, CompileOptions(target=str(profile), corrections=False))
    groups = {grp.name: [n.name for n in grp.nodes] for grp in comp.plan.groups}
    owner = next(name for name, members in groups.items() if "relu" in members)
    assert ("conv" in groups[owner]) is into_conv and ("gap" in groups[owner]) is not into_conv, groups
