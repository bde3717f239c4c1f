"""Det's C kernel (``codegen/det.py``): LU with partial pivoting per matrix, against
``onnx.reference`` in the host and the portable C99 (``simd="none"``) builds."""
import numpy as np
import pytest

from opfuse.codegen.options import CodegenOptions
from opfuse.ops import GraphBuilder
from opfuse.runtime.native import build


def _det_model(shape, cache_dir, options=None):
    b = GraphBuilder("det")
    g = b.build(b.op("Det", b.input("x", shape), name="det"))
    return build(g, None, cache_dir=cache_dir, options=options)


@pytest.mark.parametrize("options", [None, CodegenOptions(simd="none")], ids=["host", "portable"])
@pytest.mark.parametrize("shape", [(4, 4), (3, 2, 7, 7), (5, 1, 1)])
def test_det_kernel_matches_numpy(cache_dir, options, shape):
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    got = next(iter(_det_model(shape, cache_dir, options).run({"x": x}).values()))
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_det_kernel_pivots_and_finds_singular_matrices(cache_dir):
    x = np.array([[[0, 1, 0], [0, 0, 1], [1, 0, 0]],    # a permutation: two swaps, det 1
                  [[0, 1, 0], [1, 0, 0], [0, 0, 1]],    # one swap: det -1
                  [[1, 2, 3], [2, 4, 6], [1, 1, 1]],    # rank 2
                  [[0, 0, 1], [0, 0, 2], [0, 0, 3]]],   # a zero column
                 np.float32)
    got = next(iter(_det_model(x.shape, cache_dir).run({"x": x}).values()))
    np.testing.assert_array_equal(got, np.array([1, -1, 0, 0], np.float32))
