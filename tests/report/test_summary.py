import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.report.summary import format_summary, peak_live_bytes, summarize


def chain():
    b = GraphBuilder("chain")
    x = b.input("x", (1, 1024))  # 4 KiB
    w = b.const("w", np.ones(1024, np.float32))
    a = b.op("Add", x, w, name="a")        # 4 KiB
    m = b.op("Mul", a, a, name="m")        # 4 KiB
    r = b.op("Relu", m, name="r")          # 4 KiB
    return b.build(r)


def test_counts_by_hand():
    s = summarize(chain())
    assert s.nodes == 3
    assert s.params == 1024 and s.param_bytes == 4096
    kib = 4096
    # Add reads x and w, writes a; Mul reads a twice (counted per input); Relu reads m, writes r.
    assert s.bytes_moved == (2 * kib + kib) + (2 * kib + kib) + (kib + kib)
    assert s.flops == 3 * 1024
    assert s.activation_bytes_total == 3 * kib
    assert [o.op_type for o in s.ops] == ["Add", "Mul", "Relu"]


def test_peak_live_frees_after_last_use():
    # x live throughout (graph input); a dies at Mul, m dies at Relu.
    # after Add: x + a; after Mul: x + a + m (a freed after); after Relu: x + m + r
    assert peak_live_bytes(chain()) == 3 * 4096


def test_format_mentions_every_op():
    text = format_summary(summarize(chain()))
    for op in ("Add", "Mul", "Relu", "params", "FLOPs", "peak live"):
        assert op in text
