"""The C backend's numerics at the edges, against the reference executor (issue 13):

* integer ``Div`` never traps: ``INT_MIN / -1`` wraps, a zero divisor is the reference's
  ``InputError`` naming the node (reported through ``opfuse_run``'s return code), in every
  plan, also where a fused consumer reads only part of the quotient;
* ``Gather`` with run-time indices out of range is that error too (not a clamp);
* NaN propagates through Max, Min, MaxPool, ReduceMax and Clip as in NumPy, and the loops
  stay vectorised.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import opfuse
from cg_support import group_by_names
from opfuse.codegen.outline import parallel_loops
from opfuse.errors import InputError
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

I32, I64 = np.int32, np.int64
NAN = np.float32(np.nan)


def _plans(g):
    """The graph unfused and as one fused group (``elementwise``/``injective``)."""
    kind = "injective" if any(n.op_type in ("Gather", "Slice") for n in g.nodes) else "elementwise"
    return {"unfused": None, "fused": FusionPlan(g, [FusionGroup("all", list(g.nodes), kind)])}


def _same(got: dict, want: dict) -> None:
    """Equal, NaN where the reference has NaN (and only there)."""
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"NaN positions of '{name}'")
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=0, equal_nan=True, err_msg=name)


# Integer Div ---------------------------------------------------------------------------------

_TRAP_SCRIPT = """
import sys
sys.path.insert(0, {src!r})  # the opfuse under test (a mutation run's copy too), not an installed one
import numpy as np
from opfuse.ops import GraphBuilder
from opfuse.runtime.native import build
b = GraphBuilder("intmin")
y = b.op("Div", b.input("a", (4,), "{dt}"), b.input("b", (4,), "{dt}"), name="div")
model = build(b.build(y), None, cache_dir={cache!r})
info = np.iinfo(np.{dt})
a = np.array([info.min, info.min, 7, -7], np.{dt})
d = np.array([-1, 1, -2, 2], np.{dt})
print(model.run({{"a": a, "b": d}})["div"].tolist())
"""


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_int_min_div_minus_one_wraps_and_never_traps(dt, cache_dir):
    """In a child process: before the fix, x86's idiv raised SIGFPE and killed it (exit -8)."""
    src = str(Path(opfuse.__file__).resolve().parent.parent)
    script = textwrap.dedent(_TRAP_SCRIPT.format(dt=dt, cache=str(cache_dir), src=src))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    lo = int(np.iinfo(dt).min)
    assert proc.stdout.split("\n")[-2] == str([lo, lo, -3, -3])


@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32, np.int64, np.uint8])
def test_int_div_matches_the_reference_on_every_integer_type(dt, cache_dir):
    b = GraphBuilder("div")
    y = b.op("Div", b.input("a", (12,), dt), b.input("b", (12,), dt), name="div")
    g = b.build(y)
    info = np.iinfo(dt)
    # INT_MIN / -1 of int32 and int64 is in the child-process test above (it used to kill the process)
    lo = info.min if info.bits < 32 else info.min + 1
    a = np.array([lo, info.max, info.min, 0, 1, -1, 7, -7, 7, -7, info.max, info.min], dt) \
        if info.min < 0 else np.array([0, 255, 7, 1, 254, 3, 9, 100, 200, 13, 1, 0], dt)
    d = np.array([-1, -1, 1, 5, 3, -3, 2, 2, -2, -2, info.max, info.max], dt) \
        if info.min < 0 else np.array([1, 255, 2, 3, 1, 254, 4, 7, 9, 13, 255, 2], dt)
    with np.errstate(over="ignore"):
        want = reference.run(g, {"a": a, "b": d})
    for plan in _plans(g).values():
        got = build(g, plan, cache_dir=cache_dir).run({"a": a, "b": d})
        np.testing.assert_array_equal(got["div"], want["div"])


