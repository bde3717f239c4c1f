"""``codegen.index`` without a compiler (mutation testing: tests/MUTATION.md).

Two kinds of expectation, neither read from the implementation:

* the text of the small expression helpers, written out by hand from their docstrings (trivial cases
  folded, integer constants summed, parentheses only where C precedence needs them);
* the index maps, evaluated: every C index expression is evaluated in Python for every loop value and
  compared with NumPy's own answer for the same data movement (``reshape``, ``transpose``,
  ``broadcast_to``, slicing) on ``arange`` data, whose values are the input offsets.
"""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from opfuse.codegen.index import (Index, _dedupe_runs, add, contiguous_strides, delinearize, div, is_int,
                                  linearize, mod, mul, reshape_blocks)


def _c_eval(expr: str, **env: int) -> int:
    """Value of a C integer index expression (``+ - * / %``, non-negative operands) in Python."""
    assert re.fullmatch(r"[\w\s()+\-*/%]*", expr), expr
    return int(eval(expr.replace("/", "//"), {}, env))  # noqa: S307 - our own generated expression


# Expression helpers -------------------------------------------------------------------------------

def test_is_int_accepts_integer_literals_only():
    assert is_int("0") and is_int("42") and is_int("-3")
    assert not is_int("i3") and not is_int("X1") and not is_int("-i") and not is_int("3 - 1")
    assert not is_int("")


def test_mul_folds_the_trivial_cases():
    assert mul("i", 0) == "0"
    assert mul("0", 5) == "0"
    assert mul("i", 1) == "i"
    assert mul("(a + b)", 1) == "(a + b)"
    assert mul("6", 7) == "42"
    assert mul("-2", 3) == "-6"


def test_mul_parenthesises_only_what_is_not_atomic():
    assert mul("i3", 4) == "i3 * 4"
    assert mul("i_3", 4) == "i_3 * 4"  # an identifier with an underscore is one token
    assert mul("(i + 1)", 3) == "(i + 1) * 3"  # already enclosed
    assert mul("((a) + (b))", 2) == "((a) + (b)) * 2"
    assert mul("(a + (b))", 2) == "(a + (b)) * 2"
    assert mul("((a) + b)", 2) == "((a) + b) * 2"
    # starts with '(' and ends with ')' but the outer pair does not enclose the whole expression
    assert mul("(a) + (b)", 2) == "((a) + (b)) * 2"
    assert mul("(a) * (b + c)", 2) == "((a) * (b + c)) * 2"
    assert mul("a + b", 2) == "(a + b) * 2"
    assert mul("x[i]", 2) == "(x[i]) * 2"


def test_add_drops_zeros_and_sums_constants():
    assert add() == "0"
    assert add("0", "0") == "0"
    assert add("i", "0") == "i"
    assert add("", "i", "") == "i"
    assert add("i", "3") == "i + 3"
    assert add("2", "i", "1") == "i + 3"
    assert add("i", "-3") == "i - 3"
    assert add("i", "j", "-1", "-2") == "i + j - 3"
    assert add("-3") == "-3"
    assert add("-1", "-2") == "-3"
    assert add("4", "-4", "i") == "i"
    assert add("5") == "5"


def test_div_and_mod_fold_the_trivial_cases():
    assert div("i", 1) == "i"
    assert div("0", 4) == "0"
    assert div("i", 2) == "(i / 2)"
    assert div("12", 4) == "3"
    assert div("13", 4) == "3"
    assert div("i3", 4) == "(i3 / 4)"
    assert div("a + b", 4) == "((a + b) / 4)"
    assert div("(a + b)", 4) == "((a + b) / 4)"
    assert mod("i", 1) == "0"
    assert mod("i", 2) == "(i % 2)"
    assert mod("13", 4) == "1"
    assert mod("12", 4) == "0"
    assert mod("i", 3) == "(i % 3)"
    assert mod("a * 2", 3) == "((a * 2) % 3)"


def test_contiguous_strides_are_row_major():
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert contiguous_strides((5,)) == (1,)
    assert contiguous_strides(()) == ()


