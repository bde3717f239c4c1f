"""``memory.patch`` without a compiler (mutation testing: tests/MUTATION.md): row maps, the 8-bit/float rule,
row sizes, refusals of ``bandable`` and when a run may write its output over its input (``_inplace_ok``),
each expectation worked out by hand from the module docstring. The bit-exact runs are in
tests/codegen/test_patch.py."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.compiler import CompileOptions, plan_model
from opfuse.memory.patch import (PATCHED_KIND, RowMap, _bandable_type, _kernel, _range, _row_bytes, bandable, merge_run,
                                 schedule)
from opfuse.memory.static import static_values
from opfuse.ops import GraphBuilder


def _w(b, name, *shape):
    return b.const(name, (np.arange(np.prod(shape)) % 7 * 0.1 - 0.3).astype(np.float32).reshape(shape))


def _infos(graph):
    comp = plan_model(graph, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    static = static_values(comp.graph)
    return comp, [bandable(g, comp.graph, static) for g in comp.plan.groups]


def test_row_map_needs_the_window_rows_and_pads_what_it_clips():
    # output rows [a, e) of kernel k, stride s, top pad p need input rows [a*s - p, (e-1)*s - p + k)
    rm = RowMap(kernel=3, stride=2, pad=1, rows=10)
    assert rm.need(0, 3) == (0, 6, 1, 0)     # [-1, 6): one row of top pad
    assert rm.need(3, 5) == (5, 10, 0, 0)    # [5, 10)
    assert RowMap(3, 2, 1, 9).need(3, 5) == (5, 9, 0, 1)  # [5, 10) past 9 rows: one row of bottom pad
    assert RowMap(5, 1, 2, 4).need(0, 4) == (0, 4, 2, 2)
    assert RowMap(1, 1, 0, 8).need(2, 5) == (2, 5, 0, 0)  # pointwise: the same rows
    assert RowMap(3, 1, 0, 8).need(1, 2) == (1, 4, 0, 0)


def test_bandable_types_are_float_and_8_bit():
    for dt in (np.float32, np.float16, np.float64, np.int8, np.uint8):
        assert _bandable_type(dt) and _bandable_type(np.dtype(dt).name)
    for dt in (np.int16, np.int32, np.int64, np.uint16, np.bool_):
        assert not _bandable_type(dt)


def test_row_bytes_and_kernel():
    b = GraphBuilder("rows")
    x = b.input("x", (1, 2, 5, 3))
    y = b.op("MaxPool", x, kernel_shape=[3, 2], pads=[1, 0, 1, 0], name="pool")
    c = b.op("Conv", x, _w(b, "w", 4, 2, 3, 1), name="conv")
    g = b.build(y, c)
    assert _row_bytes(x) == 2 * 3 * 4 and isinstance(_row_bytes(x), int)  # C x W x 4 bytes
    pool = next(n for n in g.nodes if n.name == "pool")
    conv = next(n for n in g.nodes if n.name == "conv")
    assert _kernel(pool) == (3, 2) and _kernel(conv) == (3, 1)


def test_a_group_with_two_outputs_is_not_bandable():
    b = GraphBuilder("two")
    x = b.input("x", (1, 2, 6, 4))
    r = b.op("Relu", x, name="relu")
    s = b.op("Sigmoid", r, name="sig")
    comp, infos = _infos(b.build(r, s))
    (group,) = comp.plan.groups
    assert infos == ["a group with several outputs"]
    assert len(group.nodes) == 2


def _depthwise(k: int, height: int = 12, channels: int = 4):
    """x (1, C, height, 3) -> depthwise k x k, pad k // 2 (same shape) -> ReLU."""
    b = GraphBuilder(f"dw{k}")
    x = b.input("x", (1, channels, height, 3))
    p = k // 2
    y = b.op("Conv", x, _w(b, "w", channels, 1, k, k), group=channels, pads=[p, p, p, p], name="dw")
    return b.build(b.op("Relu", y, name="relu"))


