"""``Einsum`` imported as the ordinary ops it is made of, so the fusion rules see a MatMul, a
ReduceSum or a Mul (an attention score ``bhqd,bhkd->bhqk`` is a batched MatMul like any other).

The equation ``terms[,term...][->output]`` (spaces ignored) names each operand's axes with letters;
``...`` stands for the leading axes an operand has beyond its letters, aligned from the right
across operands (NumPy broadcasting). Without ``->`` the output is the ellipsis axes followed by
the letters that occur exactly once, in ASCII order. With ``->`` an output that omits ``...``
while some operand has ellipsis axes is refused, as NumPy and the ONNX reference do.

    out[o] = sum over the other labels of prod_k operand_k[labels of k]

is computed in four steps, each an exact rewrite:

1. **Diagonals**: a letter repeated within one operand (``ii``, ``bii``) keeps its diagonal:
   the two axes moved last, merged into one of ``n * n`` (Reshape) and ``Gather`` of the positions
   ``0, n + 1, 2 (n + 1), ...``.
2. **Private sums**: a label of one operand that neither the output nor any operand still to be
   combined has is summed out first (``ReduceSum``), since ``sum_i a_i b = (sum_i a_i) b``.
3. **Pairwise products**, left to right: for the accumulated operand ``A`` and the next ``B``, the
   shared labels that are still needed are batch axes, the other shared ones are contracted:
   ``A`` is transposed to ``batch, A-only, contracted`` and reshaped to ``batch, M, K``, ``B`` to
   ``batch, K, N``; one ``MatMul`` gives ``batch, M, N``, reshaped back to the labels. With
   nothing to contract the product is a broadcast ``Mul`` (both transposed to one label order,
   missing labels as size-1 axes). A contracted label of size 1 in one operand and ``n`` in the
   other (broadcast) is summed in the larger first.
4. **Output order**: the remaining labels not in the output are summed out and the rest
   transposed into the output's order.

Transposes and reshapes that would not move anything are not emitted. A size-1 axis broadcasts
against a label's size ``n``; any other size mismatch is a ``ShapeError``.
"""
from __future__ import annotations

import math
import re

import numpy as np

from opfuse.errors import ModelError, ShapeError
from opfuse.frontend.onnx_canonical import canonicalizes
from opfuse.frontend.onnx_decompose import _Writer
from opfuse.frontend.onnx_import_context import ImportContext, OnnxNode
from opfuse.ir.graph import Value

_TERM = re.compile(r"^[A-Za-z]*(\.\.\.)?[A-Za-z]*$")
ELLIPSIS = "..."


class _Operand:
    """A value with one label per axis (letters, or ``"...k"`` for the k-th ellipsis axis)."""

    def __init__(self, value: Value, labels: list[str]):
        self.value, self.labels = value, labels

    def size(self, label: str) -> int:
        return int(self.value.shape[self.labels.index(label)])


def parse_equation(equation: str, ranks: list[int], node_name: str) -> tuple[list[list[str]], list[str]]:
    """``(labels per operand, output labels)`` of ``equation`` for operands of ``ranks``."""
    eq = "".join(equation.split())
    what = f"Einsum node '{node_name}': equation '{equation}'"
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ModelError(f"{what} has {len(terms)} operand term(s) for {len(ranks)} input(s)")
    for t in terms + ([rhs] if arrow else []):
        if not _TERM.match(t):
            raise ModelError(f"{what}: term '{t}' must be letters with at most one '...'")
    ell_counts = []
    for t, r in zip(terms, ranks, strict=True):
        letters = len(t.replace(ELLIPSIS, ""))
        ell = r - letters if ELLIPSIS in t else 0
        if ell < 0 or (ELLIPSIS not in t and letters != r):
            raise ModelError(f"{what}: term '{t}' does not fit an input of rank {r}")
        ell_counts.append(ell)
    n_ell = max(ell_counts, default=0)

    def expand(term: str, ell: int) -> list[str]:
        head, _, tail = term.partition(ELLIPSIS)
        return list(head) + [f"...{n_ell - ell + i}" for i in range(ell)] + list(tail)

    labels = [expand(t, e) for t, e in zip(terms, ell_counts, strict=True)]
    if arrow:
        if n_ell and ELLIPSIS not in rhs:
            raise ModelError(f"{what}: the output omits '...' while the inputs have {n_ell} ellipsis axes")
        out = expand(rhs, n_ell)
        seen = {lab for ls in labels for lab in ls}
        for lab in out:
            if lab not in seen:
                raise ModelError(f"{what}: output label '{lab}' is on no input")
        if len(set(out)) != len(out):
            raise ModelError(f"{what}: the output repeats a label")
    else:
        counts: dict[str, int] = {}
        for ls in labels:
            for lab in ls:
                counts[lab] = counts.get(lab, 0) + 1
        out = [f"...{i}" for i in range(n_ell)] + sorted(k for k, c in counts.items()
                                                         if c == 1 and not k.startswith(ELLIPSIS))
    return labels, out