def _trunc_div(a: int, b: int) -> int:
    """Integer division truncated toward zero, in Python's exact integers."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


@pytest.mark.parametrize("dt,k", [(I64, -3), (I64, 7), (np.uint64, 7)])
def test_64_bit_div_by_a_constant_divisor(dt, k, cache_dir):
    """A 64-bit constant divisor is an expression in C (``INT64_C(-3)``, ``UINT64_C(7)``), which the code
    generator first copies to a temporary (``codegen.checks.div``, the path of mutants ``div`` 16-22)."""
    b = GraphBuilder("cdiv")
    y = b.op("Div", b.input("a", (8,), dt), b.const("k", np.array(k, dt)), name="div")
    g = b.build(y)
    info = np.iinfo(dt)
    vals = [int(info.max), int(info.min) + 1, 7, -7, 0, 5, -5, 1] if info.min < 0 else \
        [int(info.max), 0, 7, 6, 13, 1, 2**63, 2**64 - 7]
    want = np.array([_trunc_div(v, k) for v in vals], dt)
    for plan in _plans(g).values():
        got = build(g, plan, cache_dir=cache_dir).run({"a": np.array(vals, dt)})
        np.testing.assert_array_equal(got["div"], want)


def _div_graph():
    """q = (a - 1) / b, then a Slice that keeps only q[0:2]: the zero divisor at b[3] is in an
    element no fused loop computes, but the reference (and so every backend) still rejects it."""
    b = GraphBuilder("divzero")
    a = b.input("a", (4,), I64)
    d = b.input("b", (4,), I64)
    q = b.op("Div", b.op("Sub", a, b.const("one", np.array(1, I64))), b.op("Abs", d), name="the_div")
    s = b.op("Slice", q, b.const("st", np.array([0], I64)), b.const("en", np.array([2], I64)))
    return b.build(s)


@pytest.mark.parametrize("plan", ["unfused", "fused"])
def test_int_div_by_zero_is_the_references_input_error(plan, cache_dir):
    g = _div_graph()
    feeds = {"a": np.array([5, 6, 7, 8], I64), "b": np.array([2, -3, 4, 0], I64)}
    with pytest.raises(InputError) as want:
        reference.run(g, feeds)
    model = build(g, _plans(g)[plan], cache_dir=cache_dir)
    with pytest.raises(InputError) as got:
        model.run(feeds)
    assert str(got.value) == str(want.value)
    assert "node 'the_div' (Div): integer division by zero" in str(got.value)
    # the model stays usable: the next run with a good divisor succeeds
    feeds["b"] = np.array([2, -3, 4, 1], I64)
    np.testing.assert_array_equal(model.run(feeds)[g.outputs[0].name], reference.run(g, feeds)[g.outputs[0].name])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int32, np.int64])
@pytest.mark.parametrize("plan", ["unfused", "fused"])
def test_int_mod_by_zero_is_the_references_input_error(plan, dt, fmod, cache_dir):
    """Integer Mod by a zero divisor gave 0 in C where the reference and onnxruntime refuse it: a silent
    wrong answer (found trying hostile models; the fuzzer drew Mod only with a float constant modulus)."""
    b = GraphBuilder("modzero")
    a = b.input("a", (6,), dt)
    d = b.input("d", (6,), dt)
    g = b.build(b.op("Abs", b.op("Mod", a, d, fmod=fmod, name="the_mod"), name="abs"))
    feeds = {"a": np.array([7, 5, 3, 2, 9, 1], dt), "d": np.array([2, 3, 4, 1, 0, 5], dt)}
    with pytest.raises(InputError) as want:
        reference.run(g, feeds)
    model = build(g, _plans(g)[plan], cache_dir=cache_dir)
    with pytest.raises(InputError) as got:
        model.run(feeds)
    assert str(got.value) == str(want.value) == "node 'the_mod' (Mod): integer modulo by zero"
    feeds["d"] = np.array([2, 3, 4, 1, 7, 5], dt)
    np.testing.assert_array_equal(model.run(feeds)["abs"], reference.run(g, feeds)["abs"])


@pytest.mark.parametrize("op,message", [("Div", "integer division by zero"), ("Mod", "integer modulo by zero")])
def test_int_div_and_mod_by_zero_in_a_parallel_loop(cache_dir, op, message):
    """A divisor computed in the loop itself (no pre-check possible), split across threads."""
    b = GraphBuilder(f"{op.lower()}par")
    a = b.input("a", (256, 256), I32)
    c = b.input("c", (256, 1), I32)
    name = f"q{op.lower()}"
    q = b.op(op, c, b.op("Add", b.op("ReduceMax", a, axes=[1]), b.const("k", np.array(-3, I32))), name=name)
    g = b.build(q)
    plan = group_by_names(g, [("reduction", [n.name for n in g.nodes])])
    model = build(g, plan, cache_dir=cache_dir, threads=2)
    assert any(lp.reduces == ("fault0",) for lp in parallel_loops(model.program.source))
    rng = np.random.default_rng(0)
    x = rng.integers(-100, 100, (256, 256)).astype(I32)
    x[:, 0] = 200
    feeds = {"a": x, "c": rng.integers(-1000, 1000, (256, 1)).astype(I32)}
    np.testing.assert_array_equal(model.run(feeds)[name], reference.run(g, feeds)[name])
    x[200, 0] = 3  # the row max is 3 there: a zero divisor
    x[200, 1:] = 0
    with pytest.raises(InputError, match=f"node '{name}' \\({op}\\): {message}"):
        model.run(feeds)


# Gather --------------------------------------------------------------------------------------

def _gather_graph():
    b = GraphBuilder("gather")
    x = b.input("x", (3, 10), np.float32)
    i = b.input("i", (4,), I64)
    y = b.op("Gather", b.op("Relu", x), i, axis=1, name="the_gather")
    return b.build(b.op("Neg", y))


@pytest.mark.parametrize("plan", ["unfused", "fused"])
@pytest.mark.parametrize("bad", [10, -11, 2 ** 40, -(2 ** 63)])
def test_gather_out_of_range_is_an_input_error(plan, bad, cache_dir):
    g = _gather_graph()
    x = np.arange(30, dtype=np.float32).reshape(3, 10)
    feeds = {"x": x, "i": np.array([0, bad, -1, 3], I64)}
    with pytest.raises(InputError, match="node 'the_gather' \\(Gather\\): indices out of range \\[-10, 9\\]"):
        reference.run(g, feeds)
    model = build(g, _plans(g)[plan], cache_dir=cache_dir)
    with pytest.raises(InputError, match="node 'the_gather' \\(Gather\\): indices out of range \\[-10, 9\\]"):
        model.run(feeds)


@pytest.mark.parametrize("plan", ["unfused", "fused"])
def test_gather_negative_indices_in_range_stay_valid(plan, cache_dir):
    g = _gather_graph()
    x = np.arange(30, dtype=np.float32).reshape(3, 10)
    feeds = {"x": x, "i": np.array([-10, -1, 9, 0], I64)}
    got = build(g, _plans(g)[plan], cache_dir=cache_dir).run(feeds)
    _same(got, reference.run(g, feeds))


# Other run-time indices ------------------------------------------------------------------------

def _indexed_case(op: str):
    """A graph whose ``op`` takes run-time indices (then Neg, a fusable consumer), the good feeds,
    and the name of the index input with a bad value for it."""
    b = GraphBuilder(op.lower())
    f = np.float32
    if op == "GatherElements":
        y = b.op(op, b.input("x", (3, 4), f), b.input("i", (3, 2), I64), axis=1, name="the_op")
        feeds = {"x": np.arange(12, dtype=f).reshape(3, 4), "i": np.array([[0, 3], [-4, 1], [2, 2]], I64)}
        bad = ("i", (1, 1), 4)
    elif op == "GatherND":
        y = b.op(op, b.input("x", (3, 4), f), b.input("i", (2, 2), I64), name="the_op")
        feeds = {"x": np.arange(12, dtype=f).reshape(3, 4), "i": np.array([[0, 3], [-1, -4]], I64)}
        bad = ("i", (0, 1), 5)
    elif op == "ScatterElements":
        y = b.op(op, b.input("x", (3, 4), f), b.input("i", (1, 2), I64), b.input("u", (1, 2), f), axis=1,
                 name="the_op")
        feeds = {"x": np.zeros((3, 4), f), "i": np.array([[1, -1]], I64), "u": np.ones((1, 2), f)}
        bad = ("i", (0, 0), -5)
    elif op == "ScatterND":
        y = b.op(op, b.input("x", (4, 3), f), b.input("i", (2, 1), I64), b.input("u", (2, 3), f), name="the_op")
        feeds = {"x": np.zeros((4, 3), f), "i": np.array([[1], [-1]], I64), "u": np.ones((2, 3), f)}
        bad = ("i", (1, 0), 4)
    elif op == "MaxUnpool":
        y = b.op(op, b.input("x", (1, 1, 2, 2), f), b.input("i", (1, 1, 2, 2), I64), kernel_shape=[2, 2],
                 strides=[2, 2], name="the_op")
        feeds = {"x": np.ones((1, 1, 2, 2), f), "i": np.array([0, 3, 9, 15], I64).reshape(1, 1, 2, 2)}
        bad = ("i", (0, 0, 1, 1), 16)
    else:  # RoiAlign
        y = b.op(op, b.input("x", (2, 1, 4, 4), f), b.input("r", (1, 4), f), b.input("i", (1,), I64),
                 output_height=1, output_width=1, name="the_op")
        feeds = {"x": np.arange(32, dtype=f).reshape(2, 1, 4, 4), "r": np.array([[0, 0, 3, 3]], f),
                 "i": np.array([1], I64)}
        bad = ("i", (0,), 2)
    return b.build(b.op("Neg", y)), feeds, bad


@pytest.mark.parametrize("op", ["GatherElements", "GatherND", "ScatterElements", "ScatterND", "MaxUnpool",
                                "RoiAlign"])
def test_run_time_indices_out_of_range_are_an_input_error(op, cache_dir):
    """As Gather: the C kernels clamp a bad index (nothing outside a tensor is touched) and fail
    the run with an InputError naming the node, as the reference does; good indices (negative
    ones counting from the end where the op allows them) give the reference's values."""
    g, feeds, (name, where, value) = _indexed_case(op)
    from opfuse.compiler import CompileOptions, plan_model
    comp = plan_model(g, CompileOptions())
    models = [build(g, None, cache_dir=cache_dir), build(comp.graph, comp.plan, cache_dir=cache_dir)]
    for model in models:
        _same(model.run(feeds), reference.run(g, feeds))
    feeds[name] = feeds[name].copy()
    feeds[name][where] = value
    with pytest.raises(InputError, match="the_op"):
        reference.run(g, feeds)
    for model in models:
        with pytest.raises(InputError, match=f"node 'the_op' \\({op}\\): indices out of range"):
            model.run(feeds)