def test_output_over_input_only_when_no_later_band_reads_a_written_row():
    """Band j of r rows reads x rows [j*r - 2, (j+1)*r + 2) of a 5 x 5 window; band i wrote [i*r, (i+1)*r).
    Band i + 1 copies its rows before band i's go out; from i + 2 on they overlap iff (j - i) * r < r + 2,
    i.e. for r = 1 (band i + 2 reads row i) and never for r = 2 (band i + 2 starts at row 2i + 2 = e)."""
    comp, infos = _infos(_depthwise(5))
    assert len(infos) == 1 and not isinstance(infos[0], str)
    one, two, three = (schedule(infos, r) for r in (1, 2, 3))
    assert not one.inplace
    assert two.inplace and three.inplace
    assert len(two.bands) == 6
    # the range of x that band 3 of 2 rows holds: rows [6 - 2, 8 + 2)
    assert _range(two.bands[3], "x") == (4, 10)
    assert _range(two.bands[0], "x") == (0, 4)
    # a 3 x 3 window reads one halo row: output over input at every height
    _, infos3 = _infos(_depthwise(3))
    assert all(schedule(infos3, r).inplace for r in (1, 2, 5))


def test_no_output_over_input_with_two_inputs_or_another_shape():
    b = GraphBuilder("add")
    x = b.input("x", (1, 2, 6, 4))
    y = b.input("y", (1, 2, 6, 4))
    _, infos = _infos(b.build(b.op("Relu", b.op("Add", x, y, name="add"), name="relu")))
    assert len(infos) == 1 and not isinstance(infos[0], str)
    sched = schedule(infos, 2)
    assert len(sched.inputs) == 2 and not sched.inplace
    b = GraphBuilder("pw")
    x = b.input("x", (1, 2, 6, 4))
    _, infos = _infos(b.build(b.op("Conv", x, _w(b, "w", 3, 2, 1, 1), name="pw")))
    assert not schedule(infos, 2).inplace  # 3 channels out of 2: not the input's shape


def test_streamed_run_with_an_idle_first_layer_keeps_its_input():
    """Two 3 x 3 depthwise layers, line buffers, bands of 2 rows over 6: the second layer lags one row
    (its window needs a row below), so the last band has only its work: the first layer copies nothing
    then, and the output may not be written over the input."""
    b = GraphBuilder("dw2")
    x = b.input("x", (1, 4, 6, 3))
    y = b.op("Conv", x, _w(b, "w1", 4, 1, 3, 3), group=4, pads=[1, 1, 1, 1], name="dw1")
    y = b.op("Relu", y, name="r1")
    y = b.op("Conv", y, _w(b, "w2", 4, 1, 3, 3), group=4, pads=[1, 1, 1, 1], name="dw2")
    _, infos = _infos(b.build(b.op("Relu", y, name="r2")))
    assert len(infos) == 2 and not any(isinstance(i, str) for i in infos)
    sched = schedule(infos, 2, stream=True)
    assert [b.steps[0].rows for b in sched.bands] == [(0, 2), (2, 4), (4, 6), (6, 6)]
    assert [b.steps[1].rows for b in sched.bands] == [(0, 1), (1, 3), (3, 5), (5, 6)]
    assert not sched.bands[-1].steps[0].needs
    assert not sched.inplace
    # recomputed halos instead: every band copies its input first, and none reads rows two bands back
    assert schedule(infos, 2).inplace


@pytest.mark.parametrize("to", [10, 3])  # ONNX float16, int8: a bandable type of another size
def test_a_cast_run_keeps_its_input(to):
    b = GraphBuilder("cast")
    x = b.input("x", (1, 2, 6, 4))
    _, infos = _infos(b.build(b.op("Cast", b.op("Relu", x, name="relu"), to=to, name="cast")))
    assert len(infos) == 1 and not isinstance(infos[0], str)
    sched = schedule(infos, 2)
    assert sched.output.dtype != sched.inputs[0].dtype and not sched.inplace


