"""The fused model as ONNX: one local function per fusion group, valid, and onnxruntime computes
the original model's outputs from it."""
import json

import numpy as np
import onnx
import pytest

from opfuse.api import onnx_proto
from opfuse.compiler import plan_model
from opfuse.frontend.onnx_fused import FUNCTION_DOMAIN, GROUPS_METADATA_KEY, function_name
from opfuse.runtime.reference import random_inputs

ort = pytest.importorskip("onnxruntime")


def _ort_run(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("model", ["zoo:resnet8", "zoo:bert_layer"])
def test_fused_onnx_has_a_function_per_group_and_runs_like_the_original(model, tmp_path):
    comp = plan_model(model)
    path = tmp_path / "fused.onnx"
    comp.save_onnx(path)
    fused = onnx.load(str(path))
    onnx.checker.check_model(fused, full_check=True)

    multi = [(i, g) for i, g in enumerate(comp.plan.groups, 1) if len(g.nodes) > 1]
    assert multi, "the zoo model fuses"
    names = {f.name for f in fused.functions}
    assert names == {function_name(g, i) for i, g in multi}
    calls = {n.name: n for n in fused.graph.node if n.domain == FUNCTION_DOMAIN}
    for i, g in multi:
        call = calls[g.name]
        assert call.op_type == function_name(g, i) and call.op_type.startswith(g.attrs["rule"] + "_")
        assert "kernels" in call.doc_string and "eta" in call.doc_string
    figures = json.loads({p.key: p.value for p in fused.metadata_props}[GROUPS_METADATA_KEY])
    assert figures[multi[0][1].name]["kernels_before"] >= 2

    feeds = random_inputs(comp.original, seed=0)
    want = _ort_run(onnx_proto(model), feeds)
    got = _ort_run(fused, feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(b).max())))


def test_function_names_read_rule_ops_and_place():
    comp = plan_model("zoo:resnet8")
    i, g = next((i, g) for i, g in enumerate(comp.plan.groups, 1) if g.op_types == ["Conv", "Relu"])
    assert function_name(g, i) == f"epilogue_Conv_Relu_{i}"


def test_compiled_model_save_onnx_carries_the_groups_figures(tmp_path):
    import opfuse
    model = opfuse.compile("zoo:ds_cnn", threads=1)
    path = tmp_path / "ds_cnn_fused.onnx"
    model.save_onnx(path)
    fused = onnx.load(str(path))
    onnx.checker.check_model(fused, full_check=True)
    calls = [n for n in fused.graph.node if n.domain == FUNCTION_DOMAIN]
    assert len(calls) == sum(1 for g in model.plan.groups if len(g.nodes) > 1) > 0
    assert all("predicted" in n.doc_string and "eta" in n.doc_string for n in calls)
    feeds = random_inputs(model.graph, seed=1)
    np.testing.assert_allclose(_ort_run(fused, feeds)[0], model.run(feeds)["output"], rtol=1e-4, atol=1e-5)