@pytest.mark.parametrize("sampling_ratio", [0, 2])
@pytest.mark.parametrize("box, message", [
    ([1, 1, np.nan, 4], "not finite"), ([np.inf, 1, 2, 4], "not finite"), ([1, -np.inf, 2, 4], "not finite"),
    ([-3e38, 0, 3e38, 2], "not finite"),            # the width overflows to infinity
    ([1, 1, 1e12, 4], "sampling grid"), ([-1e30, 0, 1e30, 2], "sampling grid")])
def test_roi_align_box_not_finite_or_too_large_is_an_input_error(box, message, sampling_ratio, cache_dir):
    """A RoiAlign box at run time: NaN or infinite coordinates made the reference raise ValueError or
    OverflowError (``int(ceil(nan))``) and the C code turn NaN into a loop count and an index (0 by
    luck on x86, reads far outside the image with a fixed sampling_ratio); a box like 1e12 wide gave
    an adaptive grid of 10^12 points per bin (hours). Both are the reference's ``InputError`` now, in
    every backend; a fixed sampling_ratio never makes a grid large, so a huge finite box there samples
    outside the image (zeros) and the first box's values stay the reference's."""
    if message == "sampling grid" and sampling_ratio:
        message = None
    b = GraphBuilder("roi")
    f = np.float32
    y = b.op("RoiAlign", b.input("x", (1, 2, 6, 6), f), b.input("r", (2, 4), f), b.input("i", (2,), I64),
             output_height=2, output_width=2, sampling_ratio=sampling_ratio, name="the_op")
    g = b.build(b.op("Relu", y))
    from opfuse.compiler import CompileOptions, plan_model
    comp = plan_model(g, CompileOptions())
    models = [build(g, None, cache_dir=cache_dir), build(comp.graph, comp.plan, cache_dir=cache_dir)]
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(f),
             "r": np.array([[0, 0, 3, 3], box], f), "i": np.zeros(2, I64)}
    if message is None:
        want = reference.run(g, feeds)
        for model in models:
            _same(model.run(feeds), want)
        return
    with pytest.raises(InputError, match=f"node 'the_op' \\(RoiAlign\\): .*{message}"):
        reference.run(g, feeds)
    for model in models:
        with pytest.raises(InputError, match=f"node 'the_op' \\(RoiAlign\\): .*{message}"):
            model.run(feeds)
    feeds["r"][1] = [1, 1, 5, 4]  # a good box: the reference's values
    for model in models:
        _same(model.run(feeds), reference.run(g, feeds))


