"""ReduceMean/Sum/Max (``reduce.lower_reduce``) where the op suites' random data do not look: the mean of
integers truncated toward zero (quotients and remainders summed apart), the integer sum, the max of windows
that are all negative, over leading and trailing axes, and a reduction of a rank-0 input (``lower_reduction``),
against the reference, bit for bit."""
from __future__ import annotations

import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


def test_integer_means_sums_and_negative_maxima(cache_dir):
    b = GraphBuilder("reduce_cases")
    i = b.input("i", (3, 4, 5), np.int64)
    f = b.input("f", (3, 4, 5))
    outs = [b.op("ReduceMean", i, axes=[1], name="mean_mid"), b.op("ReduceMean", i, axes=[2], name="mean_last"),
            b.op("ReduceSum", i, axes=[0, 2], keepdims=0, name="sum_outer"),
            b.op("ReduceMax", f, axes=[0], name="max_first"), b.op("ReduceMax", f, axes=[2], name="max_last"),
            b.op("ReduceSumSquare", b.input("s", ()), name="square_of_a_scalar")]  # rank 0: its one element
    g = b.build(*outs)
    rng = np.random.default_rng(4)
    feeds = {"i": rng.integers(-50, 50, (3, 4, 5)).astype(np.int64),
             "f": -np.abs(rng.standard_normal((3, 4, 5))).astype(np.float32) - 0.5, "s": np.array(-1.5, np.float32)}
    got, want = build(g, None, cache_dir=cache_dir).run(feeds), reference.run(g, feeds)
    for v in g.outputs:
        assert got[v.name].dtype == want[v.name].dtype and np.array_equal(got[v.name], want[v.name]), v.name
    assert want["square_of_a_scalar"] == np.float32(2.25)
    assert (want["max_first"] < 0).all()  # every window negative: 0 is no maximum
    assert np.array_equal(want["mean_last"][..., 0], np.trunc(feeds["i"].mean(axis=2)).astype(np.int64))


def test_norms_and_logs_of_doubles_and_integers(cache_dir):
    """ReduceL2, ReduceLogSum and ReduceLogSumExp over float64 (the double functions, not the float helpers) and
    ReduceL2 over int32 and int64 (sqrt in double, then truncated to the integer type), against the reference: within
    1e-12 for the doubles (a float helper would be ~1e-7 off), exactly for the integers."""
    b = GraphBuilder("reduce_wide")
    d = b.input("d", (3, 7), np.float64)
    i32, i64 = b.input("i32", (3, 7), np.int32), b.input("i64", (3, 7), np.int64)
    outs = [b.op("ReduceL2", d, axes=[1], name="l2_d"), b.op("ReduceLogSum", d, axes=[1], name="logsum_d"),
            b.op("ReduceLogSumExp", d, axes=[1], name="lse_d"),
            b.op("ReduceL2", i32, axes=[1], name="l2_i32"), b.op("ReduceL2", i64, axes=[1], name="l2_i64")]
    g = b.build(*outs)
    rng = np.random.default_rng(5)
    feeds = {"d": rng.uniform(0.1, 3.0, (3, 7)), "i32": rng.integers(-40, 40, (3, 7)).astype(np.int32),
             "i64": rng.integers(-100_000_000, 100_000_000, (3, 7)).astype(np.int64)}
    got, want = build(g, None, cache_dir=cache_dir).run(feeds), reference.run(g, feeds)
    for name in ("l2_d", "logsum_d", "lse_d"):
        assert got[name].dtype == np.float64 and np.allclose(got[name], want[name], rtol=1e-12, atol=0), name
    for name in ("l2_i32", "l2_i64"):
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
    # sqrt of the sum of squares (~2e8), truncated: not through a float (whose 24 bits lose the units)
    assert np.array_equal(want["l2_i64"][:, 0], np.trunc(np.sqrt((feeds["i64"].astype(np.float64) ** 2).sum(1))))


