"""TfIdfVectorizer as Gather / Equal / reductions / MatMul (``frontend/onnx_tfidf.py``), against
``onnx.reference`` in the reference executor, fused C and portable C."""
import numpy as np
import pytest

from misc_ops_support import check_against_onnx_reference, one_node_model
from opfuse.errors import UnsupportedOpError
from opfuse.frontend.onnx import import_model

RNG = np.random.default_rng(9)
POOL = dict(pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 3, 3], ngram_counts=[0, 4],  # 4 unigrams, 4 bigrams
            ngram_indexes=[0, 1, 2, 3, 4, 5, 6, 1])                                   # two n-grams share column 1


@pytest.mark.parametrize("shape,dtype", [((12,), np.int64), ((3, 9), np.int32)])
@pytest.mark.parametrize("mode,weights", [("TF", None), ("IDF", "w"), ("TFIDF", "w")])
@pytest.mark.parametrize("lengths,skip", [((1, 1), 0), ((2, 2), 3), ((1, 2), 2)])
def test_tfidf_matches_the_onnx_reference(shape, dtype, mode, weights, lengths, skip):
    attrs = dict(POOL, mode=mode, min_gram_length=lengths[0], max_gram_length=lengths[1], max_skip_count=skip)
    if weights:
        attrs["weights"] = [0.5, 1.0, 2.0, 0.25, 3.0, 1.5, 0.75]
    feeds = {"x": RNG.integers(2, 9, shape).astype(dtype)}
    check_against_onnx_reference(one_node_model("TfIdfVectorizer", feeds, attrs, opset=9), feeds, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["IDF", "TFIDF"])
def test_tfidf_without_weights_weighs_every_column_1(mode):
    """The ONNX reference fails without weights (``len(None)``); the definition says 1 each."""
    import opfuse
    feeds = {"x": RNG.integers(2, 9, (2, 10)).astype(np.int64)}
    attrs = dict(POOL, mode=mode, min_gram_length=1, max_gram_length=2, max_skip_count=1)
    ones = one_node_model("TfIdfVectorizer", feeds, dict(attrs, weights=[1.0] * 7), opset=9)
    check_against_onnx_reference(ones, feeds, c=False)
    want = opfuse.compile(ones).run(feeds)["y0"]
    got = opfuse.compile(one_node_model("TfIdfVectorizer", feeds, attrs, opset=9)).run(feeds)["y0"]
    np.testing.assert_array_equal(got, want)


def test_tfidf_string_pool_is_refused():
    feeds = {"x": np.zeros((4,), np.int64)}
    attrs = dict(mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0, pool_strings=["a", "b"],
                 ngram_counts=[0], ngram_indexes=[0, 1])
    with pytest.raises(UnsupportedOpError, match="a string pool"):
        import_model(one_node_model("TfIdfVectorizer", feeds, attrs, opset=9))