@pytest.mark.parametrize("lens", [[5, 1, 1], [-1, 2, 2], [1, 2**40, 3]])
def test_reverse_sequence_length_out_of_range_is_an_input_error(lens, cache_dir):
    """A sequence length past the time axis made the C code read outside the tensor (length 5 of 4
    steps reversed from element 4) where the reference and onnxruntime refuse it; now it is the
    reference's InputError, fused and unfused, and good lengths give the reference's values."""
    b = GraphBuilder("rs")
    y = b.op("ReverseSequence", b.input("x", (4, 3, 2), np.float32), b.input("l", (3,), I64), batch_axis=1,
             time_axis=0, name="the_op")
    g = b.build(b.op("Abs", y))
    from opfuse.compiler import CompileOptions, plan_model
    comp = plan_model(g, CompileOptions())
    models = [build(g, None, cache_dir=cache_dir), build(comp.graph, comp.plan, cache_dir=cache_dir)]
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 3, 2)).astype(np.float32), "l": np.array(lens, I64)}
    with pytest.raises(InputError, match=r"node 'the_op' \(ReverseSequence\): sequence_lens must be in \[0, 4\]"):
        reference.run(g, feeds)
    for model in models:
        with pytest.raises(InputError, match=r"node 'the_op' \(ReverseSequence\): sequence_lens must be in \[0, 4\]"):
            model.run(feeds)
    feeds["l"] = np.array([0, 4, 2], I64)
    for model in models:
        _same(model.run(feeds), reference.run(g, feeds))


