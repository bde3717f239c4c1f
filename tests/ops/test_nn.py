"""Conv, ConvTranspose and the pools against direct-loop oracles and ONNX's reference."""
from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from op_harness import assert_close, build_op, onnx_ref, ort_ref, run1, run_op
from opfuse.errors import ShapeError, UnsupportedOpError
from opfuse.ops import GraphBuilder, get_spec
from opfuse.runtime.reference import random_inputs, run

RNG = np.random.default_rng(1234)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# Direct-loop oracles (slow, obviously correct) -----------------------------------------------
def naive_conv(x, w, b=None, strides=None, pads=None, dilations=None, group=1):
    """y[n, m, o] = b[m] + sum_{c in group(m), k} x[n, c, o*s - pb + k*d] * w[m, c, k] (zero outside)."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    sp, ks = x.shape[2:], w.shape[2:]
    nd = len(sp)
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    pads = pads or [0] * (2 * nd)
    out = [(sp[i] + pads[i] + pads[nd + i] - (ks[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(nd)]
    y = np.zeros((n, m, *out))
    mg = m // group
    for nn, mm in itertools.product(range(n), range(m)):
        g = mm // mg
        for o in itertools.product(*(range(v) for v in out)):
            acc = 0.0 if b is None else float(b[mm])
            for cc, k in itertools.product(range(cg), itertools.product(*(range(v) for v in ks))):
                pos = [o[i] * strides[i] - pads[i] + k[i] * dilations[i] for i in range(nd)]
                if all(0 <= p < sp[i] for i, p in enumerate(pos)):
                    acc += float(x[(nn, g * cg + cc, *pos)]) * float(w[(mm, cc, *k)])
            y[(nn, mm, *o)] = acc
    return y.astype(x.dtype)


def naive_conv_transpose(x, w, b=None, strides=None, pads=None, dilations=None, group=1,
                         output_padding=None):
    """full[n, g*Mg+m, i*s + k*d] += x[n, g*Cg+c, i] * w[g*Cg+c, m, k]; y = full[pb : L + op - pe]."""
    n, c = x.shape[:2]
    sp, ks = x.shape[2:], w.shape[2:]
    nd = len(sp)
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    pads = pads or [0] * (2 * nd)
    output_padding = output_padding or [0] * nd
    mg = w.shape[1]
    cg = c // group
    full_len = [(sp[i] - 1) * strides[i] + (ks[i] - 1) * dilations[i] + 1 + output_padding[i] for i in range(nd)]
    full = np.zeros((n, mg * group, *full_len))
    for nn, cc in itertools.product(range(n), range(c)):
        g = cc // cg
        for i in itertools.product(*(range(v) for v in sp)):
            for mm, k in itertools.product(range(mg), itertools.product(*(range(v) for v in ks))):
                pos = tuple(i[a] * strides[a] + k[a] * dilations[a] for a in range(nd))
                full[(nn, g * mg + mm, *pos)] += float(x[(nn, cc, *i)]) * float(w[(cc, mm, *k)])
    crop = tuple(slice(pads[a], full_len[a] - pads[nd + a]) for a in range(nd))
    y = full[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return y.astype(x.dtype)


# Conv ----------------------------------------------------------------------------------------
CONV_CASES = {
    "plain": ((1, 3, 7, 7), (4, 3, 3, 3), {}),
    "pads_strides": ((2, 3, 8, 7), (5, 3, 3, 2), dict(strides=[2, 1], pads=[1, 0, 2, 1])),
    "dilations": ((1, 2, 9, 9), (3, 2, 3, 3), dict(dilations=[2, 3], pads=[2, 1, 0, 3])),
    "groups": ((1, 4, 6, 6), (6, 2, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),
    "depthwise": ((2, 5, 7, 6), (5, 1, 3, 3), dict(group=5, strides=[2, 2], pads=[1, 1, 1, 1])),
    "depthwise_multiplier": ((1, 3, 6, 6), (6, 1, 3, 3), dict(group=3)),
    "pointwise": ((1, 8, 5, 5), (4, 8, 1, 1), {}),
    "conv1d": ((2, 3, 11), (4, 3, 4), dict(strides=[3], pads=[2, 1], dilations=[2])),
    "conv1d_groups": ((1, 6, 9), (6, 2, 3), dict(group=3)),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
@pytest.mark.parametrize("bias", [False, True])
def test_conv_matches_direct_loops(case, bias):
    xs, ws, attrs = CONV_CASES[case]
    x, w = randn(*xs), randn(*ws)
    b = randn(ws[0]) if bias else None
    got = run_op("Conv", [x, w, b], consts=(1, 2), **attrs)[0]
    assert_close(got, naive_conv(x, w, b, **attrs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("strides,kernel", [([1, 1], [3, 3]), ([2, 2], [3, 2]), ([3, 2], [2, 4])])
def test_conv_auto_pad_matches_onnx_reference(auto_pad, strides, kernel):
    x, w = randn(1, 2, 8, 7), randn(3, 2, *kernel)
    got = run1("Conv", x, w, consts=(1,), auto_pad=auto_pad, strides=strides)
    want = onnx_ref("Conv", [x, w], auto_pad=auto_pad, strides=strides)[0]
    assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_conv_same_upper_puts_the_odd_pad_at_the_end():
    # 1-D, input 4, kernel 2, stride 1: total pad 1. SAME_UPPER pads the end, SAME_LOWER the start.
    x = np.array([[[1, 2, 3, 4]]], dtype=np.float32)
    w = np.array([[[1, 10]]], dtype=np.float32)
    assert run1("Conv", x, w, consts=(1,), auto_pad="SAME_UPPER").ravel().tolist() == [21, 32, 43, 4]
    assert run1("Conv", x, w, consts=(1,), auto_pad="SAME_LOWER").ravel().tolist() == [10, 21, 32, 43]


def test_conv3d_matches_onnx_reference():
    x, w, b = randn(1, 2, 5, 6, 4), randn(3, 2, 2, 3, 2), randn(3)
    attrs = dict(pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 1])
    got = run1("Conv", x, w, b, consts=(1, 2), **attrs)
    assert_close(got, onnx_ref("Conv", [x, w, b], **attrs)[0], rtol=1e-4, atol=1e-5)


def test_conv_flops_formula():
    # 2 * N * Cout * prod(out) * (Cin / groups) * prod(kernel) + N * Cout * prod(out) bias adds
    g = build_op("Conv", [randn(2, 4, 8, 8), randn(6, 2, 3, 3), randn(6)], consts=(1, 2),
                 group=2, pads=[1, 1, 1, 1])
    node = g.nodes[0]
    assert node.outputs[0].shape == (2, 6, 8, 8)
    assert get_spec("Conv").flops(node) == 2 * 2 * 6 * 64 * 2 * 9 + 2 * 6 * 64


def test_conv_float64_and_float16():
    for dtype, tol in ((np.float64, 1e-12), (np.float16, 1e-2)):
        x, w = randn(1, 2, 5, 5, dtype=dtype), randn(3, 2, 3, 3, dtype=dtype)
        got = run1("Conv", x, w, consts=(1,))
        assert got.dtype == dtype
        assert_close(got.astype(np.float64), naive_conv(x.astype(np.float64), w.astype(np.float64)),
                     rtol=tol, atol=tol)


@pytest.mark.parametrize("xs,ws,attrs,fragment", [
    ((1, 3, 8, 8), (4, 2, 3, 3), {}, "channel mismatch"),
    ((1, 4, 8, 8), (4, 2, 3, 3), dict(group=3), "group=3"),
    ((1, 3, 8, 8), (4, 3, 3), {}, "rank"),
    ((1, 3, 2, 2), (4, 3, 3, 3), {}, "does not fit"),
    ((1, 3, 8, 8), (4, 3, 3, 3), dict(kernel_shape=[2, 2]), "kernel_shape"),
    ((1, 3, 8, 8), (4, 3, 3, 3), dict(pads=[1, 1]), "pads"),
    ((3, 8), (4, 3, 3), {}, "spatial"),
])
def test_conv_shape_errors_name_the_node(xs, ws, attrs, fragment):
    with pytest.raises(ShapeError, match=fragment) as e:
        build_op("Conv", [randn(*xs), randn(*ws)], consts=(1,), name="bad_conv", **attrs)
    assert "bad_conv" in str(e.value)


def test_conv_bias_shape_error():
    with pytest.raises(ShapeError, match="bad_conv.*bias"):
        build_op("Conv", [randn(1, 3, 8, 8), randn(4, 3, 3, 3), randn(5)], consts=(1, 2), name="bad_conv")


def test_conv_unknown_auto_pad_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="auto_pad"):
        build_op("Conv", [randn(1, 3, 8, 8), randn(4, 3, 3, 3)], consts=(1,), auto_pad="SAME")


# ConvTranspose ------------------------------------------------------------------------------
CONVT_CASES = {
    "plain": ((1, 2, 4, 5), (2, 3, 3, 3), {}),
    "strides": ((1, 2, 4, 5), (2, 3, 3, 2), dict(strides=[2, 3])),
    "pads": ((2, 2, 4, 5), (2, 3, 3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 2])),
    "output_padding": ((1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[3, 2], output_padding=[1, 1])),
    "dilations": ((1, 2, 4, 4), (2, 2, 2, 3), dict(dilations=[2, 2], strides=[2, 1])),
    "groups": ((1, 4, 3, 4), (4, 3, 3, 3), dict(group=2, strides=[2, 2], pads=[1, 1, 0, 0])),
    "depthwise": ((1, 3, 4, 4), (3, 1, 2, 2), dict(group=3, strides=[2, 2])),
    "convT1d": ((2, 3, 5), (3, 2, 4), dict(strides=[3], pads=[1, 2], output_padding=[2])),
}


@pytest.mark.parametrize("case", sorted(CONVT_CASES))
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose_matches_direct_loops(case, bias):
    xs, ws, attrs = CONVT_CASES[case]
    x, w = randn(*xs), randn(*ws)
    b = randn(ws[1] * attrs.get("group", 1)) if bias else None
    got = run_op("ConvTranspose", [x, w, b], consts=(1, 2), **attrs)[0]
    assert_close(got, naive_conv_transpose(x, w, b, **attrs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs,pads", [
    # input 4, stride 2, kernel 3: the unpadded output is 2*3 + 3 = 9.
    (dict(output_shape=[8]), [1, 0]),                       # total pad 1: NOTSET puts it first
    (dict(output_shape=[8], auto_pad="SAME_UPPER"), [0, 1]),  # SAME_UPPER puts it last
    (dict(auto_pad="SAME_UPPER"), [0, 1]),                   # out = 4 * 2 = 8
    (dict(auto_pad="SAME_LOWER"), [1, 0]),
    (dict(auto_pad="VALID"), [0, 0]),
    (dict(output_shape=[9]), [0, 0]),
])
def test_conv_transpose_output_shape_and_auto_pad(attrs, pads):
    x, w = randn(1, 2, 4), randn(2, 3, 3)
    got = run1("ConvTranspose", x, w, consts=(1,), strides=[2], **attrs)
    assert_close(got, naive_conv_transpose(x, w, strides=[2], pads=pads), rtol=1e-4, atol=1e-5)


def test_conv_transpose_output_shape_beyond_full_extent_zero_fills():
    # output_shape 11 > the 9 positions the kernel reaches: the last two outputs only see zeros.
    x, w = randn(1, 1, 4), randn(1, 1, 3)
    got = run1("ConvTranspose", x, w, consts=(1,), strides=[2], output_shape=[11])
    full = naive_conv_transpose(x, w, strides=[2])
    # total pad = 9 - 11 = -2: begin = -2 - (-1) = -1, so the window starts one before index 0.
    assert_close(got[0, 0], np.concatenate([[0.0], full[0, 0], [0.0]]).astype(np.float32), atol=1e-5)


def test_conv_transpose_matches_onnx_reference_without_groups():
    x, w, b = randn(1, 2, 3, 4), randn(2, 3, 3, 3), randn(3)
    attrs = dict(strides=[2, 2], pads=[0, 1, 1, 0], output_padding=[1, 1])
    got = run1("ConvTranspose", x, w, b, consts=(1, 2), **attrs)
    assert_close(got, onnx_ref("ConvTranspose", [x, w, b], **attrs)[0], rtol=1e-4, atol=1e-5)


def test_conv_transpose_flops_and_errors():
    g = build_op("ConvTranspose", [randn(1, 4, 3, 3), randn(4, 2, 2, 2)], consts=(1,), group=2, strides=[2, 2])
    node = g.nodes[0]
    assert node.outputs[0].shape == (1, 4, 6, 6)
    # 2 * N * Cin * prod(in) * (Cout / group) * prod(kernel)
    assert get_spec("ConvTranspose").flops(node) == 2 * 4 * 9 * 2 * 4
    with pytest.raises(ShapeError, match="convT.*channel mismatch"):
        build_op("ConvTranspose", [randn(1, 3, 3, 3), randn(4, 2, 2, 2)], consts=(1,), name="convT")


# Pools ---------------------------------------------------------------------------------------
POOL_CASES = {
    "plain": ((1, 2, 6, 6), dict(kernel_shape=[2, 2])),
    "strides_pads": ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "asym_pads": ((2, 1, 7, 6), dict(kernel_shape=[3, 2], strides=[1, 2], pads=[2, 0, 1, 1])),
    "ceil": ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "ceil_pads": ((1, 2, 9, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    "dilations": ((1, 2, 8, 8), dict(kernel_shape=[2, 3], dilations=[2, 2], strides=[1, 2])),
    "dilations_ceil": ((1, 1, 10, 9), dict(kernel_shape=[3, 2], strides=[2, 2], dilations=[2, 1], ceil_mode=1)),
    "same_upper": ((1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER")),
    "same_lower": ((1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_LOWER")),
    "valid": ((1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="VALID")),
    "pool1d": ((2, 3, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    "pool3d": ((1, 1, 5, 4, 6), dict(kernel_shape=[2, 2, 3], strides=[1, 2, 2], pads=[0, 1, 1, 1, 0, 0])),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_max_pool_matches_onnx_reference(case):
    shape, attrs = POOL_CASES[case]
    x = randn(*shape)
    # ONNX 1.23's reference MaxPool gets SAME_LOWER's output size wrong (ceil(7/2) = 4, not 3).
    oracle = ort_ref if attrs.get("auto_pad") == "SAME_LOWER" else onnx_ref
    assert_close(run1("MaxPool", x, **attrs), oracle("MaxPool", [x], **attrs)[0])


@pytest.mark.parametrize("case", sorted(POOL_CASES))
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_matches_onnx_reference(case, count_include_pad):
    shape, attrs = POOL_CASES[case]
    x = randn(*shape)
    got = run1("AveragePool", x, count_include_pad=count_include_pad, **attrs)
    want = onnx_ref("AveragePool", [x], opset=19, count_include_pad=count_include_pad, **attrs)[0]
    assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_average_pool_ceil_mode_does_not_count_the_overhang():
    # ONNX's own example: 4x4, kernel 3, stride 2, ceil_mode -> the right/bottom windows hold 6 values.
    x = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
    got = run1("AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    assert got.ravel().tolist() == [6, 7.5, 12, 13.5]


def test_ceil_mode_drops_a_window_that_starts_in_the_right_padding():
    # input 2, pad 1+1, kernel 3, stride 3: ceil((2 + 2 - 3) / 3) + 1 = 2, but window 2 would start
    # at padded index 3, past the input and its left padding, so there is one output.
    x = randn(1, 1, 2, 2)
    got = run1("AveragePool", x, kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1,
               count_include_pad=1)
    assert got.shape == (1, 1, 1, 1)
    assert got.item() == pytest.approx(x.sum() / 9, rel=1e-6)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16])
def test_max_pool_other_dtypes(dtype):
    x = (RNG.integers(-100, 100, (1, 2, 5, 5)) if dtype != np.uint8 else RNG.integers(0, 255, (1, 2, 5, 5)))
    x = x.astype(dtype)
    attrs = dict(kernel_shape=[2, 2], pads=[1, 1, 0, 0])
    got = run1("MaxPool", x, **attrs)
    assert got.dtype == dtype
    # ONNX's reference pads integer inputs with NaN and misreads asymmetric pads: use onnxruntime.
    np.testing.assert_array_equal(got, ort_ref("MaxPool", [x], **attrs)[0])


def test_max_pool_refuses_an_unknown_storage_order():
    x = randn(1, 1, 4, 4)
    with pytest.raises(UnsupportedOpError, match="storage_order=2"):
        run_op("MaxPool", [x], num_outputs=2, kernel_shape=[2, 2], storage_order=2)
    # storage_order only orders the Indices: the values do not depend on it
    np.testing.assert_array_equal(run1("MaxPool", x, kernel_shape=[2, 2], storage_order=1),
                                  run1("MaxPool", x, kernel_shape=[2, 2]))


def test_pool_shape_errors():
    with pytest.raises(ShapeError, match="mp.*kernel_shape is required"):
        build_op("MaxPool", [randn(1, 1, 4, 4)], name="mp")
    with pytest.raises(ShapeError, match="mp.*needs 2 entries"):
        build_op("MaxPool", [randn(1, 1, 4, 4)], name="mp", kernel_shape=[2])
    with pytest.raises(ShapeError, match="ap.*does not fit"):
        build_op("AveragePool", [randn(1, 1, 4, 4)], name="ap", kernel_shape=[5, 5])
    with pytest.raises(ShapeError, match="gap"):
        build_op("GlobalAveragePool", [randn(4, 4)], name="gap")


def test_global_average_pool_and_pool_flops():
    x = randn(2, 3, 4, 5)
    assert_close(run1("GlobalAveragePool", x), x.mean(axis=(2, 3), keepdims=True))
    x3 = randn(1, 2, 3, 4, 5)
    assert_close(run1("GlobalAveragePool", x3), onnx_ref("GlobalAveragePool", [x3])[0])
    node = build_op("MaxPool", [randn(1, 2, 6, 6)], kernel_shape=[3, 3], strides=[3, 3]).nodes[0]
    assert get_spec("MaxPool").flops(node) == 2 * 2 * 2 * 9
    node = build_op("GlobalAveragePool", [x]).nodes[0]
    assert get_spec("GlobalAveragePool").flops(node) == x.size


# Speed: the reference executor must run 224x224 CNNs quickly ------------------------------------
MOBILENET_BLOCKS = ((1, 64), (2, 128), (1, 128), (2, 256), (1, 256), (2, 512), (1, 512), (1, 512),
                    (1, 512), (1, 512), (1, 512), (2, 1024), (1, 1024))
MOBILENET_BUDGET_S = 3.0  # the brief's bound for a whole MobileNetV1 reference run


def test_mobilenet_v1_conv_stack_runs_fast():
    """The 27 convolutions of MobileNetV1 at 224x224 (the bulk of its work) within the budget."""
    b = GraphBuilder("mobilenet_convs")
    x = b.input("x", (1, 3, 224, 224))
    rng = np.random.default_rng(0)

    def conv(v, cin, cout, k, stride, group=1):
        w = b.const("w", (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k))
                    .astype(np.float32))
        pad = k // 2
        return b.op("Relu", b.op("Conv", v, w, strides=[stride, stride], pads=[pad] * 4, group=group))

    y, cin = conv(x, 3, 32, 3, 2), 32
    for stride, cout in MOBILENET_BLOCKS:
        y = conv(conv(y, cin, cin, 3, stride, group=cin), cin, cout, 1, 1)
        cin = cout
    g = b.build(y)
    feeds = random_inputs(g, seed=0)
    start = time.perf_counter()
    out = run(g, feeds)[y.name]
    elapsed = time.perf_counter() - start
    assert out.shape == (1, 1024, 7, 7) and np.isfinite(out).all()
    assert elapsed < MOBILENET_BUDGET_S, f"MobileNetV1 convolutions took {elapsed:.2f} s"