class _Einsum:
    """Emits one Einsum's decomposition (steps 1-4 of the module docstring)."""

    def __init__(self, ctx: ImportContext, node: OnnxNode):
        self.w = _Writer(ctx, node)
        self.node = node

    # Small emitters that skip no-ops ---------------------------------------------------------
    def transpose(self, a: _Operand, order: list[str]) -> _Operand:
        perm = [a.labels.index(lab) for lab in order]
        if perm == list(range(len(perm))):
            return _Operand(a.value, list(order))
        return _Operand(self.w.op("Transpose", [a.value], {"perm": perm}), list(order))

    def reshape(self, v: Value, shape: list[int]) -> Value:
        if tuple(shape) == tuple(v.shape):
            return v
        return self.w.op("Reshape", [v, self.w.const("shape", np.array(shape, np.int64))])

    def reduce(self, a: _Operand, labels: list[str], keepdims: bool = False) -> _Operand:
        if not labels:
            return a
        axes = sorted(a.labels.index(lab) for lab in labels)
        v = self.w.op("ReduceSum", [a.value], {"axes": axes, "keepdims": int(keepdims)})
        return _Operand(v, list(a.labels) if keepdims else [lab for lab in a.labels if lab not in labels])

    # Steps ------------------------------------------------------------------------------------
    def diagonals(self, a: _Operand) -> _Operand:
        """Step 1: each repeated label reduced to its diagonal."""
        while len(set(a.labels)) != len(a.labels):
            lab = next(x for x in a.labels if a.labels.count(x) > 1)
            p = a.labels.index(lab)
            q = a.labels.index(lab, p + 1)
            n, m = int(a.value.shape[p]), int(a.value.shape[q])
            if n != m:
                raise ShapeError(f"Einsum node '{self.node.name}': label '{lab}' is repeated on axes of "
                                 f"sizes {n} and {m}")
            rest = [i for i in range(len(a.labels)) if i not in (p, q)]
            perm = rest + [p, q]
            v = a.value if perm == list(range(len(perm))) else self.w.op("Transpose", [a.value], {"perm": perm})
            lead = [int(a.value.shape[i]) for i in rest]
            flat = self.reshape(v, lead + [n * n])
            idx = self.w.const("diagonal", np.arange(n, dtype=np.int64) * (n + 1))
            a = _Operand(self.w.op("Gather", [flat, idx], {"axis": len(lead)}), [a.labels[i] for i in rest] + [lab])
        return a

    def private_sums(self, a: _Operand, needed: set[str]) -> _Operand:
        """Step 2: labels that nothing else needs, summed out."""
        return self.reduce(a, [lab for lab in a.labels if lab not in needed])

    def product(self, a: _Operand, b: _Operand, needed: set[str]) -> _Operand:
        """Step 3: ``a * b`` summed over their shared labels that are not ``needed``."""
        shared = [lab for lab in a.labels if lab in b.labels]
        contracted = [lab for lab in shared if lab not in needed]
        batch = [lab for lab in shared if lab in needed]
        a_only = [lab for lab in a.labels if lab not in b.labels]
        b_only = [lab for lab in b.labels if lab not in a.labels]
        for lab in shared:
            na, nb = a.size(lab), b.size(lab)
            if na != nb and 1 not in (na, nb):
                raise ShapeError(f"Einsum node '{self.node.name}': label '{lab}' has sizes {na} and {nb}")
        a = self.reduce(a, [lab for lab in contracted if a.size(lab) > b.size(lab)], keepdims=True)
        b = self.reduce(b, [lab for lab in contracted if b.size(lab) > a.size(lab)], keepdims=True)
        if not contracted:
            order = batch + a_only + b_only
            xa = self._aligned(a, order)
            xb = self._aligned(b, order)
            return _Operand(self.w.op("Mul", [xa, xb]), order)
        ta = self.transpose(a, batch + a_only + contracted)
        tb = self.transpose(b, batch + contracted + b_only)
        k = math.prod(a.size(lab) for lab in contracted)
        m = math.prod(a.size(lab) for lab in a_only)
        n = math.prod(b.size(lab) for lab in b_only)
        va = self.reshape(ta.value, [a.size(lab) for lab in batch] + [m, k])
        vb = self.reshape(tb.value, [b.size(lab) for lab in batch] + [k, n])
        prod = self.w.op("MatMul", [va, vb])
        sizes = [max(a.size(lab), b.size(lab)) for lab in batch]
        shape = sizes + [a.size(lab) for lab in a_only] + [b.size(lab) for lab in b_only]
        return _Operand(self.reshape(prod, shape), batch + a_only + b_only)

    def _aligned(self, a: _Operand, order: list[str]) -> Value:
        """``a`` transposed to ``order`` (its own labels) with size-1 axes for the labels it lacks."""
        t = self.transpose(a, [lab for lab in order if lab in a.labels])
        return self.reshape(t.value, [a.size(lab) if lab in a.labels else 1 for lab in order])

    def run(self, operands: list[_Operand], out: list[str]) -> Value:
        operands = [self.diagonals(a) for a in operands]

        def needed_besides(i: int, start: int) -> set[str]:
            others = {lab for j, o in enumerate(operands) if j != i and j >= start for lab in o.labels}
            return others | set(out)

        operands = [self.private_sums(a, needed_besides(i, 0)) for i, a in enumerate(operands)]
        acc = operands[0]
        for i in range(1, len(operands)):
            later = {lab for o in operands[i + 1:] for lab in o.labels} | set(out)
            acc = self.private_sums(acc, later | set(operands[i].labels))
            acc = self.product(acc, operands[i], later)
        acc = self.private_sums(acc, set(out))
        return self.transpose(acc, out).value


@canonicalizes("Einsum")
def einsum(ctx, node, inputs):
    if not inputs or any(v is None for v in inputs):
        raise ModelError(f"Einsum node '{node.name}' needs at least one input, and no empty one")
    equation = node.attrs.get("equation")
    if not isinstance(equation, str):
        raise ModelError(f"Einsum node '{node.name}' has no 'equation' attribute")
    labels, out = parse_equation(equation, [len(v.shape) for v in inputs], node.name)
    dtypes = {v.dtype for v in inputs}
    if len(dtypes) != 1:
        raise ModelError(f"Einsum node '{node.name}': inputs of different types {sorted(str(d) for d in dtypes)}")
    e = _Einsum(ctx, node)
    return [e.run([_Operand(v, ls) for v, ls in zip(inputs, labels, strict=True)], out)]