def test_delinearize_text():
    # the leading extent>1 axis needs no modulo; extent-1 axes index 0
    assert delinearize("i", (2, 3)) == ["(i / 3)", "(i % 3)"]
    assert delinearize("i", (2, 1, 3)) == ["(i / 3)", "0", "(i % 3)"]
    assert delinearize("i", (1, 1, 4)) == ["0", "0", "i"]
    assert delinearize("i", (1, 4, 1)) == ["0", "i", "0"]
    assert delinearize("i", (4, 5, 6)) == ["(i / 30)", "((i / 6) % 5)", "(i % 6)"]


def test_delinearize_and_linearize_agree_with_numpy():
    for shape in [(4, 5, 6), (2, 1, 3), (1, 7), (3, 1, 1, 2), (6,)]:
        dims = delinearize("i", shape)
        lin = linearize(["a", "b", "c", "d"][:len(shape)], shape)
        for p in range(int(np.prod(shape))):
            expected = np.unravel_index(p, shape)
            assert [_c_eval(e, i=p) for e in dims] == list(expected)
            env = dict(zip("abcd", (int(x) for x in expected), strict=False))
            assert _c_eval(lin, **env) == p


def test_linearize_text_and_length_check():
    assert linearize(["a", "b"], (2, 3)) == "a * 3 + b"
    assert linearize(["a", "b", "c"], (2, 1, 3)) == "a * 3 + c"  # the extent-1 axis contributes nothing
    assert linearize(["0", "b"], (1, 3)) == "b"
    with pytest.raises(ValueError):
        linearize(["a"], (2, 3))
    with pytest.raises(ValueError):
        linearize(["a", "b", "c"], (2, 3))


# reshape_blocks and _dedupe_runs --------------------------------------------------------------------

def test_reshape_blocks_pairs_the_finest_equal_products():
    assert reshape_blocks((1, 128, 768), (1, 128, 12, 64)) == [((0, 1), (0, 1)), ((1, 2), (1, 2)),
                                                               ((2, 3), (2, 4))]
    assert reshape_blocks((6, 2), (2, 3, 2)) == [((0, 1), (0, 2)), ((1, 2), (2, 3))]
    assert reshape_blocks((2, 3, 2), (6, 2)) == [((0, 2), (0, 1)), ((2, 3), (1, 2))]
    assert reshape_blocks((4, 6), (2, 12)) == [((0, 2), (0, 2))]
    assert reshape_blocks((6,), (2, 3)) == [((0, 1), (0, 2))]
    # trailing extent-1 axes on one side only are blocks of their own
    assert reshape_blocks((4, 1), (4,)) == [((0, 1), (0, 1)), ((1, 2), (1, 1))]
    assert reshape_blocks((4,), (4, 1)) == [((0, 1), (0, 1)), ((1, 1), (1, 2))]
    assert reshape_blocks((), ()) == []
    assert reshape_blocks((), (1,)) == [((0, 0), (0, 1))]


def test_reshape_blocks_of_empty_shapes_is_one_block():
    assert reshape_blocks((0, 3), (3, 0)) == [((0, 2), (0, 2))]
    assert reshape_blocks((2, 0), (0,)) == [((0, 2), (0, 1))]


def test_reshape_blocks_refuses_different_sizes():
    with pytest.raises(ValueError, match="differ in size"):
        reshape_blocks((2, 3), (7,))
    with pytest.raises(ValueError, match="differ in size"):
        reshape_blocks((4, 3), (2, 5))


def test_dedupe_runs_keeps_the_widest_non_overlapping():
    assert _dedupe_runs([(0, 2, "x"), (0, 3, "y")]) == ((0, 3, "y"),)
    assert _dedupe_runs([(0, 3, "y"), (1, 3, "x")]) == ((0, 3, "y"),)
    assert _dedupe_runs([(1, 4, "x"), (0, 2, "y")]) == ((1, 4, "x"),)
    assert _dedupe_runs([(0, 3, "x"), (2, 4, "y")]) == ((0, 3, "x"),)
    # touching runs do not overlap: both kept, in axis order
    assert _dedupe_runs([(2, 4, "y"), (0, 2, "x")]) == ((0, 2, "x"), (2, 4, "y"))
    assert _dedupe_runs([(0, 2, "x"), (2, 5, "y")]) == ((0, 2, "x"), (2, 5, "y"))
    assert _dedupe_runs([(0, 3, "x"), (3, 5, "y")]) == ((0, 3, "x"), (3, 5, "y"))
    # equal widths: the first axis wins
    assert _dedupe_runs([(1, 3, "b"), (0, 2, "a")]) == ((0, 2, "a"),)
    assert _dedupe_runs([]) == ()


