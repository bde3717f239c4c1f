"""The input prefetch of depthwise convolution's strided rows path (``CodegenOptions.depthwise_prefetch_bytes``,
off by default, from a row stride of ``depthwise_prefetch_min_stride``): each step over the output rows
prefetches into L2 the input rows it advances by, that many bytes past the last row it reads, into the next
plane, never past the tensor. A prefetch changes no value: the outputs are bitwise those of the build without it, in the
AVX-512 and the AVX2 bodies, at any distance (one line, or past the whole tensor), on one thread or two,
and within float32 rounding of the reference. The cases: stride 2 with channel counts that are no multiple
of 16, odd widths, padding at every edge, mobilenet's asymmetric padding, a 5x5 dilated kernel, a batch
of two (the last planes' prefetch is cut at the tensor's end). The layers share one model (each its own
kernel) to keep the builds few."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import assert_close, group_by_names
from opfuse.codegen import CodegenOptions, generate
from opfuse.ops import GraphBuilder
from opfuse.targets import host_simd_isa

rng = np.random.default_rng(23)

# (C, H, W, kernel, stride, pads, dilation); all in place (rows path)
STRIDED = [
    (3, 28, 28, 3, 2, [0, 0, 1, 1], 1),     # mobilenet's stride-2 padding, rows of 14
    (5, 17, 19, 3, 2, [1, 1, 1, 1], 1),     # odd sizes, rows of 10
    (17, 20, 40, 3, 2, [1, 1, 1, 1], 1),    # 17 channels, rows of 20
    (2, 9, 40, 5, 2, [2, 1, 2, 2], 2),      # 5x5, dilated, asymmetric pads
    (3, 8, 64, 3, 2, [1, 1, 1, 1], 1),      # rows of 32: two whole zmm
]
STRIDE_ONE = [(3, 16, 17, 3, 1, [1, 1, 1, 1], 1)]  # rows of 17


def layers_graph(cases, n: int = 2):
    """One model of independent depthwise layers + Relu, each its own group and kernel; a batch of ``n``."""
    b = GraphBuilder("dw_prefetch")
    outs = []
    for i, (c, h, w, k, s, pads, d) in enumerate(cases):
        x = b.input(f"x{i}", (n, c, h, w))
        wt = b.const(f"w{i}", (rng.standard_normal((c, 1, k, k)) / 3).astype(np.float32))
        bias = b.const(f"b{i}", (rng.standard_normal(c) / 3).astype(np.float32))
        y = b.op("Conv", x, wt, bias, kernel_shape=[k, k], strides=[s, s], pads=pads, dilations=[d, d], group=c,
                 name=f"dw{i}")
        outs.append(b.op("Relu", y, name=f"relu{i}"))
    g = b.build(*outs)
    return g, group_by_names(g, [("conv_epilogue", [f"dw{i}", f"relu{i}"]) for i in range(len(cases))])


def _kernels(source: str) -> list[str]:
    return source.split("OPFUSE_KERNEL")[1:]


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_strided_rows_prefetch_their_input_within_the_tensor(isa):
    """Each strided kernel's bodies prefetch into L2, bounded by its input's size; stride 1 does not (unless
    ``depthwise_prefetch_min_stride`` is 1); 0 bytes turns it off; the same C from the same options."""
    g, plan = layers_graph(STRIDED + STRIDE_ONE)
    assert "_mm_prefetch" not in generate(g, plan, options=CodegenOptions(vector_isa=isa)).source  # off by default
    opts = CodegenOptions(vector_isa=isa, depthwise_avx512=isa == "avx512", depthwise_prefetch_bytes=8192)
    src = generate(g, plan, options=opts).source
    assert src == generate(g, plan, options=opts).source
    kernels = [k for k in _kernels(src) if "_mm256_" in k]
    assert len(kernels) == len(STRIDED) + 1
    for k, (c, h, w, *_rest) in zip(kernels, STRIDED, strict=False):
        # into L2, a line at a time, never past the input (a batch of two: 2 C H W floats)
        bounds = re.findall(r"if \(pf\d+ \+ (\d+) <= (\d+)\)", k)
        assert bounds and {total for _floats, total in bounds} == {str(2 * c * h * w)}, k[:200]
        lines = re.findall(r"_mm_prefetch\(\(const char\*\)\(\w+ \+ pf\d+(?: \+ (\d+))?\), _MM_HINT_T1\);", k)
        steps = [int(floats) for floats, _total in bounds]
        assert len(lines) == sum(-(-f // 16) for f in steps)  # one a line of each step's rows
        assert {int(x or 0) % 16 for x in lines} == {0}
        # 2048 floats past the last input row of the step
        assert re.search(r"const long pf\d+ = .* \+ 2048;", k)
    assert "_mm_prefetch" not in kernels[-1]
    assert "_mm_prefetch" in _kernels(generate(g, plan, options=opts.with_(depthwise_prefetch_min_stride=1)).source)[-1]
    off = generate(g, plan, options=opts.with_(depthwise_prefetch_bytes=0)).source
    assert "_mm_prefetch" not in off
    assert "_mm_prefetch" not in generate(g, plan, options=CodegenOptions(simd="none")).source


@pytest.mark.skipif(host_simd_isa() not in ("avx2", "avx512"), reason="the in-place bodies need AVX2")
def test_prefetch_changes_no_bit(cache_dir):
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, plan = layers_graph(STRIDED + STRIDE_ONE)
    feeds = reference.random_inputs(g, 4)
    want = reference.run(g, feeds)
    base = build(g, plan, cache_dir=cache_dir).run(feeds)
    assert_close(base, want)
    on = CodegenOptions(depthwise_prefetch_bytes=8192)
    variants = [on,
                CodegenOptions(depthwise_prefetch_bytes=64, depthwise_prefetch_min_stride=1),  # a line ahead
                CodegenOptions(depthwise_prefetch_bytes=1 << 20),                             # past every tensor
                on.with_(depthwise_avx512=False)]                                             # the AVX2 body
    for opts in variants:
        model = build(g, plan, cache_dir=cache_dir, options=opts)
        assert "_mm_prefetch" in model.program.source
        got = model.run(feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], base[k], err_msg=f"{k} {opts}")
    two = build(g, plan, cache_dir=cache_dir, threads=2, options=on).run(feeds)
    for k in want:
        np.testing.assert_array_equal(two[k], base[k], err_msg=k)


def test_bad_prefetch_options_are_refused():
    with pytest.raises(Exception, match="depthwise_prefetch"):
        CodegenOptions(depthwise_prefetch_bytes=-1)
    with pytest.raises(Exception, match="depthwise_prefetch"):
        CodegenOptions(depthwise_prefetch_min_stride=0)
