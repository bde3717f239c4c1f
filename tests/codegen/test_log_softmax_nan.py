"""LogSoftmax in C propagates NaN along its row, as the reference and onnxruntime do (through the
exp sum: the row max may skip a NaN, the shift it feeds does not)."""
import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


def test_log_softmax_row_with_a_nan_is_nan(cache_dir):
    b = GraphBuilder("lsm")
    g = b.build(b.op("LogSoftmax", b.input("x", (3, 8)), axis=-1))
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    x[1, 5] = np.nan
    got = build(g, cache_dir=cache_dir).run({"x": x})[g.outputs[0].name]
    want = reference.run(g, {"x": x})[g.outputs[0].name]
    assert np.isnan(want[1]).all() and np.isnan(got[1]).all()
    np.testing.assert_allclose(got[[0, 2]], want[[0, 2]], rtol=1e-5, atol=1e-6)