@pytest.mark.parametrize("k", [0, -3, 4, 2**62, -2**62, 2**63 - 1, -2**63])
def test_trilu_with_any_run_time_k(k, cache_dir):
    """k = -2^63 made the reference raise OverflowError (NumPy's tril); every k keeps the same elements
    in C and the reference."""
    b = GraphBuilder("tri")
    x, kk = b.input("x", (2, 3, 4), np.float32), b.input("k", (), I64)
    g = b.build(b.op("Trilu", x, kk, upper=1), b.op("Trilu", x, kk, upper=0))
    model = build(g, None, cache_dir=cache_dir)
    feeds = {"x": np.arange(24, dtype=np.float32).reshape(2, 3, 4) + 1, "k": np.array(k, I64)}
    want = reference.run(g, feeds)
    _same(model.run(feeds), want)
    lo, hi = want[g.outputs[0].name], want[g.outputs[1].name]
    if k >= 4:
        assert not lo.any() and (hi == feeds["x"]).all()
    if k <= -3:
        assert (lo == feeds["x"]).all()


@pytest.mark.parametrize("etype", [np.uint64, np.uint32, np.int64, np.int8])
@pytest.mark.parametrize("btype", [np.int32, np.int64])
def test_int_pow_with_a_uint64_exponent_above_2_to_the_63(btype, etype, cache_dir):
    """The C code read a uint64 exponent above 2^63 as a negative int64 (0 for 3 ** (2^64 - 1)); every
    exponent type now gives ``base ** e`` modulo 2^64 wrapped to the base's type, as the reference."""
    b = GraphBuilder("ipow")
    a = np.array([3, -3, 2, -1, 1, 0, 7, -5], btype)
    info = np.iinfo(etype)
    e = np.array([info.max, info.max - 1, 64, 65, 0, 1, 31 if info.max < 2**40 else 2**40 + 1, 3], etype)
    want = np.array([pow(int(x), int(y), 2 ** np.iinfo(btype).bits) for x, y in zip(a, e, strict=True)],
                    np.uint64).astype(btype)
    g = b.build(b.op("Pow", b.input("a", a.shape, btype), b.input("e", e.shape, etype)))
    np.testing.assert_array_equal(build(g, None, cache_dir=cache_dir).run({"a": a, "e": e})[g.outputs[0].name], want)
    np.testing.assert_array_equal(reference.run(g, {"a": a, "e": e})[g.outputs[0].name], want)