# Index maps, evaluated against NumPy ---------------------------------------------------------------

def _loop_values(groups, shape):
    """Every assignment of the loop variables of ``groups`` over ``shape``, in row-major order."""
    ranges = [range(int(np.prod(shape[a:b]))) for a, b, _ in groups]
    for vals in itertools.product(*ranges):
        yield dict(zip((v for _, _, v in groups), vals, strict=True))


def _check(idx: Index, groups, out_shape, expected_offsets: np.ndarray) -> None:
    """``idx`` (an index of the input, made from loops over ``out_shape``) addresses, at each output
    position in row-major order, the input offset NumPy gives; its per-axis dims agree with it too."""
    flat = expected_offsets.reshape(-1)
    off = idx.offset()
    n = 0
    for p, env in enumerate(_loop_values(groups, out_shape)):
        want = int(flat[p])
        assert _c_eval(off, **env) == want, (off, env, want)
        assert [_c_eval(e, **env) for e in idx.dims] == list(np.unravel_index(want, idx.shape)), (idx.dims, env)
        n += 1
    assert n == flat.size


@pytest.mark.parametrize("shape,groups", [
    ((2, 3, 4), [(0, 3, "i")]),
    ((2, 3, 4), [(0, 1, "i"), (1, 3, "j")]),
    ((2, 3, 4), [(0, 2, "i"), (2, 3, "j")]),
    ((2, 1, 4), [(0, 3, "i")]),
    ((5,), [(0, 1, "i")]),
    ((4, 5), [(0, 2, "i")]),
])
def test_loops_and_linear_address_every_element_in_order(shape, groups):
    idx = Index.loops(shape, groups)
    _check(idx, groups, shape, np.arange(int(np.prod(shape))).reshape(shape))
    lin = Index.linear(shape, "i")
    _check(lin, [(0, len(shape), "i")], shape, np.arange(int(np.prod(shape))).reshape(shape))
    assert lin.runs == (((0, len(shape), "i"),) if len(shape) > 1 else ())


def test_extent_one_axes_index_zero_and_short_runs_are_dropped():
    idx = Index((2, 1, 3), ("a", "b", "c"), ((0, 1, "x"), (1, 2, "y"), (0, 3, "z")))
    assert idx.dims == ("a", "0", "c")
    assert idx.runs == ((0, 3, "z"),)
    assert idx.key() == ((2, 1, 3), ("a", "0", "c"), ((0, 3, "z"),))
    assert Index((2, 3), ("a", "b")).key() == Index((2, 3), ("a", "b"), ((0, 1, "a"),)).key()
    assert Index((2, 3), ("a", "b")).rank == 2
    with pytest.raises(AssertionError):
        Index((2, 3), ("a",))


def test_offset_uses_runs_and_remaining_axes():
    # a run over axes 1..3 of (2, 3, 4, 5) is addressed as e * 5; axis 0 by its own stride
    idx = Index((2, 3, 4, 5), ("a", "b", "c", "d"), ((1, 3, "r"),))
    assert idx.offset() == "r * 5 + a * 60 + d"
    assert Index((3, 1), ("a", "b")).offset() == "a"
    assert Index((), ()).offset() == "0"


RESHAPES = [
    ((2, 3, 4), (6, 4), [(0, 3, "i")]),
    ((2, 3, 4), (6, 4), [(0, 2, "i"), (2, 3, "j")]),
    ((2, 3, 4), (6, 4), [(0, 1, "i"), (1, 2, "j"), (2, 3, "k")]),
    ((6, 4), (2, 3, 4), [(0, 1, "i"), (1, 2, "j")]),
    ((6, 4), (2, 3, 4), [(0, 2, "i")]),
    ((4, 6), (2, 12), [(0, 1, "i"), (1, 2, "j")]),
    ((4, 6), (2, 12), [(0, 2, "i")]),
    ((2, 3, 4, 5), (6, 20), [(0, 2, "i"), (2, 4, "j")]),
    ((2, 3, 4, 5), (6, 4, 5), [(0, 4, "i")]),
    ((2, 3, 4, 5), (2, 60), [(0, 1, "i"), (1, 4, "j")]),
    ((1, 4, 1), (4,), [(0, 3, "i")]),
    ((4,), (1, 2, 1, 2), [(0, 1, "i")]),
    ((2, 6), (2, 2, 3), [(0, 1, "i"), (1, 2, "j")]),
    ((3, 2, 2), (3, 4), [(0, 1, "i"), (1, 3, "j")]),
    # a run that starts at a block's start but ends inside the next block: not a run of the input
    ((2, 3, 4), (2, 12), [(0, 2, "i"), (2, 3, "j")]),
    ((2, 3, 4), (6, 2, 2), [(0, 1, "i"), (1, 3, "j")]),
]


