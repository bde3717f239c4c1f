"""A Conv of one input channel and several output channels (a grayscale stem: ``group`` 1 equals the input's
channel count) is an ordinary convolution, not a depthwise one (``conv.lower_conv`` sends a Conv to the
depthwise kernel only where its groups, input channels and output channels are all equal): against the
reference, with AVX2 and the plain C99 build, one compile each."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, run_both
from opfuse.codegen import CodegenOptions
from opfuse.ops import GraphBuilder


@pytest.mark.parametrize("options", [CodegenOptions(), CodegenOptions(simd="none")], ids=["auto", "portable"])
def test_one_input_channel_many_outputs(options, cache_dir):
    rng = np.random.default_rng(1)
    b = GraphBuilder("gray")
    x = b.input("x", (2, 1, 9, 10))
    w = b.const("w", rng.standard_normal((6, 1, 3, 3)).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(6).astype(np.float32))
    g = b.build(b.op("Conv", x, w, bias, pads=[1, 1, 1, 1], name="conv"))
    got, want, _ = run_both(g, None, cache_dir, options=options)
    assert_close(got, want)
