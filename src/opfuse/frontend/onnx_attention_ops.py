"""Opset 24+ ops around attention, imported as ops opfuse has.

``TensorScatter(past_cache, update, write_indices; mode, axis)`` (a KV-cache update) is a
``ScatterElements`` along ``axis``: ``update[..., s, ...]`` lands at sequence position

    p(b, s) = write_indices[b] + s          (mode="linear")
    p(b, s) = (write_indices[b] + s) % L    (mode="circular", L = max_sequence_length)

for every prefix index whose first (batch) coordinate is ``b``. The index tensor, of ``update``'s
shape, is ``Expand(Reshape(write_indices, (B, 1, ..., 1)) + arange(S) along axis)`` (and the Mod):
computed at run time from ``write_indices``, folded to a constant when it is absent (all zeros)
or constant. The positions are distinct for one prefix (``S <= L``), so no two updates meet.

``LinearAttention(query, key, value, past_state, decay, beta)`` is its recurrence unrolled over
the (static) sequence length T, every step batched over (B, H):

    S_t = exp(g_t) * S_{t-1}                      (gated, gated_delta)
    v_t = beta_t * (v_t - S_t^T k_t)              (delta, gated_delta; S_t after the decay)
    S_t = S_t + k_t v_t^T                         (outer product: (d_k, 1) * (1, d_v))
    o_t = scale * q_t^T S_t                       (a (1, d_k) x (d_k, d_v) MatMul per head)

in float32 (as the ONNX definition accumulates), each KV head's state read by the
``q_num_heads / kv_num_heads`` query heads of its group (Expand of the state), the outputs
concatenated over T and packed back to ``(B, T, H_q * d_v)``; ``present_state`` is the last
``S_T`` in ``past_state``'s type (the query's without one). Each step is about a dozen ops, so
a sequence longer than ``LINEAR_ATTENTION_MAX_STEPS`` is refused (it needs a recurrent kernel).
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from opfuse.errors import ModelError, ShapeError, UnsupportedOpError
from opfuse.frontend.onnx_canonical import canonicalizes
from opfuse.frontend.onnx_decompose import _Writer
from opfuse.ir.graph import Value

# The longest sequence LinearAttention is unrolled over (about 12 ops a step).
LINEAR_ATTENTION_MAX_STEPS = 256
UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")
F32 = np.dtype(np.float32)


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


def _heads_first(w: _Writer, x: Value, heads: int, tag: str) -> Value:
    """``(B, T, H * D)`` -> ``(B, H, T, D)``."""
    b, t, hd = (int(d) for d in x.shape)
    x = w.op("Reshape", [x, w.const(f"{tag}_heads", np.array([b, t, heads, hd // heads], np.int64))])
    return w.op("Transpose", [x], {"perm": [0, 2, 1, 3]})


@canonicalizes("LinearAttention")
def linear_attention(ctx, node, inputs):
    q, k, v = inputs[:3]
    past, decay, beta = (list(inputs[3:]) + [None, None, None])[:3]
    a = node.attrs
    what = f"node '{node.name}' (LinearAttention)"
    rule = a.get("update_rule", "gated_delta")
    if rule not in UPDATE_RULES:
        raise ModelError(f"{what}: update_rule '{rule}' (one of {', '.join(UPDATE_RULES)})")
    hq, hkv = int(a.get("q_num_heads", 0)), int(a.get("kv_num_heads", 0))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise ModelError(f"{what}: q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise ModelError(f"{what}: update_rule '{rule}' {'needs' if gating else 'forbids'} decay and "
                         f"{'needs' if delta else 'forbids'} beta")
    if any(len(x.shape) != 3 for x in (q, k, v)) or q.shape[-1] % hq or k.shape[-1] % hkv or v.shape[-1] % hkv:
        raise ShapeError(f"{what}: query, key, value must be (B, T, H * D) for {hq} and {hkv} heads, got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    b, t = int(q.shape[0]), int(q.shape[1])
    dk, dv, group = int(q.shape[-1]) // hq, int(v.shape[-1]) // hkv, hq // hkv
    if k.shape != (b, t, hkv * dk) or v.shape[:2] != (b, t):
        raise ShapeError(f"{what}: key {k.shape} and value {v.shape} for query {q.shape}")
    if t > LINEAR_ATTENTION_MAX_STEPS:
        raise UnsupportedOpError("LinearAttention", node.name, ctx.opset,
                                 detail=f"a sequence of {t} steps is longer than the {LINEAR_ATTENTION_MAX_STEPS} "
                                        f"opfuse unrolls (no recurrent kernel)")
    state_shape = (b, hkv, dk, dv)
    if past is not None and past.shape != state_shape:
        raise ShapeError(f"{what}: past_state of shape {past.shape}, expected {state_shape}")
    w = _Writer(ctx, node)
    q4, k4, v4 = (_heads_first(w, w.cast(x, F32), h, tag) for x, h, tag in ((q, hq, "q"), (k, hkv, "k"), (v, hkv, "v")))
    if gating:
        if len(decay.shape) != 3 or decay.shape[:2] != (b, t) or decay.shape[-1] not in (hkv, hkv * dk):
            raise ShapeError(f"{what}: decay of shape {decay.shape}, expected ({b}, {t}, {hkv} or {hkv * dk})")
        keep = w.op("Exp", [_heads_first(w, w.cast(decay, F32), hkv, "decay")])        # (B, Hkv, T, 1 or dk)
        keep = w.op("Unsqueeze", [keep], {"axes": [4]})                               # (B, Hkv, T, 1 or dk, 1)
    if delta:
        if len(beta.shape) != 3 or beta.shape[:2] != (b, t) or beta.shape[-1] not in (hkv, 1):
            raise ShapeError(f"{what}: beta of shape {beta.shape}, expected ({b}, {t}, {hkv} or 1)")
        rate = _heads_first(w, w.cast(beta, F32), int(beta.shape[-1]), "beta")         # (B, Hb, T, 1)
    state = w.cast(past, F32) if past is not None else w.const("zero_state", np.zeros(state_shape, F32))
    outs = []
    for i in range(t):
        step = w.const(f"t{i}", np.array(i, np.int64))
        k_t = w.op("Gather", [k4, step], {"axis": 2})                                   # (B, Hkv, dk)
        v_t = w.op("Gather", [v4, step], {"axis": 2})                                   # (B, Hkv, dv)
        if gating:
            state = w.op("Mul", [state, w.op("Gather", [keep, step], {"axis": 2})])
        if delta:
            got = w.op("MatMul", [w.op("Unsqueeze", [k_t], {"axes": [2]}), state])      # (B, Hkv, 1, dv)
            got = w.op("Squeeze", [got], {"axes": [2]})
            v_t = w.op("Mul", [w.op("Sub", [v_t, got]), w.op("Gather", [rate, step], {"axis": 2})])
        outer = w.op("Mul", [w.op("Unsqueeze", [k_t], {"axes": [3]}), w.op("Unsqueeze", [v_t], {"axes": [2]})])
        state = w.op("Add", [state, outer])
        read = state
        if group > 1:
            read = w.op("Expand", [w.op("Unsqueeze", [state], {"axes": [2]}),
                                   w.const("groups", np.array([b, hkv, group, dk, dv], np.int64))])
            read = w.op("Reshape", [read, w.const("query_heads", np.array([b, hq, dk, dv], np.int64))])
        q_t = w.op("Gather", [q4, w.const(f"t{i}_range", np.array([i], np.int64))], {"axis": 2})  # (B, Hq, 1, dk)
        outs.append(w.op("MatMul", [q_t, read]))                                        # (B, Hq, 1, dv)
    o = outs[0] if len(outs) == 1 else w.op("Concat", outs, {"axis": 2})
    scale = float(a.get("scale", 0.0)) or 1.0 / float(np.sqrt(dk))
    o = w.op("Mul", [o, w.const("scale", np.array(scale, F32))])
    o = w.op("Transpose", [o], {"perm": [0, 2, 1, 3]})
    o = w.op("Reshape", [o, w.const("packed", np.array([b, t, hq * dv], np.int64))], last=q.dtype == F32)
    results = [o if q.dtype == F32 else w.cast(o, q.dtype, last=True)]
    if len(node.outputs) > 1 and node.outputs[1]:
        dtype = past.dtype if past is not None else q.dtype
        results.append(state if dtype == F32 else
                       ctx.emit("Cast", [state], {"to": int(helper.np_dtype_to_tensor_dtype(dtype))},
                                name=ctx.fresh_node(f"{node.name}/state"), outputs=[node.outputs[1]])[0])
    return results + [None] * (len(node.outputs) - len(results))
