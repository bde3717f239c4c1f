"""``TfIdfVectorizer`` imported as Gather / Equal / reductions / MatMul (integer token pools).

For each row of token ids ``x`` (``(C,)`` or ``(B, C)``), the ONNX definition counts every
occurrence of each pool n-gram (``min_gram_length <= n <= max_gram_length``): the tokens
``x[i], x[i + d], ..., x[i + (n - 1) d]`` for every start ``i`` and every distance
``d = 1 .. max_skip_count + 1`` (unigrams once, at ``d = 1``). Pool n-gram number ``g`` (in pool
order) adds to output column ``ngram_indexes[g]``; then

    TF:    y = count        IDF: y = (count > 0) * w        TFIDF: y = count * w

(``w`` the weights, else 1). With static shapes each n is a fixed set of windows, so

    windows_n = Gather(x, I_n, axis=-1)                         (..., S_n, n), I_n constant
    hits_n    = ReduceMin(Equal(windows_n[..., :, None, :], G_n), axis=-1)   (..., S_n, P_n)
    count     = sum_n ReduceSum(hits_n, S_n) @ M_n              (..., output_size)

with ``G_n`` the pool's n-grams ``(P_n, n)`` and ``M_n`` the constant ``(P_n, output_size)``
map of each n-gram to its column (a repeated n-gram counts once, at its last number, as in the
reference's trie). The comparison holds ``S_n * P_n * n`` elements per row; beyond
``TFIDF_MAX_COMPARISONS`` the node is refused. String pools are refused (string tensors are).
"""
from __future__ import annotations

import numpy as np

from opfuse.errors import ModelError, ShapeError, UnsupportedOpError
from opfuse.frontend.onnx_canonical import canonicalizes
from opfuse.frontend.onnx_decompose import _Writer

# The most elements of one n-gram size's comparison tensor (per row) imported this way.
TFIDF_MAX_COMPARISONS = 1 << 22
MODES = ("TF", "IDF", "TFIDF")


def _pool_grams(node, pool: np.ndarray, counts: list[int], lo: int, hi: int) -> dict[int, dict[tuple, int]]:
    """``{n: {n-gram: pool number}}`` for the loaded sizes (a repeated n-gram keeps its last number)."""
    grams: dict[int, dict[tuple, int]] = {}
    number = 0
    for size, start in enumerate(counts, start=1):
        end = counts[size] if size < len(counts) else len(pool)
        items = pool[start:end]
        if len(items) % size:
            raise ModelError(f"node '{node.name}' (TfIdfVectorizer): {len(items)} pool items for {size}-grams")
        for k in range(len(items) // size):
            if lo <= size <= hi:
                grams.setdefault(size, {})[tuple(int(t) for t in items[k * size:(k + 1) * size])] = number
            number += 1
    return grams


def _windows(c: int, n: int, max_skip: int) -> np.ndarray:
    """Start positions of every n-gram window of a row of ``c``: ``(S_n, n)`` token indices."""
    rows = [np.arange(i, i + (n - 1) * d + 1, d) for d in (range(1, max_skip + 2) if n > 1 else (1,))
            for i in range(c - (n - 1) * d)]
    return np.array(rows, np.int64).reshape(-1, n)


@canonicalizes("TfIdfVectorizer")
def tfidf_vectorizer(ctx, node, inputs):
    x = inputs[0]
    a = node.attrs
    if "pool_strings" in a or "pool_int64s" not in a:
        raise UnsupportedOpError("TfIdfVectorizer", node.name, ctx.opset,
                                 detail="a string pool (string tensors are not supported)")
    if x.dtype.kind not in "iu" or len(x.shape) not in (1, 2):
        raise ShapeError(f"node '{node.name}' (TfIdfVectorizer): input must be integer (C,) or (B, C), "
                         f"got {x.dtype}{list(x.shape)}")
    mode = a.get("mode")
    if mode not in MODES:
        raise ModelError(f"node '{node.name}' (TfIdfVectorizer): mode {mode!r} (one of {', '.join(MODES)})")
    lo, hi, skip = int(a.get("min_gram_length", 0)), int(a.get("max_gram_length", 0)), int(a.get("max_skip_count", 0))
    indexes = [int(i) for i in a.get("ngram_indexes", [])]
    counts = [int(c) for c in a.get("ngram_counts", [])]
    if not 1 <= lo <= hi or skip < 0 or not indexes or min(indexes) < 0:
        raise ModelError(f"node '{node.name}' (TfIdfVectorizer): gram lengths {lo}..{hi}, max_skip_count {skip}, "
                         f"ngram_indexes {indexes[:8]}")
    pool = np.asarray(a["pool_int64s"], np.int64)
    grams = _pool_grams(node, pool, counts, lo, hi)
    width = max(indexes) + 1
    weights = np.asarray(a.get("weights", []), np.float32)
    if weights.size and weights.size < width:
        raise ModelError(f"node '{node.name}' (TfIdfVectorizer): {weights.size} weights for {width} outputs")
    w = _Writer(ctx, node)
    c = int(x.shape[-1])
    lead = list(x.shape[:-1])
    xi = w.cast(x, np.int64)
    total = None
    for n, table in sorted(grams.items()):
        starts = _windows(c, n, skip)
        if not len(starts):
            continue
        if len(starts) * len(table) * n > TFIDF_MAX_COMPARISONS:
            raise UnsupportedOpError("TfIdfVectorizer", node.name, ctx.opset,
                                     detail=f"{len(starts)} windows x {len(table)} {n}-grams is over the "
                                            f"{TFIDF_MAX_COMPARISONS} comparisons opfuse imports")
        pool_n = np.array(list(table), np.int64).reshape(len(table), n)
        columns = np.zeros((len(table), width), np.float32)
        for k, number in enumerate(table.values()):
            if number >= len(indexes):
                raise ModelError(f"node '{node.name}' (TfIdfVectorizer): n-gram {number} has no ngram_indexes entry")
            columns[k, indexes[number]] = 1
        windows = w.op("Gather", [xi, w.const(f"windows{n}", starts)], {"axis": len(lead)})
        windows = w.op("Unsqueeze", [windows], {"axes": [len(lead) + 1]})         # (..., S, 1, n)
        equal = w.op("Cast", [w.op("Equal", [windows, w.const(f"grams{n}", pool_n)])], {"to": 1})
        hits = w.op("ReduceMin", [equal], {"axes": [-1], "keepdims": 0})          # (..., S, P)
        found = w.op("ReduceSum", [hits], {"axes": [len(lead)], "keepdims": 0})  # (..., P)
        part = w.op("MatMul", [found, w.const(f"columns{n}", columns)])
        total = part if total is None else w.op("Add", [total, part])
    if total is None:  # no n-gram fits: all zeros
        return [ctx.const(node.outputs[0], np.zeros(lead + [width], np.float32))]
    if mode == "IDF":
        present = w.op("Cast", [w.op("Greater", [total, w.const("zero", np.float32(0))])], {"to": 1},
                       last=not weights.size)
        if not weights.size:
            return [present]
        return [w.op("Mul", [present, w.const("weights", weights[:width])], last=True)]
    if mode == "TFIDF" and weights.size:
        return [w.op("Mul", [total, w.const("weights", weights[:width])], last=True)]
    return [total]
