"""Roofline numbers on hand-computed cases, including the seed's exercises 7.1 and 7.2."""
import numpy as np
import pytest

from opfuse.cost import CostModel, Roofline, analyze_group, bandwidth_saving_rate
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.ops.elementwise import OPS_PER_ELEMENT
from opfuse.targets import HardwareProfile


def toy_profile(**kw) -> HardwareProfile:
    base = dict(name="toy", peak_flops={"float32": 1e9, "float16": 1e9}, mem_bandwidth=1e9,
                onchip_bytes=1 << 20, register_bytes=1024, vector_bytes=16, launch_overhead_s=1e-6)
    base.update(kw)
    return HardwareProfile(**base)


def test_roofline_formulas():
    r = Roofline(flops=1000, bytes=8000, peak_flops=1e9, bandwidth=1e9, overhead_s=1e-6)
    assert r.intensity == pytest.approx(0.125)
    assert r.ridge_point == 1.0
    assert r.t_compute == pytest.approx(1e-6) and r.t_memory == pytest.approx(8e-6)
    assert r.time == pytest.approx(9e-6)  # max(1 us, 8 us) + 1 us
    assert r.bound == "memory"
    assert r.attainable_flops == pytest.approx(0.125e9)  # min(P_peak, I * B)
    assert bandwidth_saving_rate(25, 100) == 0.75 and bandwidth_saving_rate(0, 0) == 0.0


def test_relu_group_cost_by_hand():
    b = GraphBuilder()
    x = b.input("x", (1000,))
    g = b.build(b.op("Relu", x))
    c = CostModel(toy_profile()).group_cost(g, g.nodes)
    assert c.flops == 1000 and c.bytes == 8000  # 1 FLOP/element; 4 B in + 4 B out
    assert c.t_compute == pytest.approx(1e-6) and c.t_memory == pytest.approx(8e-6)
    assert c.latency_s == pytest.approx(9e-6) and c.bound == "memory"
    assert c.intensity == pytest.approx(0.125) and c.ridge_point == pytest.approx(1.0)


def test_boundary_bytes_count_only_inputs_weights_and_outputs():
    n = 256
    b = GraphBuilder()
    x = b.input("x", (n,))
    w = b.const("w", np.ones(n, np.float32))
    y = b.op("Sigmoid", b.op("Mul", b.op("Relu", x), w))
    g = b.build(y)
    a = analyze_group(g, g.nodes)
    assert a.boundary_bytes == 3 * n * 4  # x, w, y: the two intermediates are free
    assert [v.name for v in a.inputs] == ["x", "w"] and a.outputs[0] is y
    assert a.base_flops == n * (1 + 1 + OPS_PER_ELEMENT["Sigmoid"]) and a.duplicated_flops == 0
    unfused = sum(analyze_group(g, [node]).boundary_bytes for node in g.nodes)
    assert unfused == (2 + 3 + 2) * n * 4


def test_escaping_intermediate_is_still_written():
    n = 100
    b = GraphBuilder()
    x = b.input("x", (n,))
    r = b.op("Relu", x)
    g = b.build(b.op("Sigmoid", r), r)
    assert analyze_group(g, g.nodes).boundary_bytes == 3 * n * 4


def conv_bn_relu_pool(n, c_in, c, h, w, dtype, pool):
    b = GraphBuilder("chain")
    x = b.input("x", (n, c_in, h, w), dtype)
    wt = b.const("w", np.zeros((c, c_in, 3, 3), dtype))
    y = b.op("Conv", x, wt, pads=[1, 1, 1, 1])
    params = [b.const(k, np.ones(c, dtype)) for k in ("scale", "bias", "mean", "var")]
    y = b.op("BatchNormalization", y, *params)
    y = b.op("Relu", y)
    y = b.op("MaxPool", y, **pool)
    return b.build(y)


