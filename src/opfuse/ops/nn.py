"""Sliding-window ops: Conv, ConvTranspose, MaxPool, AveragePool, GlobalAveragePool.

All take ``X`` of shape ``(N, C, D1, ..., Dk)`` (any ``k >= 1``). For spatial axis ``i``
with input length ``L``, kernel ``K``, stride ``s``, dilation ``d`` and pads ``(b, e)``:

    effective kernel   E   = (K - 1) * d + 1
    output length      out = floor((L + b + e - E) / s) + 1      (ceil for pools' ceil_mode)
    output o reads input positions  o * s - b + k * d,  k = 0 .. K-1

``auto_pad`` SAME_UPPER/SAME_LOWER choose ``out = ceil(L / s)`` and split the needed total
padding ``max(0, (out - 1) * s + E - L)`` with the odd element at the end (UPPER) or the
beginning (LOWER); VALID means no padding.

The NumPy references loop over the ``prod(K)`` kernel offsets and, for each one, take one
strided view of the padded input (all output positions at once): Conv turns that into one
batched matmul per offset (an im2col that never materialises the whole column matrix),
pools into one ``maximum``/``add``. Float inputs accumulate in float64 so the reference is a
trustworthy oracle for float32 kernels.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from opfuse.ir.dtypes import is_floating
from opfuse.errors import UnsupportedOpError
from opfuse.ir.graph import Node
from opfuse.ops.common import int_attrs, out_type, shape_error
from opfuse.ops.limits import check_tensor_size
from opfuse.ops.registry import Category, Mapping, OpSpec, register

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

_CONV_ATTRS = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
               "pads": None, "strides": None}
_POOL_ATTRS = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None, "kernel_shape": None,
               "pads": None, "strides": None}


@dataclass(frozen=True)
class Window:
    """Geometry of a sliding window over the spatial axes (all tuples have one entry per axis)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]

    @property
    def effective_kernel(self) -> tuple[int, ...]:
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations, strict=True))

    def padded_extent(self) -> tuple[int, ...]:
        """Padded input length each axis needs so every window lies inside it."""
        return tuple((o - 1) * s + e for o, s, e in zip(self.out, self.strides, self.effective_kernel, strict=True))

    def padded_input(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        """Spatial shape of the padded input the references build (``_pad_input``)."""
        return tuple(max(length + b + e, extent) for length, b, e, extent
                     in zip(spatial, self.pads_begin, self.pads_end, self.padded_extent(), strict=True))

    def offsets(self):
        """Every kernel offset, as (index tuple, tuple of strided slices into the padded input)."""
        for kk in itertools.product(*(range(k) for k in self.kernel)):
            yield kk, tuple(slice(k * d, k * d + (o - 1) * s + 1, s)
                            for k, d, o, s in zip(kk, self.dilations, self.out, self.strides, strict=True))


def _auto_pad(node: Node, a: dict) -> str:
    mode = a["auto_pad"]
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in AUTO_PADS:
        raise UnsupportedOpError(node.op_type, node.name, detail=f"auto_pad={mode!r}")
    return mode


def conv_geometry(node: Node):
    """A Conv node's window geometry (``window_geometry`` over its weights' spatial shape) and its
    group count."""
    from opfuse.ops.registry import get_spec
    a = get_spec(node.op_type, node).attrs_of(node)
    x, wt = node.input(0), node.input(1)
    return window_geometry(node, a, tuple(x.shape[2:]), tuple(wt.shape[2:])), int(a["group"])


def window_geometry(node: Node, a: dict, spatial: tuple[int, ...], kernel: tuple[int, ...],
                    *, ceil_mode: bool = False) -> Window:
    """Output size and pads of a Conv/pool window over ``spatial`` (see the module docstring)."""
    n = len(spatial)
    strides = int_attrs(node, a, "strides", n, 1)
    dilations = int_attrs(node, a, "dilations", n, 1)
    if min(strides + dilations + kernel, default=1) < 1:
        raise shape_error(node, f"kernel {list(kernel)}, strides {list(strides)} and dilations "
                                f"{list(dilations)} must be positive")
    eff = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True))
    mode = _auto_pad(node, a)
    if mode == "NOTSET":
        pads = int_attrs(node, a, "pads", 2 * n, 0)
        begin, end = pads[:n], pads[n:]
        out = []
        for i in range(n):
            span = spatial[i] + begin[i] + end[i] - eff[i]
            o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
            # In ceil mode the last window must start inside the input or the left padding.
            if ceil_mode and (o - 1) * strides[i] >= spatial[i] + begin[i]:
                o -= 1
            out.append(o)
    elif mode == "VALID":
        begin = end = (0,) * n
        out = [(spatial[i] - eff[i]) // strides[i] + 1 for i in range(n)]
    else:
        out = [-(-spatial[i] // strides[i]) for i in range(n)]
        total = [max(0, (out[i] - 1) * strides[i] + eff[i] - spatial[i]) for i in range(n)]
        small = tuple(t // 2 for t in total)
        large = tuple(t - t // 2 for t in total)
        begin, end = (small, large) if mode == "SAME_UPPER" else (large, small)
    if min(begin + end, default=0) < 0:
        raise shape_error(node, f"negative pads {list(begin + end)}")
    if min(out) < 1:
        raise shape_error(node, f"window (effective kernel {list(eff)}) does not fit the padded "
                                f"input {list(spatial)}: output would be {out}")
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out))


def _pad_input(x: np.ndarray, w: Window, value) -> np.ndarray:
    """Pad the spatial axes by the window's pads, plus any tail that ceil_mode windows reach."""
    widths = [(0, 0), (0, 0)]
    for length, extent, b, e in zip(x.shape[2:], w.padded_extent(), w.pads_begin, w.pads_end, strict=True):
        widths.append((b, max(e, extent - (length + b))))
    if all(p == (0, 0) for p in widths):
        return x
    return np.pad(x, widths, mode="constant", constant_values=value)


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulate floats in float64 (a trustworthy oracle); other dtypes in their own type."""
    return np.dtype(np.float64) if is_floating(dtype) else np.dtype(dtype)


def _spatial_input(node: Node, what: str = "X") -> tuple[int, ...]:
    shape = node.input(0).shape
    if len(shape) < 3:
        raise shape_error(node, f"{what} must be (N, C, D1, ...) with at least one spatial axis, "
                                f"got shape {shape}")
    return shape


def _check_kernel_attr(node: Node, a: dict, kernel: tuple[int, ...]) -> None:
    if a.get("kernel_shape") is not None and tuple(int(k) for k in a["kernel_shape"]) != kernel:
        raise shape_error(node, f"kernel_shape {list(a['kernel_shape'])} does not match the weight's "
                                f"spatial shape {list(kernel)}")


def _check_bias(node: Node, channels: int) -> None:
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if b is not None and b.shape != (channels,):
        raise shape_error(node, f"bias shape {b.shape} != ({channels},)")


# Conv -----------------------------------------------------------------------------------
def _conv_geometry(node: Node, a: dict) -> tuple[Window, int, int]:
    """Window, group count and output channels of a Conv; checks every shape."""
    x = _spatial_input(node)
    wshape = node.input(1).shape
    group = int(a["group"])
    if len(wshape) != len(x):
        raise shape_error(node, f"weight shape {wshape} must have the rank of X {x}")
    m, cg = wshape[0], wshape[1]
    if group < 1 or x[1] % group or m % group:
        raise shape_error(node, f"group={group} must divide input channels {x[1]} and output "
                                f"channels {m}")
    if cg * group != x[1]:
        raise shape_error(node, f"channel mismatch: X has {x[1]} channels, weight expects "
                                f"{cg} x group {group} = {cg * group}")
    kernel = tuple(wshape[2:])
    _check_kernel_attr(node, a, kernel)
    _check_bias(node, m)
    return window_geometry(node, a, tuple(x[2:]), kernel), group, m


def _check_padded_input(node: Node, w: Window) -> None:
    """The reference pads the whole input (in float64 for floats): refuse one over the size limit."""
    x = node.input(0)
    check_tensor_size(x.shape[:2] + w.padded_input(tuple(x.shape[2:])), _acc_dtype(x.dtype),
                      f"node '{node.name}' ({node.op_type}): the padded input")


def _conv_infer(node: Node, a: dict):
    w, _, m = _conv_geometry(node, a)
    x = node.input(0)
    _check_padded_input(node, w)
    return out_type((x.shape[0], m) + w.out, x.dtype)


def _conv(ins, a, node):
    """y[n, g*Mg+m, o] = b[g*Mg+m] + sum_{c, k} x_pad[n, g*Cg+c, o*s + k*d] * W[g*Mg+m, c, k]."""
    x, wt = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    w, group, m = _conv_geometry(node, a)
    acc = _acc_dtype(x.dtype)
    n, c = x.shape[:2]
    cg, mg = c // group, m // group
    positions = math.prod(w.out)
    xp = _pad_input(x.astype(acc, copy=False), w, 0)
    wt = wt.astype(acc, copy=False)
    y = np.zeros((n, group, mg, positions), dtype=acc)
    for kk, sl in w.offsets():
        cols = xp[(slice(None), slice(None)) + sl].reshape(n, group, cg, positions)
        wk = wt[(slice(None), slice(None)) + kk].reshape(group, mg, cg)
        if cg == 1:  # depthwise: an outer product per group, cheaper as a broadcast multiply
            y += wk[None] * cols
        else:
            y += np.matmul(wk, cols)
    if bias is not None:
        y += bias.astype(acc).reshape(1, group, mg, 1)
    return [y.reshape((n, m) + w.out).astype(x.dtype, copy=False)]


def _conv_flops(node: Node, a: dict) -> int:
    w, group, m = _conv_geometry(node, a)
    n, c = node.input(0).shape[:2]
    macs = n * m * math.prod(w.out) * (c // group) * math.prod(w.kernel)
    has_bias = len(node.inputs) > 2 and node.inputs[2] is not None
    return 2 * macs + (n * m * math.prod(w.out) if has_bias else 0)


register(OpSpec("Conv", Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY, _conv_infer, _conv,
                num_inputs=(2, 3), attrs=dict(_CONV_ATTRS), flops_fn=_conv_flops,
                tags=frozenset({"conv"})))


# ConvTranspose --------------------------------------------------------------------------
@dataclass(frozen=True)
class TransposedGeometry:
    """ConvTranspose geometry: full (uncropped) output index f = i*s + k*d; y[o] = full[o + begin]."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    out: tuple[int, ...]
    group: int
    channels_out: int


def convT_geometry(node: Node, a: dict) -> TransposedGeometry:
    """Output shape of ConvTranspose, per spatial axis (ONNX opset 11+):

        out = s * (L - 1) + output_padding + E - begin - end          (explicit pads)

    With ``output_shape`` (or SAME_* auto_pad, where ``out = L * s``) the total padding
    ``s * (L - 1) + output_padding + E - out`` is split, the odd element at the end for
    SAME_UPPER and at the beginning otherwise.
    """
    x = _spatial_input(node)
    wshape = node.input(1).shape
    n = len(x) - 2
    group = int(a["group"])
    if len(wshape) != len(x):
        raise shape_error(node, f"weight shape {wshape} must have the rank of X {x}")
    if group < 1 or x[1] % group:
        raise shape_error(node, f"group={group} must divide input channels {x[1]}")
    if wshape[0] != x[1]:
        raise shape_error(node, f"channel mismatch: X has {x[1]} channels, weight (C, M/group, ...) "
                                f"has {wshape[0]}")
    kernel = tuple(wshape[2:])
    _check_kernel_attr(node, a, kernel)
    m = wshape[1] * group
    _check_bias(node, m)
    strides = int_attrs(node, a, "strides", n, 1)
    dilations = int_attrs(node, a, "dilations", n, 1)
    out_pad = int_attrs(node, a, "output_padding", n, 0)
    eff = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True))
    full = tuple(s * (length - 1) + op + e for s, length, op, e in zip(strides, x[2:], out_pad, eff, strict=True))
    mode = _auto_pad(node, a)
    if a.get("output_shape") is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
        if a.get("output_shape") is not None:
            out = tuple(int(v) for v in a["output_shape"])
            if len(out) == n + 2:  # some exporters give the whole shape
                out = out[2:]
            if len(out) != n:
                raise shape_error(node, f"output_shape {list(out)} needs {n} spatial entries")
        else:
            out = tuple(length * s for length, s in zip(x[2:], strides, strict=True))
        total = [f - o for f, o in zip(full, out, strict=True)]
        begin = tuple(t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in total)
    elif mode == "VALID":
        begin, out = (0,) * n, full
    else:
        pads = int_attrs(node, a, "pads", 2 * n, 0)
        begin = pads[:n]
        out = tuple(f - b - e for f, b, e in zip(full, pads[:n], pads[n:], strict=True))
    if min(out) < 1:
        raise shape_error(node, f"output spatial shape {list(out)} is empty")
    return TransposedGeometry(kernel, strides, dilations, tuple(begin), tuple(out), group, m)


def _convT_buffer(x_spatial: tuple[int, ...], g: TransposedGeometry) -> tuple[list[int], list[int]]:
    """Full-output index range [lo, hi) per axis that the reference accumulates into: it covers
    both the scattered range [0, L) and the requested window [begin, begin + out)."""
    lo = [min(0, b) for b in g.pads_begin]
    hi = [max((length - 1) * s + (k - 1) * d + 1, b + o)
          for length, s, k, d, b, o in zip(x_spatial, g.strides, g.kernel, g.dilations, g.pads_begin, g.out,
                                           strict=True)]
    return lo, hi


def _convT_infer(node: Node, a: dict):
    g = convT_geometry(node, a)
    x = node.input(0)
    lo, hi = _convT_buffer(tuple(x.shape[2:]), g)
    check_tensor_size((x.shape[0], g.channels_out) + tuple(h - low for h, low in zip(hi, lo, strict=True)),
                      _acc_dtype(x.dtype), f"node '{node.name}' ({node.op_type}): the full (uncropped) output")
    return out_type((x.shape[0], g.channels_out) + g.out, x.dtype)


def _conv_transpose(ins, a, node):
    """full[n, g*Mg+m, i*s + k*d] += x[n, g*Cg+c, i] * W[g*Cg+c, m, k]; y = crop(full) + b."""
    x, wt = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    g = convT_geometry(node, a)
    acc = _acc_dtype(x.dtype)
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    cg, mg = c // g.group, g.channels_out // g.group
    positions = math.prod(spatial)
    lo, hi = _convT_buffer(tuple(spatial), g)  # output_shape may exceed L
    buf = np.zeros((n, g.channels_out) + tuple(h - low for h, low in zip(hi, lo, strict=True)), dtype=acc)
    xg = x.astype(acc, copy=False).reshape(n, g.group, cg, positions)
    wt = wt.astype(acc, copy=False).reshape((g.group, cg, mg) + g.kernel)
    for kk in itertools.product(*(range(k) for k in g.kernel)):
        wk = np.swapaxes(wt[(slice(None),) * 3 + kk], 1, 2)  # (group, Mg, Cg)
        contrib = np.matmul(wk, xg).reshape((n, g.channels_out) + tuple(spatial))
        sl = tuple(slice(k * d - low, k * d - low + (length - 1) * s + 1, s)
                   for k, d, low, length, s in zip(kk, g.dilations, lo, spatial, g.strides, strict=True))
        buf[(slice(None), slice(None)) + sl] += contrib
    crop = tuple(slice(b - low, b - low + o) for b, low, o in zip(g.pads_begin, lo, g.out, strict=True))
    y = buf[(slice(None), slice(None)) + crop]
    if bias is not None:
        y = y + bias.astype(acc).reshape((1, -1) + (1,) * len(spatial))
    return [np.ascontiguousarray(y).astype(x.dtype, copy=False)]


def _convT_flops(node: Node, a: dict) -> int:
    g = convT_geometry(node, a)
    n, c = node.input(0).shape[:2]
    macs = n * c * math.prod(node.input(0).shape[2:]) * (g.channels_out // g.group) * math.prod(g.kernel)
    has_bias = len(node.inputs) > 2 and node.inputs[2] is not None
    return 2 * macs + (n * g.channels_out * math.prod(g.out) if has_bias else 0)


register(OpSpec("ConvTranspose", Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY, _convT_infer,
                _conv_transpose, num_inputs=(2, 3),
                attrs=dict(_CONV_ATTRS, output_padding=None, output_shape=None),
                flops_fn=_convT_flops, tags=frozenset({"conv"})))


# Pools ----------------------------------------------------------------------------------
def _pool_geometry(node: Node, a: dict) -> Window:
    x = _spatial_input(node)
    if a.get("kernel_shape") is None:
        raise shape_error(node, "kernel_shape is required")
    kernel = tuple(int(k) for k in a["kernel_shape"])
    if len(kernel) != len(x) - 2:
        raise shape_error(node, f"kernel_shape {list(kernel)} needs {len(x) - 2} entries for X {x}")
    if _auto_pad(node, a) == "NOTSET" and a.get("pads") is not None:
        pads = int_attrs(node, a, "pads", len(kernel) * 2, 0)
        if any(p >= k for p, k in zip(pads, kernel * 2, strict=True)):
            # a window entirely in the padding: -inf for MaxPool, 0/0 for AveragePool
            raise shape_error(node, f"pads {list(pads)} must be smaller than kernel_shape {list(kernel)} "
                                    f"(as onnxruntime requires)")
    return window_geometry(node, a, tuple(x[2:]), kernel, ceil_mode=bool(a["ceil_mode"]))


def _pool_infer(node: Node, a: dict):
    if node.op_type == "MaxPool" and int(a["storage_order"]) not in (0, 1):
        raise UnsupportedOpError("MaxPool", node.name, detail=f"storage_order={a['storage_order']!r} (0 or 1)")
    w = _pool_geometry(node, a)
    x = node.input(0)
    _check_padded_input(node, w)
    y = out_type(x.shape[:2] + w.out, x.dtype)
    if len(node.outputs) > 1:
        y += out_type(x.shape[:2] + w.out, np.int64)
    return y


def _lowest(dtype: np.dtype):
    return -np.inf if is_floating(dtype) else np.iinfo(dtype).min


def _max_pool(ins, a, node):
    """y[n, c, o] = max_k x_pad[n, c, o*s + k*d], padding never wins (it is -inf)."""
    x = ins[0]
    w = _pool_geometry(node, a)
    xp = _pad_input(x, w, _lowest(x.dtype))
    y = None
    for _, sl in w.offsets():
        view = xp[(slice(None), slice(None)) + sl]
        y = view.copy() if y is None else np.maximum(y, view, out=y)
    if len(node.outputs) > 1:
        return [y, _max_pool_indices(x, w, int(a["storage_order"]))]
    return [y]


def max_pool_index_strides(spatial: tuple[int, ...], storage_order: int) -> tuple[int, ...]:
    """Strides of MaxPool's Indices over the spatial axes: row major (``storage_order=0``) or
    column major (1); each (image, channel) plane adds its number of elements."""
    n = len(spatial)
    if storage_order == 0:
        return tuple(math.prod(spatial[d + 1:]) for d in range(n))
    return tuple(math.prod(spatial[:d]) for d in range(n))


def _max_pool_indices(x: np.ndarray, w: Window, storage_order: int) -> np.ndarray:
    """Where each window's maximum is (the first such in the window's row-major order; padding
    never), as a flat index into ``x`` with the spatial axes in ``storage_order``."""
    spatial = x.shape[2:]
    xp = _pad_input(x, w, _lowest(x.dtype))
    strides = max_pool_index_strides(spatial, storage_order)
    best = None
    where = np.zeros(x.shape[:2] + w.out, dtype=np.int64)
    for kk, sl in w.offsets():
        view = xp[(slice(None), slice(None)) + sl]
        pos = np.zeros(w.out, dtype=np.int64)
        for d, (k, o) in enumerate(zip(kk, w.out, strict=True)):
            along = np.arange(o) * w.strides[d] - w.pads_begin[d] + k * w.dilations[d]
            pos = pos + (along * strides[d]).reshape([o if j == d else 1 for j in range(len(w.out))])
        if best is None:
            best = view.copy()
            where[...] = pos
        else:
            better = view > best
            best = np.where(better, view, best)
            where = np.where(better, pos, where)
    plane = math.prod(spatial)
    base = (np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * plane).reshape(x.shape[:2] + (1,) * len(spatial))
    return where + base


def _avg_pool(ins, a, node):
    """y[n, c, o] = sum_k x_pad[n, c, o*s + k*d] / count[o].

    ``count`` is the number of window positions inside the input (``count_include_pad=0``)
    or inside the explicitly padded input (``count_include_pad=1``); positions that only
    ceil_mode's overhang reaches are never counted.
    """
    x = ins[0]
    w = _pool_geometry(node, a)
    acc = _acc_dtype(x.dtype)
    xp = _pad_input(x.astype(acc, copy=False), w, 0)
    inside = np.ones((1, 1) + x.shape[2:], dtype=acc)
    if int(a["count_include_pad"]):
        inside = np.pad(inside, [(0, 0), (0, 0)] + list(zip(w.pads_begin, w.pads_end, strict=True)), constant_values=1)
        mask_w = Window(w.kernel, w.strides, w.dilations, (0,) * len(w.out), (0,) * len(w.out), w.out)
        mask = _pad_input(inside, mask_w, 0)
    else:
        mask = _pad_input(inside, w, 0)
    total = np.zeros(x.shape[:2] + w.out, dtype=acc)
    count = np.zeros((1, 1) + w.out, dtype=acc)
    for _, sl in w.offsets():
        index = (slice(None), slice(None)) + sl
        total += xp[index]
        count += mask[index]
    return [(total / count).astype(x.dtype, copy=False)]


def _pool_flops(node: Node, a: dict) -> int:
    w = _pool_geometry(node, a)
    return node.outputs[0].size * math.prod(w.kernel)


register(OpSpec("MaxPool", Category.REDUCTION, Mapping.MANY_TO_MANY, _pool_infer, _max_pool,
                num_outputs=(1, 2), attrs=dict(_POOL_ATTRS, storage_order=0), flops_fn=_pool_flops,
                tags=frozenset({"pool"})))
register(OpSpec("AveragePool", Category.REDUCTION, Mapping.MANY_TO_MANY, _pool_infer, _avg_pool,
                attrs=dict(_POOL_ATTRS, count_include_pad=0), flops_fn=_pool_flops,
                tags=frozenset({"pool"})))


def _gap_infer(node: Node, a: dict):
    x = node.input(0)
    if len(x.shape) < 3:
        raise shape_error(node, f"X must be (N, C, D1, ...), got shape {x.shape}")
    return out_type(x.shape[:2] + (1,) * (len(x.shape) - 2), x.dtype)


def _gap(ins, a, node):
    """y[n, c, 1, ..., 1] = mean over the spatial axes of x[n, c]."""
    x = ins[0]
    axes = tuple(range(2, x.ndim))
    return [x.astype(_acc_dtype(x.dtype), copy=False).mean(axis=axes, keepdims=True).astype(x.dtype)]


register(OpSpec("GlobalAveragePool", Category.REDUCTION, Mapping.MANY_TO_MANY, _gap_infer, _gap,
                flops_fn=lambda node, a: node.input(0).size, tags=frozenset({"pool"})))


def _gmp(ins, a, node):
    """y[n, c, 1, ..., 1] = max over the spatial axes of x[n, c] (NaN if any is NaN)."""
    x = ins[0]
    return [np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)]


register(OpSpec("GlobalMaxPool", Category.REDUCTION, Mapping.MANY_TO_MANY, _gap_infer, _gmp,
                flops_fn=lambda node, a: node.input(0).size, tags=frozenset({"pool"})))