# NaN and infinities ----------------------------------------------------------------------------

def _specials(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=max(3, flat.size // 8), replace=False)
    flat[picks] = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32), size=picks.size)
    return x


def _nan_graph():
    b = GraphBuilder("nan")
    x = b.input("x", (2, 3, 8, 8))
    y = b.input("y", (2, 3, 8, 8))
    lo = b.input("lo", ())
    outs = [
        b.op("Max", x, y, name="max_xy"), b.op("Max", y, x, name="max_yx"),
        b.op("Min", x, y, name="min_xy"), b.op("Min", y, x, name="min_yx"),
        b.op("Max", x, y, b.op("Neg", x, name="neg_x"), name="max3"),
        b.op("Clip", x, lo, b.const("hi", np.float32(0.5)), name="clip_runtime_lo"),
        b.op("Clip", x, b.const("lo2", np.float32(-0.5)), b.const("hi2", np.float32(0.5)), name="clip_const"),
        b.op("MaxPool", x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], name="maxpool"),
        b.op("MaxPool", b.op("Relu", y, name="relu_y"), kernel_shape=[2, 2], strides=[2, 2], name="relu_maxpool"),
        b.op("ReduceMax", x, axes=[2, 3], name="reducemax_trailing"),
        b.op("ReduceMax", b.op("Reshape", x, b.const("s", np.array([2, 192], I64)), name="reshape_x"), axes=[1],
             name="reducemax_long_row"),
        b.op("ReduceMax", y, axes=[1], name="reducemax_inner"),
    ]
    return b.build(*outs)


@pytest.mark.parametrize("plan", ["unfused", "fused"])
def test_nan_and_inf_propagate_as_in_numpy(plan, cache_dir):
    g = _nan_graph()
    feeds = {"x": _specials((2, 3, 8, 8), 1), "y": _specials((2, 3, 8, 8), 2), "lo": np.float32(-1.0)}
    # fused: the pool and the reduction with the inline op before each (Relu is hoisted after the max)
    chosen = None if plan == "unfused" else group_by_names(g, [
        ("reduction", ["relu_y", "relu_maxpool"]), ("reduction", ["reshape_x", "reducemax_long_row"]),
        ("elementwise", ["neg_x", "max3"])])
    want = reference.run(g, feeds)
    _same(build(g, chosen, cache_dir=cache_dir).run(feeds), want)
    feeds["lo"] = NAN  # a NaN bound: np.maximum(x, nan) is NaN everywhere
    want = reference.run(g, feeds)
    assert np.isnan(want["clip_runtime_lo"]).all()
    _same(build(g, chosen, cache_dir=cache_dir).run(feeds), want)


def test_resnet8_with_one_nan_pixel_returns_nan_as_the_reference():
    from opfuse import zoo
    g = zoo.load("resnet8")
    feeds = reference.random_inputs(g, 0)
    name = g.inputs[0].name
    feeds[name][0, 0, 5, 7] = np.nan
    want = reference.run(g, feeds)
    assert all(np.isnan(v).all() for v in want.values())
    model = opfuse.compile(g, target="host")
    got = model.run(feeds)
    for out in want:
        assert np.isnan(got[out]).all(), f"resnet8 output '{out}' is {got[out]}, the reference gives NaN"
