"""Whole zoo CNNs quantized by onnxruntime's own quantizer in its QOperator format (QLinearConv, com.microsoft
QLinearAdd / QLinearAveragePool / QGemm / QLinearSoftmax ...): the C backend, unfused and fused, against
onnxruntime running the same q.onnx. Unfused: onnxruntime's integers exactly (the importer writes its kernels'
arithmetic). Fused: the ``qlinear_fixed_point`` rule requantizes the integer convs in fixed point, so each
8-bit output is within one step of onnxruntime's (on these inputs: equal)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import opfuse
from opfuse.api import onnx_proto
from opfuse.compiler import CompileOptions, plan_model
from opfuse.runtime import mcu
from opfuse.testing import ort_oracle

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
MODELS = {"resnet8": (1, 3, 32, 32), "ds_cnn": (1, 1, 49, 10), "mobilenet_v1_025_96": (1, 3, 96, 96)}
CACHE: dict = {}


def qoperator(name: str, signed: bool = False) -> onnx.ModelProto:
    """``name`` quantized by onnxruntime (QOperator, per channel, int8 weights, uint8 or int8 activations, 2 random
    calibration inputs), every graph output made its 8-bit form (the Softmax's quantized output)."""
    key = (name, signed)
    if key in CACHE:
        return CACHE[key]
    import tempfile

    f = onnx_proto(f"zoo:{name}")
    rng = np.random.default_rng(2)
    samples = [{f.graph.input[0].name: rng.standard_normal(MODELS[name]).astype(np.float32)} for _ in range(2)]

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    act = quantization.QuantType.QInt8 if signed else quantization.QuantType.QUInt8
    with tempfile.TemporaryDirectory() as d:
        onnx.save_model(f, f"{d}/f.onnx")
        quantization.quantize_static(f"{d}/f.onnx", f"{d}/q.onnx", Reader(),
                                     quant_format=quantization.QuantFormat.QOperator, per_channel=True,
                                     activation_type=act, weight_type=quantization.QuantType.QInt8)
        m = onnx.load(f"{d}/q.onnx")
    # the output as the 8-bit tensor the last DequantizeLinear reads
    (dq,) = [n for n in m.graph.node if n.output[0] == m.graph.output[0].name]
    elem = onnx.TensorProto.INT8 if signed else onnx.TensorProto.UINT8
    m.graph.output.append(onnx.helper.make_tensor_value_info(dq.input[0], elem, None))
    CACHE[key] = m
    return m


def _ort(m, feeds):
    """onnxruntime's outputs, its uint8 x int8 products exact on every CPU (``ort_oracle.u8_weights``)."""
    return ort_oracle.run(m, feeds)


@pytest.mark.parametrize("name, signed", [("resnet8", False), ("ds_cnn", False), ("mobilenet_v1_025_96", False),
                                          ("resnet8", True)])
def test_qoperator_model_in_c_matches_onnxruntime(name, signed):
    m = qoperator(name, signed)
    assert any(n.domain == "com.microsoft" for n in m.graph.node)
    x = {m.graph.input[0].name: np.random.default_rng(9).standard_normal(MODELS[name]).astype(np.float32)}
    theirs = _ort(m, x)
    q_out = m.graph.output[1].name
    unfused, fused = opfuse.compile(m, fuse=False).run(x), opfuse.compile(m).run(x)
    np.testing.assert_array_equal(unfused[q_out], theirs[q_out])
    assert np.abs(fused[q_out].astype(int) - theirs[q_out].astype(int)).max() <= 1
    plan = plan_model(m, CompileOptions())
    assert plan.plan.num_kernels < plan_model(m, CompileOptions(fuse=False)).plan.num_kernels
    assert "Requantize" in {n.op_type for n in plan.graph.nodes}  # the integer convs, as for a QDQ model


@pytest.mark.slow
@pytest.mark.skipif(not mcu.tools_available(), reason="the Cortex-M7 toolchain or QEMU is not installed")
def test_qoperator_resnet8_on_the_cortex_m7_matches_onnxruntime(tmp_path):
    m = qoperator("resnet8")
    x = {m.graph.input[0].name: np.random.default_rng(9).standard_normal(MODELS["resnet8"]).astype(np.float32)}
    theirs = _ort(m, x)
    comp = plan_model(m, CompileOptions(target="cortex-m7"))
    res = mcu.run_on_qemu(mcu.generate_mcu(comp.graph, comp.plan, comp.memory), x, tmp_path)
    q_out = m.graph.output[1].name
    assert np.abs(res.outputs[q_out].astype(int) - theirs[q_out].astype(int)).max() <= 1
