"""Differential test: random graphs exported to ONNX run in onnxruntime with the reference's outputs.

One discrepancy between onnxruntime and the ONNX reference semantics (that opfuse follows) is
left out, with the reason next to its predicate in ``ort_compare.py``: Resize by scales with a
fractional output length in align_corners / pytorch_half_pixel mode.
"""
import pytest
from hypothesis import assume, given

from ort_compare import assert_close, check_onnx, known_ort_discrepancy, ort_run
from opfuse.errors import UnsupportedOpError
from opfuse.frontend.onnx import export_model
from opfuse.frontend.onnx_opsets import EXPORT_MAX_OPSET as MAX_OPSET, EXPORT_MIN_OPSET as MIN_OPSET, INTRODUCED_AT
from opfuse.runtime.reference import run
from opfuse.testing import ALL_OPS, focused_ops, graph_and_inputs, property_settings

# Older opsets write several ops differently (axes attributes, Split sizes, Softmax's 2-D
# coercion, expanded HardSwish/LayerNormalization/Gelu): each gets its own, smaller run.
OTHER_OPSETS = sorted({MIN_OPSET, 13, 18, MAX_OPSET} | set(INTRODUCED_AT.values()) - {17})


def _check_against_ort(graph, feeds, opset=None):
    assume(not known_ort_discrepancy(graph))
    try:
        model = export_model(graph, opset)
    except UnsupportedOpError as e:  # e.g. ArgMax's select_last_index=1 before 12, Trilu before 14: not comparable
        assume("cannot be written at opset" not in str(e) and "not an ONNX op at opset" not in str(e))
        raise
    check_onnx(model, graph)
    assert_close(run(graph, feeds), ort_run(model, feeds))


@property_settings(max_examples=120)
@given(graph_and_inputs(max_nodes=12, ops=ALL_OPS))
def test_reference_matches_onnxruntime(case):
    _check_against_ort(*case)


@pytest.mark.parametrize("opset", OTHER_OPSETS)
def test_reference_matches_onnxruntime_at_other_opsets(opset):
    @property_settings(max_examples=25)
    @given(graph_and_inputs(max_nodes=8, ops=ALL_OPS))
    def check(case):
        _check_against_ort(*case, opset=opset)

    check()


@pytest.mark.parametrize("op", sorted(ALL_OPS))
def test_each_op_matches_onnxruntime(op):
    """Graphs made (nearly) only of ``op``, so every op reaches onnxruntime in every run."""
    @property_settings(max_examples=8)
    @given(graph_and_inputs(max_nodes=5, ops=focused_ops(op)))
    def check(case):
        _check_against_ort(*case)

    check()
