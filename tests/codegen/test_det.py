"""Det's C kernel (``codegen/det.py``): LU with partial pivoting per matrix, against
``onnx.reference`` in the host and the portable C99 (``simd="none"``) builds."""
import numpy as np
import pytest

from opfuse.codegen.options import CodegenOptions
from opfuse.ops import GraphBuilder
from opfuse.runtime.native import build



def _det_model(shape, cache_dir, options=None):
    return build(_graph(shape), None, cache_dir=cache_dir, options=options)


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


@pytest.mark.parametrize("options", [None, CodegenOptions(simd="none")], ids=["host", "portable"])
def test_a_matrix_with_a_nan_or_infinite_entry_has_determinant_nan(cache_dir, options):
    """With an infinite entry the LU's result depends on its order of elimination: for fuzz seed 41213's 4 x 4
    matrix (one inf at [1, 2]) LAPACK gave inf and this kernel NaN (inf - inf in the third column). Both
    backends now give NaN for any matrix with a NaN or infinite entry, even behind a zero column (which
    stopped the kernel with 0 before it saw a NaN further right)."""
    from opfuse.runtime import reference
    x = np.array([[[7.72, -0.11, 0.23, 1.13], [-1.30, 9.82, np.inf, 1.80], [-1.78, -1.44, 9.15, -1.78],
                   [0.0, -0.58, 1.13, 7.79]],
                  [[0, 1, 2, 3], [0, 5, np.nan, 1], [0, 2, 1, 1], [0, 1, 1, 2]],
                  [[np.inf, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
                  [[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]], np.float32)
    model = _det_model(x.shape, cache_dir, options)
    got = next(iter(model.run({"x": x}).values()))
    want = next(iter(reference.run(_graph(x.shape), {"x": x}).values()))
    np.testing.assert_array_equal(got, np.array([np.nan, np.nan, np.nan, 2], np.float32))
    np.testing.assert_array_equal(want, got)


def _graph(shape):
    b = GraphBuilder("det")
    return b.build(b.op("Det", b.input("x", shape), name="det"))
