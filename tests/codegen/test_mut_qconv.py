"""``codegen/qconv.py``'s portable int8 conv (the plain C99 build, the Cortex-M7's kernel) where mutation testing
(tests/mutation/mutT.md, issue 13) found no test: a conv with one output channel per group (``opfuse_dot_s16``, one
dot product per position), and the two columns of the two-positions-per-pass form kept within their scratch (a run
with guard bytes, ``CompiledModel.run_guarded``). Bit-exact against the reference executor."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import plan_model
from opfuse.ops import GraphBuilder
from opfuse.ops.quantized import fixed_point_multiplier
from opfuse.runtime.native import build
from opfuse.runtime.reference import run
from test_int8_conv import _feeds, qconv_graph

ONE_PER_GROUP = {
    "one-output-channel": {"cin": 4, "cout": 1},
    "grouped": {"cin": 6, "cout": 3, "group": 3},
    "grouped-stride2-uint8": {"cin": 4, "cout": 2, "group": 2, "stride": 2, "x_dtype": "uint8", "zp": 120},
    "one-output-channel-1x1": {"cin": 5, "cout": 1, "k": 1, "pad": 0},
}


def _guarded_bit_exact(g, opts):
    comp = plan_model(g)
    feeds = _feeds(g)
    want = run(g, feeds)
    got = build(comp.plan.graph, comp.plan, options=opts, threads=1).run_guarded(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    return generate(comp.plan.graph, comp.plan, options=opts).source


@pytest.mark.parametrize("case", list(ONE_PER_GROUP), ids=list(ONE_PER_GROUP))
@pytest.mark.parametrize("positions", [1, 2])
def test_one_output_channel_per_group_is_bit_exact(case, positions):
    """One output channel per group, several input channels each (not depthwise): one dot product per position
    and group, whatever the positions per pass asked for."""
    opts = CodegenOptions(simd="none", int8_conv_positions_per_pass=positions)
    source = _guarded_bit_exact(qconv_graph(**ONE_PER_GROUP[case]), opts)
    assert "opfuse_dot_s16(" in source.split("OPFUSE_KERNEL static", 1)[1]  # called in the kernel


@pytest.mark.parametrize("channels", [2, 4])
def test_two_positions_per_pass_keep_both_columns_in_their_scratch(channels):
    """Two int16 columns of Kp = 72 (8 input channels, 3x3) side by side in one thread's scratch: the second
    starts where the first ends and nothing is stored past the pair (guard bytes after the scratch)."""
    opts = CodegenOptions(simd="none", int8_conv_positions_per_pass=2, int8_conv_channels_per_pass=channels)
    source = _guarded_bit_exact(qconv_graph(cin=8, cout=6), opts)
    assert f"opfuse_dot{channels}2_s16(" in source


@pytest.mark.parametrize("k, pairs", [(2, 2), (4, 8), (3, 3)])
def test_depthwise_rows_of_an_even_width_are_all_tap_pairs(k, pairs):
    """qdepthwise.py packs adjacent taps of a kernel row in pairs (one SMLAD each): a row of 2 or 4 taps is all
    pairs, a row of 3 one pair and a single tap; the kernel's note says how many, and the bits are the same."""
    opts = CodegenOptions(simd="none")
    source = _guarded_bit_exact(qconv_graph(cin=6, cout=6, group=6, k=k, pad=k // 2), opts)
    assert f"{pairs} tap pairs (SMLAD with the DSP extension) and {k * k - 2 * pairs} single taps per output" in source


def _padded_on_one_side(pads, cin=4, cout=5, hw=(6, 7), seed=9):
    """x (int8) -> Cast/Sub(zp) -> Conv 3x3 with ``pads`` (ONNX order: begins, then ends) -> Requantize."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("qconv_pads")
    x = b.input("x", (1, cin) + hw, "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(-5, np.int32)))
    acc = b.op("Conv", xc, b.const("w", rng.integers(-128, 128, (cout, cin, 3, 3)).astype(np.int32)), name="conv",
               pads=list(pads))
    m, s = fixed_point_multiplier(2e-3)
    y = b.op("Requantize", acc, b.const("m", np.array(m, np.int32)), b.const("s", np.array(s, np.int32)),
             zero_point=1, lo=-128, hi=127, to=int(TensorProto.INT8))
    return b.build(y)


@pytest.mark.parametrize("pads", [(1, 1, 0, 0), (0, 0, 1, 1), (0, 1, 2, 0)], ids=["begins", "ends", "mixed"])
@pytest.mark.parametrize("positions", [1, 2])
def test_padding_on_one_side_only_is_tested_per_tap_near_it(pads, positions):
    """Padding at the start of an axis only, or at its end only: the windows that reach into it gather with a
    test per tap (zero in the padding), the others without; bit-exact either side."""
    opts = CodegenOptions(simd="none", int8_conv_positions_per_pass=positions)
    _guarded_bit_exact(_padded_on_one_side(pads), opts)
