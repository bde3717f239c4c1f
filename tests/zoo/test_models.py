"""Properties every zoo model must have: valid ONNX, house conventions, determinism, sane numerics."""
import hashlib
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opfuse import zoo

MODELS = zoo.list_models()
# Models built from Conv + BatchNormalization (bert_layer normalises with LayerNorm instead).
BN_MODELS = [m for m in MODELS if m != "bert_layer"]
SOFTMAX_MODELS = ["ds_cnn", "mobilenet_v1_025_96", "resnet8"]

INPUT_SEED = 0
OTHER_INPUT_SEED = 1
# "Not degenerate": outputs vary across their elements and with the input by at least this much.
MIN_OUTPUT_SPREAD = 1e-3
# "Not exploding / not dead": the RMS of every activation tensor lies in this range for N(0, 1)
# inputs. The low end admits attention probabilities (1/128 each); the high end admits BERT's
# unscaled scores (sqrt(64) = 8 before the Div).
ACTIVATION_RMS_RANGE = (1e-3, 10.0)
# BatchNorm statistics the brief prescribes.
BN_GAMMA_RANGE = (0.5, 1.5)
BN_VAR_RANGE = (0.5, 1.5)
# Random N(0, 0.1) draws of >= 8 channels have a spread far above this; constants have none.
MIN_PARAM_SPREAD = 0.01


def _session(model):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _input(model, seed):
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal(dims).astype(np.float32)


def _initializers(model) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("name", MODELS)
def test_passes_the_full_onnx_checker(name):
    onnx.checker.check_model(zoo.build_onnx(name), full_check=True)


@pytest.mark.parametrize("name", MODELS)
def test_follows_the_zoo_conventions(name):
    m = zoo.build_onnx(name)
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 17)]
    assert m.ir_version == 8
    assert [i.name for i in m.graph.input] == ["input"]
    assert [o.name for o in m.graph.output] == ["output"]
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    names = [n.name for n in m.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert {t.data_type for t in m.graph.initializer} <= {TensorProto.FLOAT, TensorProto.INT64}


@pytest.mark.parametrize("name", MODELS)
def test_building_twice_gives_identical_bytes(name):
    first = zoo.MODELS[name].build().SerializeToString()
    assert zoo.MODELS[name].build().SerializeToString() == first
    assert zoo.build_onnx(name).SerializeToString() == first


def test_models_are_identical_across_processes():
    """Another interpreter (another hash seed) builds the same bytes: no set/dict-order leaks."""
    script = ("import hashlib; from opfuse import zoo\n"
              "for n in zoo.list_models(): print(n, hashlib.sha256(zoo.MODELS[n].build()"
              ".SerializeToString()).hexdigest())")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True,
                         text=True).stdout.split()
    theirs = dict(zip(out[::2], out[1::2], strict=True))
    ours = {n: hashlib.sha256(zoo.build_onnx(n).SerializeToString()).hexdigest() for n in MODELS}
    assert theirs == ours


@pytest.mark.parametrize("name", BN_MODELS)
def test_batchnorm_statistics_are_non_trivial(name):
    m = zoo.build_onnx(name)
    inits = _initializers(m)
    bns = [n for n in m.graph.node if n.op_type == "BatchNormalization"]
    assert bns
    for n in bns:
        gamma, beta, mean, var = (inits[i] for i in n.input[1:])
        assert BN_GAMMA_RANGE[0] <= gamma.min() and gamma.max() <= BN_GAMMA_RANGE[1], n.name
        assert BN_VAR_RANGE[0] <= var.min() and var.max() <= BN_VAR_RANGE[1], n.name
        for a in (gamma, beta, mean, var):
            assert a.std() > MIN_PARAM_SPREAD, n.name


def test_layernorm_parameters_are_non_trivial():
    inits = _initializers(zoo.build_onnx("bert_layer"))
    for ln in ("attention_ln", "output_ln"):
        assert inits[f"{ln}.weight"].std() > MIN_PARAM_SPREAD
        assert inits[f"{ln}.bias"].std() > MIN_PARAM_SPREAD


@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_output_is_finite_and_not_degenerate(name):
    m = zoo.build_onnx(name)
    sess = _session(m)
    y = sess.run(None, {"input": _input(m, INPUT_SEED)})[0]
    y_other = sess.run(None, {"input": _input(m, OTHER_INPUT_SEED)})[0]
    declared = [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    assert list(y.shape) == declared
    assert np.isfinite(y).all()
    assert y.std() > MIN_OUTPUT_SPREAD
    assert np.abs(y - y_other).max() > MIN_OUTPUT_SPREAD
    if name in SOFTMAX_MODELS:
        np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_every_activation_stays_order_one(name):
    """Run ORT with every node output exposed: nothing dies out or blows up through the depth."""
    m = zoo.build_onnx(name)
    names = [o for n in m.graph.node for o in n.output]
    del m.graph.output[:]
    m.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in names)
    values = _session(m).run(None, {"input": _input(m, INPUT_SEED)})
    lo, hi = ACTIVATION_RMS_RANGE
    for o, v in zip(names, values, strict=True):
        rms = float(np.sqrt(np.mean(np.square(v, dtype=np.float64))))
        assert lo < rms < hi, f"{name}: activation '{o}' has RMS {rms:.3g}"