@pytest.mark.parametrize("out_shape,in_shape,groups", RESHAPES)
def test_reshape_to_reads_the_same_row_major_element(out_shape, in_shape, groups):
    idx = Index.loops(out_shape, groups).reshape_to(in_shape)
    assert idx.shape == in_shape
    _check(idx, groups, out_shape, np.arange(int(np.prod(in_shape))).reshape(in_shape).reshape(out_shape))
    covered = [d for a, b, _ in idx.runs for d in range(a, b)]
    assert len(covered) == len(set(covered))  # runs never overlap


def test_reshape_to_keeps_a_run_of_whole_blocks():
    # the run over (2, 3, 4) is one linear index: the input (6, 4) reads it as one run too
    idx = Index.loops((2, 3, 4), [(0, 3, "i")]).reshape_to((6, 4))
    assert idx.runs == ((0, 2, "i"),)
    assert idx.offset() == "i"
    # split across blocks: (2, 3 | 4) -> (6 | 4): the block (0, 2) is one linear index over the run i
    idx = Index.loops((2, 3, 4), [(0, 2, "i"), (2, 3, "j")]).reshape_to((6, 4))
    assert idx.dims == ("i", "j")
    assert idx.offset() == "i * 4 + j"
    # one output axis read as two input axes: they form a run of that axis's loop variable
    idx = Index.loops((6, 4), [(0, 1, "i"), (1, 2, "j")]).reshape_to((2, 3, 4))
    assert idx.runs == ((0, 2, "i"),)
    assert idx.offset() == "i * 4 + j"


@pytest.mark.parametrize("in_shape,perm,groups", [
    ((2, 3, 4), (0, 1, 2), [(0, 3, "i")]),
    ((2, 3, 4), (2, 0, 1), [(0, 1, "i"), (1, 3, "j")]),
    ((2, 3, 4), (1, 2, 0), [(0, 2, "i"), (2, 3, "j")]),
    ((2, 3, 4), (0, 2, 1), [(0, 1, "i"), (1, 2, "j"), (2, 3, "k")]),
    ((2, 3, 4, 5), (0, 3, 1, 2), [(0, 1, "i"), (1, 2, "j"), (2, 4, "k")]),
    ((2, 3, 4, 5), (2, 3, 0, 1), [(0, 2, "i"), (2, 4, "j")]),
    ((2, 3, 4), (1, 0, 2), [(0, 3, "i")]),
    ((2, 3, 4, 5), (0, 1, 3, 2), [(0, 3, "i"), (3, 4, "j")]),
])
def test_transpose_from_reads_numpys_element(in_shape, perm, groups):
    out_shape = tuple(in_shape[p] for p in perm)
    idx = Index.loops(out_shape, groups).transpose_from(perm, in_shape)
    assert idx.shape == in_shape
    _check(idx, groups, out_shape, np.arange(int(np.prod(in_shape))).reshape(in_shape).transpose(perm))


@pytest.mark.parametrize("in_shape,perm,groups", [
    ((2, 3, 4), (2, 0, 1), [(0, 3, "i")]),
    ((2, 3, 4), (1, 2, 0), [(0, 2, "i"), (2, 3, "j")]),
    ((2, 3, 4, 5), (0, 3, 1, 2), [(0, 1, "i"), (1, 3, "j"), (3, 4, "k")]),
    ((2, 3, 4, 5), (2, 3, 0, 1), [(0, 2, "i"), (2, 4, "j")]),
    ((2, 3, 4), (1, 0, 2), [(0, 3, "i")]),
    ((2, 3, 4, 5), (0, 1, 3, 2), [(0, 3, "i"), (3, 4, "j")]),
])
def test_transpose_to_writes_where_numpy_puts_the_element(in_shape, perm, groups):
    """The output offset of each input element: the inverse permutation's gather."""
    out_shape = tuple(in_shape[p] for p in perm)
    idx = Index.loops(in_shape, groups).transpose_to(perm, out_shape)
    assert idx.shape == out_shape
    where = np.arange(int(np.prod(out_shape))).reshape(out_shape).transpose(np.argsort(perm))
    _check(idx, groups, in_shape, where)