def _one(build, *, expect_groups: int = 1):
    b = GraphBuilder("one")
    graph = b.build(*build(b))
    comp, infos = _infos(graph)
    assert len(infos) == expect_groups, [g.name for g in comp.plan.groups]
    return comp, infos


def test_pools_that_cannot_run_on_a_band_are_refused_with_their_reason():
    _, (r,) = _one(lambda b: [b.op("MaxPool", b.input("x", (1, 2, 7, 4)), kernel_shape=[2, 2], strides=[2, 2],
                                   ceil_mode=1, name="pool")])
    assert r == "MaxPool 'pool' has ceil_mode=1"
    _, (r,) = _one(lambda b: [b.op("AveragePool", b.input("x", (1, 2, 8, 16)), kernel_shape=[8, 1], name="pool")])
    assert r == "AveragePool 'pool' pools the whole feature map"
    _, (r,) = _one(lambda b: [b.op("MaxPool", b.input("x", (1, 2, 8, 1)), kernel_shape=[8, 1], name="pool")])
    assert r == "MaxPool 'pool' pools the whole feature map"
    _, (r,) = _one(lambda b: [b.op("MaxPool", b.input("x", (1, 2, 2, 5)), kernel_shape=[2, 1], name="pool")])
    assert r == "MaxPool 'pool' pools the whole feature map"


def test_windows_that_can_run_on_a_band():
    # a pool without ceil_mode, a window narrower than the rows (however wide the map), one row of one row
    _, (r,) = _one(lambda b: [b.op("MaxPool", b.input("x", (1, 2, 8, 2)), kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                   name="pool")])
    assert not isinstance(r, str) and r.inputs[0][1] == RowMap(3, 1, 1, 8) and r.window_input == 0
    _, (r,) = _one(lambda b: [b.op("MaxPool", b.input("x", (1, 2, 1, 6)), kernel_shape=[1, 2], name="pool")])
    assert not isinstance(r, str) and r.inputs[0][1] == RowMap(1, 1, 0, 1)
    # a Conv whose window is as tall as its input is no whole-map op: padding keeps every row its own
    _, (r,) = _one(lambda b: [b.op("Conv", b.input("x", (1, 2, 3, 5)), _w(b, "w", 4, 2, 3, 3), pads=[1, 1, 1, 1],
                                   name="conv")])
    assert not isinstance(r, str) and r.inputs[0][1] == RowMap(3, 1, 1, 3)


def test_the_row_map_of_a_window_is_along_the_rows_only():
    """kernel (3, 1) with dilation (2, 1): effective 5 rows; stride 2 and top pad 1 on the rows, the width's
    own (1, 0) ignored."""
    _, (r,) = _one(lambda b: [b.op("Conv", b.input("x", (1, 2, 11, 6)), _w(b, "w", 4, 2, 3, 1), strides=[2, 1],
                                   pads=[1, 0, 1, 0], dilations=[2, 1], name="conv")])
    assert not isinstance(r, str)
    assert r.inputs[0][1] == RowMap(5, 2, 1, 11)
    assert r.window is not None and r.window.name == "conv" and r.window_input == 0