def test_exercise_7_1_conv_bn_relu_maxpool_traffic():
    """Conv output 256x112x112x32 FP16: traffic unfused vs fully fused, and eta."""
    N, C, H, W, fp16 = 256, 32, 112, 112, 2
    c_in = 16
    g = conv_bn_relu_pool(N, c_in, C, H, W, np.float16, dict(kernel_shape=[2, 2], strides=[2, 2]))
    T = N * H * W * C * fp16  # the conv output: 205,520,896 B
    X = N * c_in * H * W * fp16  # conv input
    Wt = C * c_in * 3 * 3 * fp16
    P = 4 * C * fp16  # BN parameters
    pooled = T // 4
    unfused = (X + Wt + T) + (T + P + T) + (T + T) + (T + pooled)
    fused = X + Wt + P + pooled
    assert T == 205_520_896
    cm = CostModel(toy_profile(mem_bandwidth=900e9))
    un = cm.plan_cost(FusionPlan.unfused(g))
    whole = cm.plan_cost(FusionPlan(g, [FusionGroup("all", list(g.nodes), "conv_epilogue", g.nodes[0])]))
    assert un.boundary_bytes == un.unfused_bytes == unfused
    assert whole.boundary_bytes == fused
    assert whole.eta == pytest.approx(1 - fused / unfused)
    # The seed's view counts only the activation traffic after the conv writes T.
    act_unfused, act_fused = T + 2 * T + 2 * T + T + pooled, pooled
    assert 1 - act_fused / act_unfused == pytest.approx(0.96, abs=1e-3)
    # Memory time saved at 900 GB/s, and 2x2/2 pooling needs no on-chip buffer.
    assert (unfused - fused) / 900e9 == pytest.approx(1.370e-3, rel=1e-3)
    assert whole.groups[0].working_set_bytes == 0 and whole.groups[0].duplicated_flops == 0


def test_exercise_7_2_gemm_is_compute_bound_on_312_tflops_2_tbs():
    M, K, N, fp16 = 1024, 768, 512, 2
    b = GraphBuilder()
    a = b.input("a", (M, K), "float16")
    bm = b.input("b", (K, N), "float16")
    g = b.build(b.op("MatMul", a, bm))
    flops = 2 * M * K * N
    nbytes = (M * K + K * N + M * N) * fp16
    dev = toy_profile(name="ex72", peak_flops={"float16": 312e12}, mem_bandwidth=2e12, launch_overhead_s=0.0)
    c = CostModel(dev).group_cost(g, g.nodes)
    assert c.flops == flops == 805_306_368 and c.bytes == nbytes == 3_407_872
    assert c.intensity == pytest.approx(flops / nbytes) == pytest.approx(236.3, abs=0.05)
    assert c.ridge_point == pytest.approx(156.0)
    assert c.bound == "compute" and c.intensity > c.ridge_point
    assert c.latency_s == pytest.approx(flops / 312e12)


