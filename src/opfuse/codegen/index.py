"""Symbolic multi-indices: which element of a tensor a loop iteration touches, as C text.

An ``Index`` into a tensor of shape ``S`` holds one C expression per axis (``dims``) and,
optionally, *runs*: ``(a, b, e)`` says that ``e`` is the row-major linear index of the
sub-index ``dims[a:b]`` within ``S[a:b]``. Runs are what keep coalesced loops cheap: an
operand that is contiguous over ``a..b`` is addressed as ``e * stride[b-1]`` instead of
re-deriving every axis with ``/`` and ``%`` (the per-axis expressions are still there for
operands that need them, and the C compiler drops the ones nobody uses).

Index maps of the injective ops (broadcast, reshape, transpose, slice...) transform an
``Index`` of the output into an ``Index`` of the input, keeping runs whenever the map
keeps them affine.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

Run = tuple[int, int, str]


def inside_position(q: str, length: int) -> str:
    """A position in ``[0, length)`` that is ``q`` wherever ``q`` is in it: where a kernel reads an element that may
    lie outside its tensor (a pad, a window's tap) and then selects another value there, it reads here
    instead of under a condition (issue 13: gcc 12.2 at -O3 turned such guarded loads into masked vector loads
    that returned other memory). Outside, the position is ``length - 1`` (negative ``q`` are huge unsigned):
    any position inside serves. Written as an unsigned min because gcc folded the nearest-position clamp
    (``q < 0 ? 0 : (q >= L ? L - 1 : q)``) back into a masked load under the select at some widths (a
    float64 Pad, AveragePool and Conv; ``tools/masked_loads.py``); this form it has not."""
    last = length - 1
    if last == 0:
        return "0"
    return f"(long)((unsigned long)({q}) < {last}ul ? (unsigned long)({q}) : {last}ul)"


def is_int(expr: str) -> bool:
    return expr.lstrip("-").isdigit()


def mul(expr: str, k: int) -> str:
    """``expr * k`` with the trivial cases folded."""
    if k == 0 or expr == "0":
        return "0"
    if k == 1:
        return expr
    if is_int(expr):
        return str(int(expr) * k)
    return f"{expr} * {k}" if _atomic(expr) else f"({expr}) * {k}"


def add(*terms: str) -> str:
    """``t1 + t2 + ...`` with zeros dropped and integer constants summed."""
    const = 0
    parts = []
    for t in terms:
        if is_int(t):
            const += int(t)
        elif t:
            parts.append(t)
    if const or not parts:
        parts.append(str(const) if const >= 0 or not parts else f"- {-const}")
    text = " + ".join(parts)
    return text.replace("+ - ", "- ")


def div(expr: str, k: int) -> str:
    if k == 1 or expr == "0":
        return expr
    if is_int(expr):
        return str(int(expr) // k)
    return f"({_paren(expr)} / {k})"


def mod(expr: str, k: int) -> str:
    if k == 1:
        return "0"
    if is_int(expr):
        return str(int(expr) % k)
    return f"({_paren(expr)} % {k})"


def depth_to_space_channel(block: str, c: str, c_out: int, b: int, mode: str) -> str:
    """The input channel DepthToSpace (``mode`` DCR or CRD, block size ``b``, ``c_out`` output channels) reads
    for output channel ``c`` at position ``block = bh * b + bw`` within its ``b x b`` block."""
    return add(mul(block, c_out), c) if mode == "DCR" else add(mul(c, b * b), block)


def _atomic(expr: str) -> bool:
    return expr.replace("_", "").isalnum() or (expr.startswith("(") and expr.endswith(")")
                                                and _balanced_outer(expr))


def _balanced_outer(expr: str) -> bool:
    depth = 0
    for i, ch in enumerate(expr):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(expr) - 1:
            return False
    return True


def _paren(expr: str) -> str:
    return expr if _atomic(expr) else f"({expr})"


def stride_along(expr: str, var: str) -> int | None:
    """How an offset expression ``expr`` moves when the C variable ``var`` grows by one: 0 where ``var`` does
    not occur in it, 1 where it occurs once, as a term of the outermost sum (``var + m * 64``), None otherwise
    (a multiple, a quotient, a remainder, a subtraction: not known to be unit stride)."""
    tokens = re.findall(r"[A-Za-z_][A-Za-z_0-9]*|[0-9]+|\S", expr)
    hits = [i for i, t in enumerate(tokens) if t == var]
    if not hits:
        return 0
    if len(hits) > 1:
        return None
    i = hits[0]
    depth = sum(t == "(" for t in tokens[:i]) - sum(t == ")" for t in tokens[:i])
    before = tokens[i - 1] if i else "+"
    after = tokens[i + 1] if i + 1 < len(tokens) else "+"
    return 1 if depth == 0 and before == "+" and after in ("+", "-") else None


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def delinearize(lin: str, shape: Sequence[int]) -> list[str]:
    """Per-axis expressions of the row-major linear index ``lin`` over ``shape``."""
    strides = contiguous_strides(shape)
    out = []
    leading = True  # no extent>1 axis yet: the quotient needs no modulo
    for d, s in zip(shape, strides, strict=True):
        if d == 1:
            out.append("0")
        elif leading:
            out.append(div(lin, s))
            leading = False
        else:
            out.append(mod(div(lin, s), d))
    return out


def linearize(dims: Sequence[str], shape: Sequence[int]) -> str:
    strides = contiguous_strides(shape)
    return add(*(mul(e, s) for e, s, d in zip(dims, strides, shape, strict=True) if d != 1))


@dataclass(frozen=True)
class Index:
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    runs: tuple[Run, ...] = ()

    def __post_init__(self):
        assert len(self.shape) == len(self.dims), (self.shape, self.dims)
        # Axes of extent 1 always index 0: normalising them makes equal indices compare equal.
        object.__setattr__(self, "dims",
                           tuple("0" if d == 1 else e for d, e in zip(self.shape, self.dims, strict=True)))
        object.__setattr__(self, "runs", tuple(r for r in self.runs if r[1] - r[0] > 1))

    # Construction -----------------------------------------------------------------------
    @classmethod
    def linear(cls, shape: Sequence[int], lin: str) -> "Index":
        """The element at row-major position ``lin`` of a tensor of ``shape``."""
        shape = tuple(shape)
        return cls(shape, tuple(delinearize(lin, shape)), ((0, len(shape), lin),) if len(shape) > 1 else ())

    @classmethod
    def loops(cls, shape: Sequence[int], groups: Sequence[tuple[int, int, str]]) -> "Index":
        """An index over ``shape`` from loop variables, one per group of consecutive axes
        ``(start, stop, var)``: ``var`` runs over the row-major positions of ``shape[start:stop]``."""
        shape = tuple(shape)
        dims = ["0"] * len(shape)
        runs = []
        for a, b, var in groups:
            sub = delinearize(var, shape[a:b]) if b - a > 1 else [var]
            dims[a:b] = sub
            if b - a > 1:
                runs.append((a, b, var))
        return cls(shape, tuple(dims), tuple(runs))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def key(self) -> tuple:
        return (self.shape, self.dims, self.runs)

    # Addressing -------------------------------------------------------------------------
    def offset(self) -> str:
        """Element offset of this index in contiguous (row-major) storage of ``shape``."""
        strides = contiguous_strides(self.shape)
        covered: set[int] = set()
        terms = []
        for a, b, e in self.runs:
            terms.append(mul(e, strides[b - 1]))
            covered.update(range(a, b))
        for d in range(self.rank):
            if d not in covered and self.shape[d] != 1:
                terms.append(mul(self.dims[d], strides[d]))
        return add(*terms)

    def linear_expr(self) -> str:
        """Row-major linear position of this index (the offset in contiguous storage)."""
        return self.offset()

    # Index maps of the data-movement ops --------------------------------------------------
    def broadcast_to(self, in_shape: Sequence[int]) -> "Index":
        """The index an operand of shape ``in_shape`` is read at, when it broadcasts
        (NumPy rules: right-aligned, extent-1 axes repeat) to this index's shape."""
        in_shape = tuple(in_shape)
        k = self.rank - len(in_shape)
        assert k >= 0, (self.shape, in_shape)
        dims = tuple("0" if in_shape[j] == 1 else self.dims[j + k] for j in range(len(in_shape)))
        runs = []
        for a, b, e in self.runs:
            if a < k:
                if any(self.shape[d] != 1 for d in range(a, k)):
                    continue
                a = k
            if b - a > 1 and all(in_shape[d - k] == self.shape[d] for d in range(a, b)):
                runs.append((a - k, b - k, e))
        return Index(in_shape, dims, tuple(runs))

    def reshape_to(self, in_shape: Sequence[int]) -> "Index":
        """The input index of a reshape (same elements in row-major order) from ``in_shape``."""
        in_shape = tuple(in_shape)
        blocks = reshape_blocks(self.shape, in_shape)
        in_dims = ["0"] * len(in_shape)
        runs = []
        starts = {ob[0]: ib[0] for ob, ib in blocks}
        stops = {ob[1]: ib[1] for ob, ib in blocks}
        # An output run made of whole blocks is the same linear index over the input axes.
        for a, b, e in self.runs:
            if a in starts and b in stops:
                runs.append((starts[a], stops[b], e))
        for (oa, ob), (ia, ib) in blocks:
            if ib - ia == 0:
                continue
            if ob - oa == 1 and ib - ia == 1:
                in_dims[ia] = self.dims[oa]
                continue
            lin = self._block_linear(oa, ob)
            in_dims[ia:ib] = delinearize(lin, in_shape[ia:ib])
            if ib - ia > 1:
                runs.append((ia, ib, lin))
        return Index(in_shape, tuple(in_dims), _dedupe_runs(runs))

    def _block_linear(self, a: int, b: int) -> str:
        for ra, rb, e in self.runs:
            if ra == a and rb == b:
                return e
        return linearize(self.dims[a:b], self.shape[a:b])

    def transpose_from(self, perm: Sequence[int], in_shape: Sequence[int]) -> "Index":
        """Input index of ``Transpose(perm)``: output axis i is input axis perm[i]."""
        in_dims = ["0"] * len(perm)
        for i, p in enumerate(perm):
            in_dims[p] = self.dims[i]
        runs = []
        for a, b, e in self.runs:
            ps = [perm[i] for i in range(a, b)]
            if all(ps[t + 1] == ps[t] + 1 for t in range(len(ps) - 1)):
                runs.append((ps[0], ps[-1] + 1, e))
        return Index(tuple(in_shape), tuple(in_dims), tuple(runs))

    def transpose_to(self, perm: Sequence[int], out_shape: Sequence[int]) -> "Index":
        """Output index of ``Transpose(perm)`` for the input element at this index
        (output axis i holds input axis perm[i])."""
        dims = tuple(self.dims[p] for p in perm)
        inv = {p: i for i, p in enumerate(perm)}
        runs = []
        for a, b, e in self.runs:
            pos = [inv[d] for d in range(a, b)]
            if all(pos[t + 1] == pos[t] + 1 for t in range(len(pos) - 1)):
                runs.append((pos[0], pos[-1] + 1, e))
        return Index(tuple(out_shape), dims, tuple(runs))

    def with_axis(self, axis: int, expr: str, in_shape: Sequence[int], *, shift: int | None = None) -> "Index":
        """The same index with axis ``axis`` replaced by ``expr`` in a tensor of ``in_shape``.

        When the new axis value is the old one plus a constant ``shift``, runs covering the
        axis survive if every axis before it in the run has extent 1 (then the linear
        index just moves by ``shift * inner``)."""
        in_shape = tuple(in_shape)
        dims = list(self.dims)
        dims[axis] = expr
        runs = []
        for a, b, e in self.runs:
            if not a <= axis < b:
                if all(self.shape[d] == in_shape[d] for d in range(a, b)):
                    runs.append((a, b, e))
            elif shift is not None and all(self.shape[d] == 1 and in_shape[d] == 1 for d in range(a, axis)) \
                    and all(self.shape[d] == in_shape[d] for d in range(axis + 1, b)):
                inner = math.prod(in_shape[axis + 1:b])
                runs.append((a, b, add(e, mul(str(shift), inner))))
        return Index(in_shape, tuple(dims), tuple(runs))


def _dedupe_runs(runs: list[Run]) -> tuple[Run, ...]:
    """Keep non-overlapping runs, widest first (a wider run addresses more axes at once)."""
    kept: list[Run] = []
    for r in sorted(runs, key=lambda r: (-(r[1] - r[0]), r[0])):
        if all(r[1] <= k[0] or k[1] <= r[0] for k in kept):
            kept.append(r)
    return tuple(sorted(kept))


def reshape_blocks(out_shape: Sequence[int], in_shape: Sequence[int]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Pair consecutive axis ranges of two shapes with equal products (the finest such split).

    ``(1, 128, 768) -> (1, 128, 12, 64)`` pairs ``[0:2)`` with ``[0:2)`` and ``[2:3)`` with
    ``[2:4)``: within a block the linear index is the same on both sides. Shapes of no element
    (a 0 anywhere) are one block: no index is ever computed, and their axes need not pair up."""
    blocks = []
    i = j = 0
    no, ni = len(out_shape), len(in_shape)
    if 0 in out_shape or 0 in in_shape:
        return [((0, no), (0, ni))]
    while i < no or j < ni:
        si, sj = i, j
        po = pi = 1
        if i < no:
            po *= out_shape[i]
            i += 1
        if j < ni:
            pi *= in_shape[j]
            j += 1
        while po != pi:
            if po < pi and i < no:
                po *= out_shape[i]
                i += 1
            elif po > pi and j < ni:
                pi *= in_shape[j]
                j += 1
            else:
                raise ValueError(f"shapes {tuple(out_shape)} and {tuple(in_shape)} differ in size")
        blocks.append(((si, i), (sj, j)))
    return blocks
