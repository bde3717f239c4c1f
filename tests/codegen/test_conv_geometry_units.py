"""The convolution kernels' geometry without a compiler, each expectation worked out by hand: the valid
output range of a kernel column (``conv.valid_range``), the rows one tile's band holds
(``conv_windows.band_rows``) and the windows GEMM's positions per tile (``conv_windows.tile_positions``)."""
from __future__ import annotations

import numpy as np

from opfuse.codegen import CodegenOptions
from opfuse.codegen.conv import valid_range
from opfuse.codegen.conv_windows import band_rows, tile_positions
from opfuse.ops import GraphBuilder
from opfuse.ops.nn import conv_geometry


def test_valid_range():
    # o * 2 - 1 in [0, 7): o = 1, 2, 3 (o = 4 reads column 7)
    assert valid_range(5, 7, 2, -1) == (1, 4)
    # o * 3 - 7 >= 0 from o = 3; o = 3 reads column 2
    assert valid_range(4, 10, 3, -7) == (3, 4)
    # every window starts past the input: empty at 0
    assert valid_range(3, 2, 1, 5) == (0, 0)
    # every window starts before it: the first valid o (5) is past the output, empty at its end
    assert valid_range(2, 10, 1, -5) == (2, 2)
    assert valid_range(6, 6, 1, 0) == (0, 6)


def test_band_rows():
    """Output 5 x 7 (input 11 x 15, 3x3, stride 2), tiles of 10 positions: output rows 0-1, 1-2, 2-4 and 4:
    at most 2 rows apart, 4 input rows, plus the window's 3 rows: 7. Tiles of 7 (one output row each): 3; of
    35 (all): 4 rows apart, 8 + 3 = 11; dilation 2 makes the window 5 rows."""
    b = GraphBuilder("band")
    x = b.input("x", (1, 2, 11, 15))
    y = b.op("Conv", x, b.const("w", np.ones((3, 2, 3, 3), np.float32)), strides=[2, 2], name="conv")
    yd = b.op("Conv", x, b.const("wd", np.ones((3, 2, 3, 3), np.float32)), strides=[2, 2], dilations=[2, 1],
              name="dil")
    g = b.build(y, yd)
    conv, dil = g.nodes
    assert conv.outputs[0].shape == (1, 3, 5, 7) and dil.outputs[0].shape == (1, 3, 4, 7)
    geo = conv_geometry(conv)[0]
    assert band_rows(conv, geo, 10) == 7
    assert band_rows(conv, geo, 7) == 3
    assert band_rows(conv, geo, 35) == 11
    # 4 x 7 outputs, tiles of 10: rows 0-1, 1-2, 2-3: 2 input rows apart, plus (3 - 1) * 2 + 1 = 5
    assert band_rows(dil, conv_geometry(dil)[0], 10) == 7


def test_tile_positions():
    """AVX-512 (NR 32, MR 6-8): the C tile holds ``gemm_tile_floats`` (32768) for the channels rounded to
    NR, at most ``gemm_wide`` (512), in whole MR rows, at least 4 of them. 64 channels, 14x14: MR 7 (196
    exactly), 32768 / 64 = 512 -> 511. 28x28: 7 and 8 both pad nothing; 7 divides the row: 511 (8 without
    the row: 512). 600 channels count as 512: 64 -> 63 (7x7: MR 7). Tiles of 1024 floats: 16 -> 14, at
    least 4 rows: 28."""
    o = CodegenOptions(vector_isa="avx512").resolved("avx512")
    assert tile_positions(o, 64, 196, 14) == 511
    assert tile_positions(o, 64, 784, 28) == 511
    assert tile_positions(o, 64, 784) == 512
    assert tile_positions(o, 600, 49, 7) == 63
    assert tile_positions(o.with_(gemm_tile_floats=1024), 64, 196, 14) == 28
