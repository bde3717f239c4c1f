"""The Python face as the README shows it: opfuse.load, opfuse.compile, report, export_c."""
import json

import numpy as np
import pytest

import opfuse
from opfuse.compiler import CompileOptions, plan_model
from opfuse.errors import InputError, OpfuseError
from opfuse.runtime.reference import random_inputs, run


def test_compile_run_report_export(tmp_path):
    model = opfuse.compile("zoo:resnet8", target="host", fuse=True)
    g = opfuse.load("zoo:resnet8")
    feeds = random_inputs(g, 3)
    np.testing.assert_allclose(model.run(feeds)["output"], run(g, feeds)["output"], rtol=1e-4, atol=1e-5)
    rep = model.report
    assert rep["kernels_before"] == 30 and rep["kernels_after"] < 30
    assert 0 < rep["eta"] < 1 and rep["predicted_latency_s"] > 0
    assert rep["arena_bytes"] >= rep["arena_lower_bound_bytes"] > 0
    files = {p.name for p in model.export_c(tmp_path)}
    assert {"model.c", "model.h", "report.json"} <= files
    assert json.loads((tmp_path / "report.json").read_text())["kernels_after"] == rep["kernels_after"]
    with pytest.raises(InputError, match="input"):
        model.run({"input": np.zeros((1, 3, 8, 8), np.float32)})


def test_unfused_compile_is_one_kernel_per_op():
    model = opfuse.compile("zoo:ds_cnn", fuse=False)
    assert model.report["kernels_after"] == model.report["kernels_before"]


def test_plan_model_for_a_microcontroller_target():
    comp = plan_model("zoo:resnet8", CompileOptions(target="cortex-m7", planner="exact"))
    assert comp.report["planner"]["optimal"] and comp.report["target"] == "cortex-m7"
    assert "fusion report: resnet8" in comp.fusion_report.to_text()
    assert "not merged" in comp.fusion_report.explain_text()


def test_gpu_targets_are_planned_not_built():
    with pytest.raises(OpfuseError, match="planned .* use target 'host' or 'cortex-m7'"):
        opfuse.compile("zoo:resnet8", target="a100")


def test_unknown_planner_is_a_clear_error():
    with pytest.raises(OpfuseError, match="planner"):
        CompileOptions(planner="magic")


def test_serialized_onnx_bytes_are_a_model():
    """``opfuse.compile(model_proto.SerializeToString())`` as onnxruntime takes bytes (it was a TypeError)."""
    from opfuse import zoo
    proto = zoo.build_onnx("resnet8")
    for data in (proto.SerializeToString(), bytearray(proto.SerializeToString())):
        model = opfuse.compile(data, threads=1)
        feeds = random_inputs(model.graph, 0)
        want = run(opfuse.load(proto), feeds)
        for k, v in model.run(feeds).items():
            np.testing.assert_allclose(v, want[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model,needle", [(None, "not NoneType"), (123, "not int"), (3.5, "not float"),
                                          (b"\x00garbage", "not a valid ONNX model"), (b"", "is empty")])
def test_what_is_not_a_model_is_one_model_error(model, needle):
    for fn in (opfuse.compile, plan_model, opfuse.load):
        with pytest.raises(OpfuseError, match=needle) as e:
            fn(model)
        assert "\n" not in str(e.value) and e.value.exit_code == 2