def test_transpose_keeps_runs_over_axes_that_stay_consecutive():
    idx = Index.loops((2, 3, 4, 5), [(0, 2, "i"), (2, 4, "j")]).transpose_from((2, 3, 0, 1), (4, 5, 2, 3))
    assert set(idx.runs) == {(0, 2, "j"), (2, 4, "i")}
    idx = Index.loops((2, 3, 4), [(0, 3, "i")]).transpose_from((0, 2, 1), (2, 4, 3))
    assert idx.runs == ()
    idx = Index.loops((2, 3, 4), [(0, 3, "i")]).transpose_from((0, 1, 2), (2, 3, 4))
    assert idx.runs == ((0, 3, "i"),)
    idx = Index.loops((2, 3, 4), [(0, 3, "i")]).transpose_to((0, 1, 2), (2, 3, 4))
    assert idx.runs == ((0, 3, "i"),)
    idx = Index.loops((4, 5, 2, 3), [(0, 2, "i"), (2, 4, "j")]).transpose_to((2, 3, 0, 1), (2, 3, 4, 5))
    assert set(idx.runs) == {(0, 2, "j"), (2, 4, "i")}
    idx = Index.loops((2, 3, 4), [(0, 2, "i"), (2, 3, "j")]).transpose_to((1, 0, 2), (3, 2, 4))
    assert idx.runs == ()


@pytest.mark.parametrize("out_shape,in_shape,groups", [
    ((2, 3, 4), (2, 3, 4), [(0, 3, "i")]),
    ((2, 3, 4), (3, 4), [(0, 3, "i")]),
    ((2, 3, 4), (3, 4), [(0, 1, "i"), (1, 3, "j")]),
    ((2, 3, 4), (1, 3, 4), [(0, 3, "i")]),
    ((2, 3, 4), (2, 1, 4), [(0, 3, "i")]),
    ((2, 3, 4), (4,), [(0, 3, "i")]),
    ((2, 3, 4), (2, 3, 1), [(0, 2, "i"), (2, 3, "j")]),
    ((1, 1, 3, 4), (3, 4), [(0, 4, "i")]),
    ((1, 2, 3, 4), (3, 4), [(0, 4, "i")]),
    ((1, 2, 3, 4), (2, 3, 4), [(0, 4, "i")]),
    ((2, 3, 4), (), [(0, 3, "i")]),
])
def test_broadcast_to_reads_numpys_element(out_shape, in_shape, groups):
    idx = Index.loops(out_shape, groups).broadcast_to(in_shape)
    assert idx.shape == in_shape
    src = np.arange(int(np.prod(in_shape))).reshape(in_shape)
    _check(idx, groups, out_shape, np.broadcast_to(src, out_shape))


def test_broadcast_to_keeps_a_run_only_where_the_shapes_agree():
    assert Index.loops((2, 3, 4), [(0, 3, "i")]).broadcast_to((2, 3, 4)).runs == ((0, 3, "i"),)
    assert Index.loops((1, 3, 4), [(0, 3, "i")]).broadcast_to((3, 4)).runs == ((0, 2, "i"),)
    assert Index.loops((1, 1, 3, 4), [(0, 4, "i")]).broadcast_to((3, 4)).runs == ((0, 2, "i"),)
    assert Index.loops((2, 3, 4), [(0, 3, "i")]).broadcast_to((3, 4)).runs == ()
    assert Index.loops((2, 3, 4), [(0, 1, "i"), (1, 3, "j")]).broadcast_to((3, 4)).runs == ((0, 2, "j"),)
    assert Index.loops((2, 3, 4), [(0, 3, "i")]).broadcast_to((2, 1, 4)).runs == ()
    # a run starting below the dropped leading axes keeps its part over the operand's axes when the axes
    # it loses are all of extent 1, whatever the axes before it
    assert Index.loops((2, 1, 3, 4), [(0, 1, "i"), (1, 4, "j")]).broadcast_to((3, 4)).runs == ((0, 2, "j"),)
    # a run that cannot be kept does not stop the next one from being kept
    assert Index.loops((2, 3, 4, 5), [(0, 2, "i"), (2, 4, "j")]).broadcast_to((4, 5)).runs == ((0, 2, "j"),)
    with pytest.raises(AssertionError):
        Index.loops((3, 4), [(0, 2, "i")]).broadcast_to((2, 3, 4))


