"""LSTM, GRU and RNN in the reference executor, imported from ONNX at opsets 7, 14 and 22.

Two independent oracles: onnxruntime (layout 0 only; it implements sequence_lens, clip, every
activation with alpha/beta, input_forget and linear_before_reset) and ONNX's reference
implementation (which implements layout 1 but ignores sequence_lens, clip, non-default
activations and input_forget, so it only sees configurations without them).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from op_harness import assert_close
from opfuse.errors import InputError, OpfuseError, ShapeError, UnsupportedOpError
from opfuse.frontend.onnx import import_model
from opfuse.runtime.reference import run
from opfuse.testing.recurrent_cases import onnx_model, random_case

OPS = ["LSTM", "GRU", "RNN"]
CASES = 25
RTOL, ATOL = 1e-5, 1e-6


def _ours(case, opset=None):
    model = onnx_model(case, opset=opset)
    got = run(import_model(model), case.feeds())
    return [got[o.name] for o in model.graph.output]


def _ort(case):
    ort = pytest.importorskip("onnxruntime")
    model = onnx_model(case)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, case.feeds())


@pytest.mark.parametrize("op", OPS)
def test_random_configurations_match_onnxruntime(op):
    rng = np.random.default_rng({"LSTM": 11, "GRU": 12, "RNN": 13}[op])
    for _ in range(CASES):
        case = random_case(rng, op, layout=0)
        for got, want in zip(_ours(case), _ort(case), strict=True):
            assert_close(got, want, RTOL, ATOL)


@pytest.mark.parametrize("op", OPS)
def test_bidirectional_with_sequence_lens_and_clip(op):
    rng = np.random.default_rng(21)
    for _ in range(5):
        case = random_case(rng, op, layout=0, direction="bidirectional", seq_lens=True, clip=True,
                           sizes=(6, 3, 4, 5))
        case.num_outputs = 3 if op == "LSTM" else 2
        for got, want in zip(_ours(case), _ort(case), strict=True):
            assert_close(got, want, RTOL, ATOL)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_a_row_of_length_zero_ends_with_a_zero_state(op, direction):
    rng = np.random.default_rng(5)
    case = random_case(rng, op, layout=0, seq_lens=True, direction=direction, sizes=(4, 3, 2, 3))
    case.inputs[4][1] = 0
    case.num_outputs = 2
    y, y_h = _ours(case)
    assert not y[:, :, 1].any() and not y_h[:, 1].any()
    for got, want in zip((y, y_h), _ort(case), strict=True):
        assert_close(got, want, RTOL, ATOL)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [7, 14, 22])
def test_matches_onnx_reference_at_each_opset(op, opset):
    """Default activations, no sequence_lens or clip: what ``onnx.reference`` implements; layout 1
    from opset 14 (where it exists)."""
    rng = np.random.default_rng(opset)
    for k in range(6):
        case = random_case(rng, op, layout=k % 2 if opset >= 14 else 0, seq_lens=False, clip=False,
                           activations=False)
        case.attrs.pop("input_forget", None)
        model = onnx_model(case, opset=opset)
        want = ReferenceEvaluator(model).run(None, case.feeds())
        for got, w in zip(_ours(case, opset), want, strict=True):
            assert_close(got, w, RTOL, ATOL)


def _bad(op="LSTM", **change):
    rng = np.random.default_rng(3)
    case = random_case(rng, op, layout=0, sizes=(3, 2, 4, 5), direction="forward")
    for key, value in change.items():
        if key in ("W", "R", "B", "sequence_lens"):
            idx = ["X", "W", "R", "B", "sequence_lens"].index(key)
            case.inputs = (case.inputs + [None] * 5)[:max(len(case.inputs), idx + 1)]
            case.inputs[idx] = value
        else:
            case.attrs[key] = value
    return case


@pytest.mark.parametrize("change,error,message", [
    ({"W": np.zeros((1, 20, 3), np.float32)}, ShapeError, r"W must be float32\[1, 20, 4\]"),
    ({"R": np.zeros((1, 20, 5, 1), np.float32)}, ShapeError, "R must be 3-D"),
    ({"B": np.zeros((1, 20), np.float32)}, ShapeError, r"B must be float32\[1, 40\]"),
    ({"sequence_lens": np.array([3, 3], np.int64)}, ShapeError, r"sequence_lens must be int32\[2\]"),
    ({"hidden_size": 7}, ShapeError, "hidden_size=7"),
    ({"direction": "sideways"}, ShapeError, "direction 'sideways'"),
    ({"activations": ["Sigmoid", "Tanh"]}, ShapeError, "activations lists 2 functions"),
    ({"activations": ["Sigmoid", "Gelu", "Tanh"]}, UnsupportedOpError, "activation 'Gelu'"),
    ({"direction": "bidirectional"}, ShapeError, r"W must be float32\[2, 20, 4\]"),
])
def test_bad_models_are_refused_with_one_clear_error(change, error, message):
    case = _bad(**change)
    with pytest.raises(error, match=message) as info:
        import_model(onnx_model(case))
    assert isinstance(info.value, OpfuseError)
    assert "\n" not in str(info.value)


def test_sequence_lens_out_of_range_is_refused():
    """A run-time value: the input's fault (``InputError``, the C code's message), not the model's."""
    case = _bad(sequence_lens=np.array([2, 4], np.int32))
    with pytest.raises(InputError, match=r"node '.*': a sequence_lens value lies outside \[0, 3\]"):
        _ours(case)