def test_an_input_read_after_the_window_keeps_its_rows():
    """conv + a residual input added after it: the residual's rows are the output's (kernel 1, stride 1)."""
    def build(b):
        x, y = b.input("x", (1, 2, 7, 5)), b.input("y", (1, 4, 7, 5))
        c = b.op("Conv", x, _w(b, "w", 4, 2, 3, 3), pads=[1, 1, 1, 1], name="conv")
        return [b.op("Add", c, y, name="add")]
    comp, (r,) = _one(build)
    assert not isinstance(r, str)
    maps = {v.name: rm for v, rm in r.inputs}
    assert maps == {"x": RowMap(3, 1, 1, 7), "y": RowMap(1, 1, 0, 7)}
    assert r.window_input == [v.name for v, _ in r.inputs].index("x")
    assert r.output.shape == (1, 4, 7, 5)
    # work per output row: the group's flops over its 7 rows (not its 5 columns)
    from opfuse.ops.registry import get_spec
    total = sum(get_spec(n.op_type, n).flops(n) for n in comp.plan.groups[0].nodes)
    assert r.work_per_row * 7 == pytest.approx(total) and total > 0


@pytest.mark.parametrize("src, to", [("int32", 1), ("float32", 6)])  # Cast to ONNX float32, int32
def test_neither_float_nor_8_bit_is_refused(src, to):
    """The input's type and the output's are both checked."""
    _, (r,) = _one(lambda b: [b.op("Cast", b.op("Abs", b.input("x", (1, 2, 6, 4), src), name="abs"), to=to,
                                   name="cast")])
    assert r == "neither floating point nor 8-bit"


def test_a_pointwise_group_has_no_window_and_skips_constants_in_any_position():
    def build(b):
        x = b.input("x", (1, 2, 6, 4))
        scale = b.const("scale", np.full((1, 2, 1, 1), 2.0, np.float32))
        return [b.op("Relu", b.op("Mul", scale, x, name="mul"), name="relu")]  # the constant is read first
    _, (r,) = _one(build)
    assert not isinstance(r, str)
    assert r.window is None and r.window_input == -1
    assert [(v.name, rm) for v, rm in r.inputs] == [("x", RowMap(1, 1, 0, 6))]


def test_same_padding_comes_from_the_input_rows():
    """auto_pad SAME_UPPER, kernel 3, stride 2 over 12 rows: 6 output rows, (6 - 1) * 2 + 3 - 12 = 1 row of
    padding in all, at the bottom (the top gets the floor of half): top pad 0."""
    _, (r,) = _one(lambda b: [b.op("Conv", b.input("x", (1, 2, 12, 5)), _w(b, "w", 4, 2, 3, 3), strides=[2, 2],
                                   auto_pad="SAME_UPPER", name="conv")])
    assert not isinstance(r, str) and r.inputs[0][1] == RowMap(3, 2, 0, 12)
    assert r.output.shape == (1, 4, 6, 3)


def test_merge_run_makes_one_patched_group_named_after_its_ends():
    b = GraphBuilder("dw3")
    x = b.input("x", (1, 4, 6, 3))
    y = x
    for i in (1, 2, 3):
        y = b.op("Relu", b.op("Conv", y, _w(b, f"w{i}", 4, 1, 3, 3), group=4, pads=[1, 1, 1, 1], name=f"dw{i}"),
                 name=f"r{i}")
    comp, infos = _infos(b.build(y))
    names = [g.name for g in comp.plan.groups]
    assert len(names) == 3
    sched = schedule(infos[1:], 2)  # the last two layers
    plan = merge_run(comp.plan, 1, sched)
    assert [g.name for g in plan.groups] == [names[0], f"patch_{names[1]}_{names[2]}"]
    merged = plan.groups[1]
    assert merged.kind == PATCHED_KIND and merged.attrs["rule"] == "patch" and merged.attrs["patch"] is sched
    assert merged.anchor is not None and merged.anchor.name == "dw2"
    assert [n.name for n in merged.nodes] == [n.name for g in comp.plan.groups[1:] for n in g.nodes]
    assert plan.groups[0] is comp.plan.groups[0]
    # the whole chain: named after its first and last groups
    whole = merge_run(comp.plan, 0, schedule(infos, 2))
    assert [g.name for g in whole.groups] == [f"patch_{names[0]}_{names[2]}"]
    assert whole.groups[0].anchor is not None and whole.groups[0].anchor.name == "dw1"