@pytest.mark.parametrize("out_shape,axis,start,in_extent,groups", [
    ((2, 3, 4), 2, 1, 6, [(0, 3, "i")]),
    ((2, 3, 4), 1, 2, 7, [(0, 3, "i")]),
    ((2, 3, 4), 0, 3, 5, [(0, 3, "i")]),
    ((1, 3, 4), 1, 2, 7, [(0, 3, "i")]),
    ((1, 1, 3, 4), 2, 1, 5, [(0, 4, "i")]),
    ((2, 3, 4), 1, 1, 5, [(0, 1, "i"), (1, 3, "j")]),
    ((2, 3, 4), 0, 1, 3, [(0, 1, "i"), (1, 3, "j")]),
    ((2, 3, 4), 2, 0, 4, [(0, 3, "i")]),
    ((1, 1, 4), 2, 1, 6, [(0, 2, "i"), (2, 3, "j")]),  # a run just before the axis, over extent-1 axes
])
def test_with_axis_shift_reads_the_slice(out_shape, axis, start, in_extent, groups):
    """``out = x[..., start:start + n, ...]`` along ``axis``: the input index is the output's with that
    axis moved by ``start``; runs are kept only where that is still a linear index plus a constant."""
    in_shape = tuple(in_extent if d == axis else s for d, s in enumerate(out_shape))
    base = Index.loops(out_shape, groups)
    idx = base.with_axis(axis, add(base.dims[axis], str(start)), in_shape, shift=start)
    assert idx.shape == in_shape
    src = np.arange(int(np.prod(in_shape))).reshape(in_shape)
    sl = tuple(slice(start, start + out_shape[axis]) if d == axis else slice(None) for d in range(len(in_shape)))
    _check(idx, groups, out_shape, src[sl])
    # without ``shift`` every run over the axis is dropped, the result is the same
    plain = base.with_axis(axis, add(base.dims[axis], str(start)), in_shape)
    assert all(not a <= axis < b for a, b, _ in plain.runs)
    _check(plain, groups, out_shape, src[sl])


def test_with_axis_keeps_runs_as_documented():
    # run over every axis, axes before the shifted one of extent 1: the run moves by shift * inner
    base = Index.loops((1, 3, 4), [(0, 3, "i")])
    idx = base.with_axis(1, add(base.dims[1], "2"), (1, 7, 4), shift=2)
    assert idx.runs == ((0, 3, "i + 8"),)
    # an axis of extent > 1 before the shifted one in the run: the run is dropped
    base = Index.loops((2, 3, 4), [(0, 3, "i")])
    assert base.with_axis(1, add(base.dims[1], "2"), (2, 7, 4), shift=2).runs == ()
    # the shifted axis is the run's first: the run moves by shift * inner = 1 * 12
    assert base.with_axis(0, add(base.dims[0], "1"), (3, 3, 4), shift=1).runs == ((0, 3, "i + 12"),)
    # a later axis of the run changes extent (not a slice of the shifted axis alone): dropped
    assert base.with_axis(0, add(base.dims[0], "1"), (3, 3, 5), shift=1).runs == ()
    # only the run's own axes before the shifted one must be of extent 1
    base = Index.loops((2, 3, 4), [(0, 1, "i"), (1, 3, "j")])
    assert base.with_axis(1, add(base.dims[1], "2"), (2, 7, 4), shift=2).runs == ((1, 3, "j + 8"),)
    # a run that does not cover the replaced axis keeps its expression
    base = Index.loops((2, 3, 4), [(0, 1, "i"), (1, 3, "j")])
    idx = base.with_axis(0, "k", (5, 3, 4))
    assert idx.runs == ((1, 3, "j"),) and idx.dims[0] == "k"
    # ... unless its extents differ in the new shape
    assert base.with_axis(0, "k", (5, 3, 6)).runs == ()
    idx = Index.loops((2, 3, 4, 5), [(0, 1, "i"), (1, 2, "j"), (2, 4, "k")]).with_axis(1, "q", (2, 3, 4, 5))
    assert idx.runs == ((2, 4, "k"),) and idx.dims[1] == "q"
