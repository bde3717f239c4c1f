"""TopK, CumSum/CumProd, ScatterND and ScatterElements kernels (``codegen/topk.py``, ``scan.py``,
``scatter.py``) on the cases their docstrings single out, against the reference executor: NaN as the largest
value, ties in index order, a TopK whose values (or indices) are not used, the smallest k along an inner axis;
every flag of CumSum on an inner axis; every reduction of the scatters with negative and repeated indices. One
graph, one compile."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

I64 = np.int64


def _graph():
    b = GraphBuilder("select_ops")
    x = b.input("x", (2, 7, 5))
    k3 = b.const("k3", np.array([3], I64))
    outs = {}
    outs["top_vals"], outs["top_idx"] = b.op("TopK", x, k3, axis=1, num_outputs=2, name="top")
    outs["low_vals"], outs["low_idx"] = b.op("TopK", x, b.const("k4", np.array([4], I64)), axis=-1, largest=0,
                                             num_outputs=2, name="low")
    _, outs["idx_only"] = b.op("TopK", x, k3, axis=0 + 2, num_outputs=2, name="idx_only")
    outs["vals_only"], _ = b.op("TopK", x, k3, axis=2, num_outputs=2, name="vals_only")
    outs["all_vals"], outs["all_idx"] = b.op("TopK", x, b.const("k7", np.array([7], I64)), axis=1, num_outputs=2,
                                             name="all")
    axis1 = b.const("axis1", np.array(1, I64))
    for excl in (0, 1):
        for rev in (0, 1):
            outs[f"cumsum_{excl}{rev}"] = b.op("CumSum", x, axis1, exclusive=excl, reverse=rev,
                                               name=f"cumsum_{excl}{rev}")
    outs["cumsum_neg_axis"] = b.op("CumSum", x, b.const("axism1", np.array([-1], I64)), name="cumsum_neg_axis")
    outs["cumprod_excl"] = b.op("CumProd", x, b.const("axis2", np.array(2, I64)), exclusive=1, name="cumprod_excl")
    nd_idx = b.const("nd_idx", np.array([[1, 2], [0, -1], [1, 2], [-2, 0]], I64))
    nd_upd = b.input("nd_upd", (4, 5))
    for red in ("none", "add", "mul", "max", "min"):
        idx = b.const(f"nd_idx_{red}", np.array([[1, 2], [0, -1], [-2, 0]], I64)) if red == "none" else nd_idx
        upd = b.input(f"nd_upd_{red}", (3, 5)) if red == "none" else nd_upd
        outs[f"nd_{red}"] = b.op("ScatterND", x, idx, upd, reduction=red, name=f"nd_{red}")
    el_idx = b.const("el_idx", np.array([[[0, -1, 2, 6, -7]], [[3, 3, -4, 0, 1]]], I64))
    el_upd = b.input("el_upd", (2, 1, 5))
    for red in ("none", "add", "mul", "max", "min"):
        outs[f"el_{red}"] = b.op("ScatterElements", x, el_idx if red != "none" else
                                 b.const("el_idx_u", np.array([[[0, -1, 2, 6, -7]], [[3, 5, -4, 0, 1]]], I64)),
                                 el_upd, axis=1, reduction=red, name=f"el_{red}")
    return b.build(*outs.values()), list(outs)


@pytest.fixture(scope="module")
def results(cache_dir):
    g, names = _graph()
    rng = np.random.default_rng(5)
    x = np.round(rng.standard_normal((2, 7, 5)) * 2).astype(np.float32) / 2  # halves: many ties
    x[0, 3, 1] = np.nan
    x[1, 0, 4] = np.nan
    x[1, 5, 4] = np.nan
    feeds = {"x": x}
    for v in g.inputs:
        if v.name != "x":
            feeds[v.name] = rng.standard_normal(v.shape).astype(np.float32)
    model = build(g, None, cache_dir=cache_dir)
    return model.run(feeds), reference.run(g, feeds), {v.name: n for v, n in zip(g.outputs, names, strict=True)}


@pytest.mark.parametrize("family", ["top", "low", "idx_only", "vals_only", "all", "cumsum", "cumprod", "nd_", "el_"])
def test_kernels_match_the_reference(results, family):
    got, want, label = results
    names = [v for v, n in label.items() if n.startswith(family)]
    assert names
    assert_close({n: got[n] for n in names}, {n: want[n] for n in names})
    for n in names:
        if np.asarray(want[n]).dtype == np.int64:
            np.testing.assert_array_equal(got[n], want[n])  # indices exactly: ties and NaN in index order
