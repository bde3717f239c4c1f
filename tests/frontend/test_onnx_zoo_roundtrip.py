"""Every zoo model survives import -> export: valid ONNX, same outputs in onnxruntime, and the
re-imported graph is the same graph."""
import pytest

from onnx_builders import assert_close, check_onnx, ort_run
from opfuse import zoo
from opfuse.frontend.onnx import export_model, import_model
from opfuse.runtime.reference import random_inputs, run

ZOO = [getattr(m, "name", m) for m in zoo.list_models()]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_round_trips(name):
    original = zoo.build_onnx(name)
    g = import_model(original)
    feeds = random_inputs(g, 0)
    ours = run(g, feeds)
    exported = export_model(g)
    check_onnx(exported)
    assert_close(ort_run(exported, feeds), ours)
    assert_close(ort_run(original, feeds), ours)
    assert str(import_model(exported)) == str(g)