def test_overlapping_pool_recomputes_its_inlined_producer():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    y = b.op("MaxPool", b.op("Relu", x), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    g = b.build(y)
    a = analyze_group(g, g.nodes)
    n = 4 * 8 * 8
    # MaxPool reads 9 elements per output; Relu is recomputed at each read: 9 runs, 8 extra.
    assert a.base_flops == n + 9 * n and a.duplicated_flops == 8 * n
    assert a.working_set_bytes == 0  # recomputed, not buffered


def test_conv_epilogue_streams_and_overlapping_pool_buffers_the_conv_output():
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    g = conv_bn_relu_pool(1, 3, 8, 16, 16, np.float32, pool)
    conv, bn, relu, mp = g.nodes
    assert analyze_group(g, [conv, bn, relu]).working_set_bytes == 0  # epilogue: streamed
    a = analyze_group(g, g.nodes)
    assert [v.name for v in a.buffered] == [conv.output.name]
    assert a.working_set_bytes == 8 * 16 * 16 * 4


def test_spill_penalty_when_the_working_set_exceeds_on_chip():
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    g = conv_bn_relu_pool(1, 3, 8, 16, 16, np.float32, pool)
    ws = 8 * 16 * 16 * 4
    fits = CostModel(toy_profile(onchip_bytes=ws)).group_cost(g, g.nodes)
    spills = CostModel(toy_profile(onchip_bytes=ws - 1)).group_cost(g, g.nodes)
    assert fits.spill_bytes == 0 and not fits.spills
    assert spills.spill_bytes == 2 * ws  # the whole working set goes out and comes back
    assert spills.t_spill == pytest.approx(2 * ws / (1e9 * 0.5))
    assert spills.latency_s == pytest.approx(fits.latency_s + spills.t_spill)


def test_register_pressure_beyond_the_register_file_costs_compute():
    n = 64
    b = GraphBuilder()
    x = b.input("x", (n,))
    r, s, t = b.op("Relu", x), b.op("Sigmoid", x), b.op("Tanh", x)
    y = b.op("Add", b.op("Add", r, s), t)  # r, s, t all live before the adds
    g = b.build(y)
    a = analyze_group(g, g.nodes)
    assert a.register_pressure == 3 and a.stream_elements == n
    roomy = CostModel(toy_profile(register_bytes=64, vector_bytes=16)).group_cost(g, g.nodes)
    tight = CostModel(toy_profile(register_bytes=16, vector_bytes=16)).group_cost(g, g.nodes)
    assert tight.t_compute - roomy.t_compute == pytest.approx(2 * 2 * n / 1e9)  # 2 values spilled


def test_numa_remote_boundary_costs_latency_per_line_exercise_7_5():
    from opfuse.cost import NumaPlacement
    n = 1024
    b = GraphBuilder()
    x = b.input("x", (n,))
    r = b.op("Relu", x, name="producer")
    g = b.build(b.op("Sigmoid", r, name="consumer"))
    prof = toy_profile(numa_nodes=2, numa_local_latency_s=100e-9, numa_remote_latency_s=150e-9,
                       cache_line_bytes=64, memory_parallelism=4)
    place = NumaPlacement({"producer": 0, "consumer": 1})
    cm = CostModel(prof, placement=place)
    lines = n * 4 // 64
    consumer = cm.group_cost(g, [g.nodes[1]])  # reads r (node 0) remotely, writes locally
    assert consumer.remote_bytes == n * 4
    assert consumer.t_numa == pytest.approx(lines * 50e-9 / 4)
    assert cm.group_cost(g, [g.nodes[0]]).t_numa == 0
    fused = cm.group_cost(g, g.nodes)  # runs on the anchor's node (Sigmoid: most FLOPs)
    assert fused.t_numa == pytest.approx(lines * 50e-9 / 4)  # now x is the remote one
    same = CostModel(prof, placement=NumaPlacement({"producer": 1, "consumer": 1}))
    assert same.group_cost(g, [g.nodes[1]]).t_numa == 0


def test_plan_cost_totals_critical_path_and_peak_memory():
    n = 1000
    b = GraphBuilder()
    x = b.input("x", (n,))
    r, s = b.op("Relu", x), b.op("Sigmoid", x)
    g = b.build(b.op("Add", r, s))
    prof = toy_profile()
    pc = CostModel(prof).plan_cost(FusionPlan.unfused(g))
    lat = [c.latency_s for c in pc.groups]
    assert pc.total_latency_s == pytest.approx(sum(lat))
    assert pc.critical_path_s == pytest.approx(max(lat[0], lat[1]) + lat[2])
    assert pc.kernels == 3 and pc.eta == 0.0
    # Liveness on node order: at Sigmoid x, r and s are live (x dies there): 3 tensors.
    assert pc.peak_memory_bytes == 3 * n * 4
    assert pc.to_dict()["predicted_latency_s"] == pc.total_latency_s
    assert pc.to_dict()["groups"][0]["ops"] == ["Relu"]
