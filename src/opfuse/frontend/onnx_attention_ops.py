"""Opset 24+ ops around attention, imported as ops opfuse has.

``TensorScatter(past_cache, update, write_indices; mode, axis)`` (a KV-cache update) is a
``ScatterElements`` along ``axis``: ``update[..., s, ...]`` lands at sequence position

    p(b, s) = write_indices[b] + s          (mode="linear")
    p(b, s) = (write_indices[b] + s) % L    (mode="circular", L = max_sequence_length)

for every prefix index whose first (batch) coordinate is ``b``. The index tensor, of ``update``'s
shape, is ``Expand(Reshape(write_indices, (B, 1, ..., 1)) + arange(S) along axis)`` (and the Mod):
computed at run time from ``write_indices``, folded to a constant when it is absent (all zeros)
or constant. The positions are distinct for one prefix (``S <= L``), so no two updates meet.
"""
from __future__ import annotations

import numpy as np

from opfuse.errors import ModelError, ShapeError
from opfuse.frontend.onnx_canonical import canonicalizes
from opfuse.frontend.onnx_decompose import _Writer


@canonicalizes("TensorScatter")
def tensor_scatter(ctx, node, inputs):
    cache, update = inputs[0], inputs[1]
    write = inputs[2] if len(inputs) > 2 else None
    mode = node.attrs.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ModelError(f"node '{node.name}' (TensorScatter): mode '{mode}' (linear or circular)")
    rank = len(cache.shape)
    axis = int(node.attrs.get("axis", -2))
    if not -rank <= axis < rank or axis % rank == 0:
        raise ModelError(f"node '{node.name}' (TensorScatter): axis {axis} for a cache of rank {rank} "
                         f"(the sequence axis comes after the batch axis)")
    axis %= rank
    if len(update.shape) != rank or any(u != c for i, (u, c) in enumerate(zip(update.shape, cache.shape, strict=True))
                                        if i != axis) or update.shape[axis] > cache.shape[axis]:
        raise ShapeError(f"node '{node.name}' (TensorScatter): update of shape {update.shape} for a cache of "
                         f"shape {cache.shape} along axis {axis}")
    batch, seq, length = int(cache.shape[0]), int(update.shape[axis]), int(cache.shape[axis])
    if write is not None and tuple(write.shape) != (batch,):
        raise ShapeError(f"node '{node.name}' (TensorScatter): write_indices of shape {write.shape}, "
                         f"expected ({batch},)")
    w = _Writer(ctx, node)
    steps = np.arange(seq, dtype=np.int64).reshape([seq if i == axis else 1 for i in range(rank)])
    if write is None:
        index = w.const("positions", steps)
    else:
        start = w.op("Reshape", [w.cast(write, np.int64), w.const("per_batch", np.array([batch] + [1] * (rank - 1),
                                                                                        np.int64))])
        index = w.op("Add", [start, w.const("steps", steps)])
    if mode == "circular":
        index = w.op("Mod", [index, w.const("length", np.array(length, np.int64))])
    index = w.op("Expand", [index, w.const("update_shape", np.array(update.shape, np.int64))])
    return [w.op("ScatterElements", [cache, index, update], {"axis": axis}, last=True)]
