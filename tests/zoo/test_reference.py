"""Every zoo model gives the same outputs in our reference executor and in onnxruntime."""
import numpy as np
import pytest

from opfuse import zoo
from opfuse.runtime.reference import random_inputs, run

ort = pytest.importorskip("onnxruntime")

# The bound: max abs error <= REL_TOLERANCE * max(1, largest |output|).
REL_TOLERANCE = 1e-4
INPUT_SEEDS = (0, 7)


@pytest.mark.parametrize("name", zoo.list_models())
def test_reference_matches_onnxruntime(name):
    graph = zoo.load(name)
    sess = ort.InferenceSession(zoo.build_onnx(name).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    output_names = [o.name for o in sess.get_outputs()]
    for seed in INPUT_SEEDS:
        feeds = random_inputs(graph, seed=seed)
        ours = run(graph, feeds)
        theirs = dict(zip(output_names, sess.run(None, feeds), strict=True))
        assert sorted(ours) == sorted(theirs)
        for key, expected in theirs.items():
            got = ours[key]
            assert got.shape == expected.shape and got.dtype == expected.dtype
            assert np.isfinite(got).all()
            err = float(np.abs(got.astype(np.float64) - expected).max())
            bound = REL_TOLERANCE * max(1.0, float(np.abs(expected).max()))
            assert err <= bound, f"{name} seed {seed} output {key}: max abs error {err:.3g} > {bound:.3g}"
