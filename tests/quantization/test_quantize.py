"""Post-training static quantization (``opfuse.quantization``): the QDQ model, its scales, its determinism,
its calibration methods, and onnxruntime running it."""
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import opfuse
from opfuse.api import onnx_proto
from opfuse.errors import InputError, ModelError
from opfuse.quantization import quantize
from opfuse.quantization.calibration import entropy_range, kl_divergence_of_clip, percentile_range, without_zeros
from opfuse.quantization.params import activation_params, quantize_bias, quantize_weight

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def r8():
    return quantize("zoo:resnet8", calibration_random=8)


def _inits(model):
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _session(model):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_onnxruntime_runs_the_qdq_model_close_to_the_float_one(r8):
    x = {"input": np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    q = _session(r8.model).run(None, x)[0]
    f = _session(onnx_proto("zoo:resnet8")).run(None, x)[0]
    cos = float((q * f).sum() / np.linalg.norm(q) / np.linalg.norm(f))
    assert cos > 0.999 and q.argmax() == f.argmax()


def test_weights_are_per_channel_int8_after_bn_folding(r8):
    ops = [n.op_type for n in r8.model.graph.node]
    assert "BatchNormalization" not in ops
    inits = _inits(r8.model)
    folded = {v.name: v.const for v in r8.fused_graph.constants}
    conv = next(w for w in r8.weights if w["node"] == "conv1")
    assert conv["axis"] == 0 and conv["channels"] == 16 and conv["bias"] == "int32"
    q, s = inits[f"{conv['weight']}_quantized"], inits[f"{conv['weight']}_scale"]
    assert q.dtype == np.int8 and s.shape == (16,) and int(np.abs(q).max()) == 127
    w = folded[conv["weight"]]  # the folded W * gamma / sqrt(var + eps), not the original Conv weight
    np.testing.assert_allclose(s, np.abs(w).reshape(16, -1).max(axis=1) / 127, rtol=1e-6)
    np.testing.assert_allclose(q * s.reshape(-1, 1, 1, 1), w, atol=float(s.max()) / 2 + 1e-7)
    fc = next(w for w in r8.weights if w["op"] == "Gemm")
    assert fc["axis"] == 0 and fc["channels"] == 10  # transB=1: W is (N, K)


def test_bias_is_int32_with_the_product_scale(r8):
    inits = _inits(r8.model)
    conv = next(w for w in r8.weights if w["node"] == "stack1_conv1")
    node = next(n for n in r8.model.graph.node if n.name == "stack1_conv1")
    bias_dq = next(n for n in r8.model.graph.node if n.output[0] == node.input[2])
    bq, bs = inits[bias_dq.input[0]], inits[bias_dq.input[1]]
    x_scale = r8.activations["conv1_relu"].scale
    assert bq.dtype == np.int32
    np.testing.assert_array_equal(bs, np.float32(x_scale) * inits[f"{conv['weight']}_scale"])


def test_only_tensors_that_exist_after_fusion_get_scales(r8):
    assert "conv1_relu" in r8.activations and "input" in r8.activations
    assert "conv1_bn" not in r8.activations  # the Conv output that its Relu consumes inside the kernel
    assert r8.inherited == {"fc_flatten": "pool"}  # Flatten carries pool's scale
    assert "output" in r8.kept_float and "output" not in r8.activations
    q_inputs = {n.input[0] for n in r8.model.graph.node if n.op_type == "QuantizeLinear"}
    assert q_inputs == set(r8.activations)


def test_relu_outputs_use_the_whole_range():
    r = quantize("zoo:ds_cnn", calibration_random=4, activation_type="uint8")
    p = r.activations["conv1_relu"]
    assert p.zero_point == 0 and p.dtype == np.uint8
    assert quantize("zoo:ds_cnn", calibration_random=4).activations["conv1_relu"].zero_point == -128


def test_the_same_inputs_give_the_same_bytes():
    a = quantize("zoo:ds_cnn", calibration_random=4, method="entropy")
    b = quantize("zoo:ds_cnn", calibration_random=4, method="entropy")
    assert a.model.SerializeToString() == b.model.SerializeToString()


def test_percentile_and_entropy_clip_inside_minmax():
    ranges = {m: quantize("zoo:ds_cnn", calibration_random=4, method=m).ranges
              for m in ("minmax", "percentile", "entropy")}
    for t, mm in ranges["minmax"].items():
        for m in ("percentile", "entropy"):
            r = ranges[m][t]
            assert mm.lo <= r.lo <= 0 <= r.hi <= mm.hi
    assert any(ranges["entropy"][t].hi < ranges["minmax"][t].hi for t in ranges["minmax"])


def test_calibration_from_a_file_matches_the_same_samples_in_memory(tmp_path):
    xs = np.random.default_rng(1).standard_normal((3, 1, 1, 49, 10)).astype(np.float32)
    np.savez(tmp_path / "cal.npz", input=xs)
    a = quantize("zoo:ds_cnn", str(tmp_path / "cal.npz"))
    b = quantize("zoo:ds_cnn", [{"input": x} for x in xs])
    c = quantize("zoo:ds_cnn", {"input": xs.reshape(3, 1, 49, 10)})  # stacked along the batch axis
    assert a.model.SerializeToString() == b.model.SerializeToString() == c.model.SerializeToString()
    assert a.samples == 3


def test_weight_quantization_matches_onnxruntimes_quantizer(tmp_path):
    """The peer: onnxruntime's quantize_static, per channel, on the same BN-folded float model."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static
    ours = quantize("zoo:ds_cnn", calibration_random=4)
    from opfuse.frontend.onnx import export_model
    onnx.save_model(export_model(ours.fused_graph), tmp_path / "f.onnx")
    samples = [{"input": opfuse.runtime.reference.random_inputs(ours.fused_graph, 1_000_000 + i)["input"]}
               for i in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    theirs = _inits(onnx.load(tmp_path / "q.onnx"))
    mine = _inits(ours.model)
    for w in ours.weights:
        name = w["weight"]
        tq = next(v for k, v in theirs.items() if k.startswith(name) and v.dtype == np.int8 and v.ndim > 1)
        assert np.abs(tq.astype(int) - mine[f"{name}_quantized"].astype(int)).max() <= 1, name
    # the input's per-tensor int8 scale and zero point from min/max agree too
    ts = next(v for k, v in theirs.items() if k.startswith("input_scale"))
    tz = next(v for k, v in theirs.items() if k.startswith("input_zero_point"))
    assert np.isclose(float(ts), float(ours.activations["input"].scale), rtol=1e-6)
    assert int(tz) == ours.activations["input"].zero_point


def test_activation_params_hold_zero_exactly():
    p = activation_params(-1.0, 3.0, np.dtype(np.int8))
    assert p.fake_quantize(np.array([0.0], np.float32))[0] == 0.0
    assert activation_params(0.0, 0.0, np.dtype(np.int8)).scale == 1.0


def test_weight_and_bias_quantization_round_trip():
    w = np.array([[1.0, -0.5], [0.0, 0.0]], np.float32)
    q, s = quantize_weight(w, 0)
    np.testing.assert_array_equal(q, [[127, -64], [0, 0]])  # -63.5 rounds half to even
    assert s[1] == 1.0  # an all-zero channel
    bq, bs = quantize_bias(np.array([0.5, 1e12], np.float32), np.float32(0.01), s)
    assert bq[0] == round(0.5 / bs[0]) and bq[1] == np.iinfo(np.int32).max  # saturated


def test_percentile_and_kl_cut_an_outlier_off_a_half_normal():
    x = np.append(np.abs(np.random.default_rng(0).standard_normal(200_000)), 20.0)  # one outlier at 20
    e = np.linspace(0.0, 20.0, 2049)
    h = np.histogram(x, e)[0]
    hist, edges = np.concatenate([h, h]), np.concatenate([e, e])
    lo, hi = percentile_range(hist, edges, 99.99, nonnegative=True)
    assert lo == 0.0 and 3.7 < hi < 4.2  # the 99.99th percentile of |N(0, 1)| is 3.89
    lo, hi = entropy_range(hist, edges, nonnegative=True)
    assert lo == 0.0 and 3.0 < hi < 6.0
    assert kl_divergence_of_clip(h, 2048, 256) > kl_divergence_of_clip(h, int(hi / 20 * 2048), 256)


def test_the_zeros_of_a_relu_do_not_decide_its_threshold():
    """Half the values exactly 0 (a ReLU): with them left out, the threshold is the one of the
    positive half alone; left in, their spike would be blamed on every wide range."""
    x = np.abs(np.random.default_rng(1).standard_normal(100_000))
    e = np.linspace(0.0, float(x.max()), 2049)
    h = np.histogram(x, e)[0]
    relu = np.histogram(np.concatenate([x, np.zeros(100_000)]), e)[0]
    alone = entropy_range(np.concatenate([h, h]), np.concatenate([e, e]), nonnegative=True)
    both = np.concatenate([relu, relu])
    kept = without_zeros(both, np.concatenate([e, e]), 100_000)
    np.testing.assert_array_equal(kept, np.concatenate([h, h]))
    assert entropy_range(kept, np.concatenate([e, e]), nonnegative=True) == alone
    assert entropy_range(both, np.concatenate([e, e]), nonnegative=True)[1] < alone[1]


def test_a_flat_histogram_has_nothing_to_lose_and_keeps_its_range():
    e = np.linspace(0.0, 1.0, 2049)
    h = np.zeros(2048, np.int64)
    h[:1024] = 1000
    h[2047] = 1
    assert kl_divergence_of_clip(h, 2048, 256) == 0.0  # every level spreads its mass as it was
    assert entropy_range(np.concatenate([h, h]), np.concatenate([e, e]), nonnegative=True) == (0.0, 1.0)


# Refusals -----------------------------------------------------------------------------------------

def test_exactly_one_calibration_source():
    with pytest.raises(InputError, match="exactly one"):
        quantize("zoo:ds_cnn")
    with pytest.raises(InputError, match="exactly one"):
        quantize("zoo:ds_cnn", {"input": np.zeros((1, 1, 1, 49, 10), np.float32)}, calibration_random=2)


@pytest.mark.parametrize("arrays, match", [
    ({"x": np.zeros((2, 1, 1, 49, 10), np.float32)}, "no samples for input"),
    ({"input": np.zeros((2, 1, 49, 11), np.float32)}, "has shape"),
    ({"input": np.zeros((0, 1, 1, 49, 10), np.float32)}, "no samples"),
    ({"input": np.full((1, 1, 1, 49, 10), np.nan, np.float32)}, "NaN"),
    ({"input": np.zeros((1, 1, 1, 49, 10), np.float32), "extra": np.zeros(1)}, "unknown input"),
])
def test_bad_calibration_data_is_refused(arrays, match):
    with pytest.raises(InputError, match=match):
        quantize("zoo:ds_cnn", arrays)


def test_unknown_method_and_type_are_refused():
    with pytest.raises(InputError, match="method"):
        quantize("zoo:ds_cnn", calibration_random=1, method="mse")
    with pytest.raises(InputError, match="activation type"):
        quantize("zoo:ds_cnn", calibration_random=1, activation_type="int4")


def test_a_quantized_model_is_refused(r8):
    with pytest.raises(ModelError, match="already quantized"):
        quantize(r8.model, calibration_random=1)


def _linear_model(bias_readers: int = 1):
    """x [1, 4, 8] -> MatMul(W 8x5) -> Add(b) -> Relu -> y: an exported Linear (the bias in the Add after the
    MatMul); ``bias_readers=2`` also reads the product elsewhere."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["p"], name="mm"), helper.make_node("Add", ["p", "b"], ["pb"],
                                                                                       name="bias"),
             helper.make_node("Relu", ["pb"], ["y"], name="relu")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5])]
    if bias_readers == 2:
        nodes.append(helper.make_node("Neg", ["p"], ["side"], name="neg"))
        outputs.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, [1, 4, 5]))
    g = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                          outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_matmul_bias_add_is_an_int32_constant_with_the_product_scale():
    """The Add of a constant vector that alone reads a MatMul's product: its bias, quantized as a Gemm's (int32,
    scale x_scale * w_scale per column) behind a DequantizeLinear that the Add reads."""
    r = quantize(_linear_model(), calibration_random=4)
    (mm,) = r.weights
    assert mm["op"] == "MatMul" and mm["bias"] == "int32"
    inits = _inits(r.model)
    add = next(n for n in r.model.graph.node if n.op_type == "Add")
    dq = next(n for n in r.model.graph.node if n.op_type == "DequantizeLinear" and add.input[1] in n.output)
    b_q, b_s = inits[dq.input[0]], inits[dq.input[1]]
    x_s = inits[next(n for n in r.model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x").input[1]]
    w_s = inits[f"{mm['weight']}_scale"]
    assert b_q.dtype == np.int32 and b_q.shape == (5,)
    np.testing.assert_allclose(b_s, np.float32(x_s) * w_s, rtol=1e-6)
    b = _inits(_linear_model())["b"]
    np.testing.assert_allclose(b_q * b_s, b, atol=float(b_s.max()))


def test_a_product_read_elsewhere_keeps_its_add_in_float():
    r = quantize(_linear_model(bias_readers=2), calibration_random=4)
    (mm,) = r.weights
    assert mm["bias"] is None
    add = next(n for n in r.model.graph.node if n.op_type == "Add")
    assert add.input[1] == "b"
