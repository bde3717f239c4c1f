"""Opset 24+ attention ops imported as ops opfuse has (``frontend/onnx_attention_ops.py``), against
``onnx.reference`` in the reference executor, fused C and portable C."""
import numpy as np
import pytest

from misc_ops_support import check_against_onnx_reference, one_node_model
from opfuse.errors import ModelError
from opfuse.frontend.onnx import import_model

RNG = np.random.default_rng(24)


@pytest.mark.parametrize("cache,update,attrs,write", [
    ((2, 3, 6, 4), (2, 3, 2, 4), {"mode": "linear"}, [1, 4]),
    ((2, 3, 6, 4), (2, 3, 3, 4), {"mode": "circular"}, [5, 2]),
    ((3, 5, 2), (3, 2, 2), {"axis": 1}, [0, 3, 1]),
    ((2, 4, 3), (2, 4, 3), {}, None),                     # prefill: no write indices, the whole cache
])
def test_tensor_scatter_matches_the_onnx_reference(cache, update, attrs, write):
    feeds = {"past": RNG.standard_normal(cache).astype(np.float32),
             "update": RNG.standard_normal(update).astype(np.float32)}
    if write is not None:
        feeds["write"] = np.array(write, np.int64)
    g, plan = check_against_onnx_reference(one_node_model("TensorScatter", feeds, attrs, opset=24), feeds, 0, 0)
    assert "ScatterElements" in [n.op_type for n in g.nodes]


def test_tensor_scatter_on_the_batch_axis_is_refused():
    feeds = {"past": np.zeros((4, 3), np.float32), "update": np.zeros((2, 3), np.float32)}
    with pytest.raises(ModelError, match="the sequence axis comes after the batch axis"):
        import_model(one_node_model("TensorScatter", feeds, {"axis": 0}, opset=24))
