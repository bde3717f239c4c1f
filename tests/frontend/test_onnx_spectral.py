"""DFT and STFT as a MatMul by a constant DFT matrix, MelWeightMatrix folded
(``frontend/onnx_spectral.py``), against ``onnx.reference`` in the reference executor, fused C and
portable C."""
import numpy as np
import pytest

from misc_ops_support import check_against_onnx_reference, one_node_model
from opfuse.errors import ModelError, UnsupportedOpError
from opfuse.frontend import onnx_spectral
from opfuse.frontend.onnx import import_model

RNG = np.random.default_rng(5)


def _ints(**kw):
    return {k: np.array(v, np.int64) for k, v in kw.items()}


@pytest.mark.parametrize("shape,attrs,consts", [
    ((2, 8, 1), {}, {}),                                     # real input, axis -2
    ((2, 8, 2), {}, {}),                                     # complex input
    ((2, 8, 2), {"inverse": 1}, {}),
    ((2, 8, 1), {"onesided": 1}, {}),                        # rfft
    ((2, 5, 2), {"inverse": 1, "onesided": 1}, {}),          # irfft: 8 real samples
    ((3, 7, 4, 1), {}, _ints(length=np.array(10), axis=np.array(1))),  # zero-padded, another axis
    ((3, 7, 4, 2), {"onesided": 1}, _ints(length=np.array(5), axis=np.array(-3))),  # truncated
])
def test_dft_matches_the_onnx_reference(shape, attrs, consts):
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    inits = {"dft_length": consts["length"], "axis": consts["axis"]} if consts else {}
    m = one_node_model("DFT", feeds, attrs, opset=20, initializers=inits)
    g, plan = check_against_onnx_reference(m, feeds, rtol=1e-4, atol=1e-4)
    assert "DFT" not in [n.op_type for n in g.nodes] and "MatMul" in [n.op_type for n in g.nodes]


def test_dft_opset17_axis_attribute():
    feeds = {"x": RNG.standard_normal((4, 6, 2)).astype(np.float32)}
    check_against_onnx_reference(one_node_model("DFT", feeds, {"axis": 1}, opset=17), feeds, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [None, "input", "constant"])
@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_matches_the_onnx_reference(window, onesided):
    feeds = {"signal": RNG.standard_normal((2, 40, 1)).astype(np.float32)}
    inits = {"frame_step": np.array(6, np.int64)}
    win = np.hanning(8).astype(np.float32)
    if window == "input":
        feeds["window"] = win
    elif window == "constant":
        inits["window"] = win
    if window is None:
        inits["frame_length"] = np.array(8, np.int64)
    m = one_node_model("STFT", feeds, {"onesided": onesided}, opset=17, initializers=inits)
    # the operands in ONNX's order: signal, frame_step, window, frame_length
    m.graph.node[0].input[:] = ["signal", "frame_step", "window" if window else "",
                                "" if window else "frame_length"]
    check_against_onnx_reference(m, feeds, rtol=1e-4, atol=1e-4)


def test_mel_weight_matrix_is_a_constant():
    inits = {"n": np.array(8, np.int64), "L": np.array(64, np.int64), "sr": np.array(16000, np.int64),
             "lo": np.array(20.0, np.float32), "hi": np.array(8000.0, np.float32)}
    m = one_node_model("MelWeightMatrix", {}, {}, opset=17, initializers=inits)
    g, _ = check_against_onnx_reference(m, {}, c=False)
    assert g.nodes == [] or [n.op_type for n in g.nodes] == ["Identity"]


def test_dft_on_the_complex_axis_is_refused():
    feeds = {"x": np.zeros((2, 8, 2), np.float32)}
    m = one_node_model("DFT", feeds, {}, opset=20, initializers={"dft_length": np.array(8, np.int64),
                                                                 "axis": np.array(-1, np.int64)})
    with pytest.raises(ModelError, match="the last axis holds the real and imaginary parts"):
        import_model(m)


def test_a_dft_too_long_for_a_matrix_is_refused(monkeypatch):
    monkeypatch.setattr(onnx_spectral, "DFT_MATRIX_MAX_ELEMENTS", 100)
    feeds = {"x": np.zeros((1, 16, 1), np.float32)}
    with pytest.raises(UnsupportedOpError, match="16 x 32 DFT matrix is over the 100 elements"):
        import_model(one_node_model("DFT", feeds, {}, opset=20))


def test_stft_frame_longer_than_the_signal_is_refused():
    feeds = {"signal": np.zeros((1, 8, 1), np.float32)}
    m = one_node_model("STFT", feeds, {}, opset=17, initializers={"frame_step": np.array(2, np.int64),
                                                                  "frame_length": np.array(16, np.int64)})
    m.graph.node[0].input[:] = ["signal", "frame_step", "", "frame_length"]
    with pytest.raises(ModelError, match="frame_length 16 for a signal of length 8"):
        import_model(m)