def test_log_sum_exp_of_infinite_and_nan_rows(cache_dir):
    """ReduceLogSumExp shifts by the row's max, and by 0 where that max is infinite (inf - inf is NaN): rows of
    -inf give -inf, a row holding +inf gives +inf, a NaN gives NaN, over the trailing axis (lane partial sums)
    and a leading one (nested loops), float32 and float64."""
    for dt in (np.float32, np.float64):
        b = GraphBuilder("lse")
        x = b.input("x", (4, 5), dtype=dt)
        g = b.build(b.op("ReduceLogSumExp", x, axes=[1], keepdims=0, name="rows"),
                    b.op("ReduceLogSumExp", b.op("Transpose", x, perm=[1, 0], name="t"), axes=[0], keepdims=0,
                         name="cols"))
        x_ = np.array([[-np.inf] * 5, [np.inf, 0, 1, 2, -np.inf], [1, np.nan, 3, 4, 5], [1, 2, 3, 4, 5]], dt)
        got, want = build(g, None, cache_dir=cache_dir).run({"x": x_}), reference.run(g, {"x": x_})
        for k in ("rows", "cols"):
            assert np.array_equal(np.isnan(got[k]), np.isnan(want[k])), (dt, k, got[k])
            assert got[k][0] == -np.inf and got[k][1] == np.inf and np.isnan(got[k][2]), (dt, k, got[k])
            np.testing.assert_allclose(got[k][3], want[k][3], rtol=1e-6)


def test_float32_products_and_squares_round_in_float32(cache_dir):
    """ReduceProd and ReduceSumSquare of float32 over a leading axis accumulate in float32, one rounding a
    step in row order: the same bits as NumPy's float32 steps (in double they come out a few ulp apart)."""
    b = GraphBuilder("prods")
    x = b.input("x", (9, 6))
    g = b.build(b.op("ReduceProd", x, axes=[0], keepdims=0, name="prod"),
                b.op("ReduceSumSquare", x, axes=[0], keepdims=0, name="sq"))
    x_ = np.random.default_rng(5).uniform(0.5, 2.0, (9, 6)).astype(np.float32)
    prod, sq = np.float32(1) * np.ones(6, np.float32), np.zeros(6, np.float32)
    for row in x_:
        prod, sq = (prod * row).astype(np.float32), (sq + row * row).astype(np.float32)
    got = build(g, None, cache_dir=cache_dir).run({"x": x_})
    assert np.array_equal(got["prod"], prod) and np.array_equal(got["sq"], sq), (got, prod, sq)


def test_unsigned_64_bit_means_above_2_to_the_63(cache_dir):
    """uint64 ReduceMean summed its quotients and remainders in int64: values above 2^63 turned negative and
    the mean came out wrong (fuzz seed 41212, graph 1621: 1.46e19 against the exact 9.30e18). Sums of quotients
    and remainders are uint64 now; uint32, int64 and uint8 stay exact, every mean truncated."""
    b = GraphBuilder("unsigned_means")
    outs = []
    feeds = {}
    rng = np.random.default_rng(7)
    for dt in (np.uint64, np.uint32, np.uint8, np.int64):
        x = b.input(f"x_{np.dtype(dt).name}", (3, 7), dt)
        outs += [b.op("ReduceMean", x, axes=[1], name=f"mean_{np.dtype(dt).name}"),
                 b.op("ReduceMean", x, axes=[0], keepdims=0, name=f"mean0_{np.dtype(dt).name}")]
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, (3, 7), dtype=dt, endpoint=True)
        a[0] = info.max
        a[1, :3] = [info.min, 1, info.max]
        feeds[x.name] = a
    g = b.build(*outs)
    got, want = build(g, None, cache_dir=cache_dir).run(feeds), reference.run(g, feeds)
    for v in g.outputs:
        assert got[v.name].dtype == want[v.name].dtype and np.array_equal(got[v.name], want[v.name]), v.name
    u = feeds["x_uint64"]
    assert [int(m) for m in want["mean_uint64"].reshape(-1)] == [sum(int(v) for v in row) // 7 for row in u]
    assert want["mean_uint64"][0, 0] == np.iinfo(np.uint64).max
