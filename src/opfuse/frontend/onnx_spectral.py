"""``DFT``, ``STFT`` and ``MelWeightMatrix`` imported as ordinary ops (a MatMul by a constant).

A DFT of length ``L`` along one axis is linear in the input's real numbers (real and imaginary
parts interleaved in the last axis of size ``c`` = 1 or 2), whatever ``inverse`` and ``onesided``
say, so it is one matrix product:

    y[..., k, :] = sum_j x[..., j, :] . W[(j, :), (k, :)],   W of shape (n * c, m * c_out)

with ``W``'s rows the transform of each unit input (``W[r] = DFT(e_r)``, computed here in float64
with ``numpy.fft`` exactly as the ONNX definition states it: zero padding or truncation to
``dft_length``, ``onesided`` keeping bins ``0 .. L // 2``, ``inverse`` the scaled inverse, and the
inverse of a one-sided input the real ``irfft``). The node becomes Transpose (the axis next to
the complex axis), Reshape to ``(..., n * c)``, ``MatMul(W)``, Reshape to ``(..., m, c_out)`` and
Transpose back: a direct O(n^2) DFT that the gemm kernels run and the fusion rules see as a
MatMul. ``W`` larger than ``DFT_MATRIX_MAX_ELEMENTS`` is refused (a radix-2 kernel would be needed).

``STFT(signal, step, window, frame_length)`` is the frames (``Gather`` of a constant index
matrix ``(frames, L)`` along the signal axis) times the window (folded into ``W`` when it is a
constant, else a broadcast ``Mul``) then the DFT above along the frame axis.

``MelWeightMatrix`` depends only on scalars that decide its shape: it is folded to the constant
the ONNX definition gives (triangular filters between mel-spaced bin edges).
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from opfuse.errors import ModelError, ShapeError, UnsupportedOpError
from opfuse.frontend.onnx_canonical import canonicalizes
from opfuse.frontend.onnx_decompose import _Writer
from opfuse.ir.graph import Value

# The largest DFT matrix (elements) imported as a constant: 4M floats = 16 MB in float32, e.g.
# a 1448-point complex DFT. Longer transforms need an FFT kernel, which opfuse does not have.
DFT_MATRIX_MAX_ELEMENTS = 1 << 22


def _scalar(ctx, node, inputs, index: int, what: str) -> int | None:
    data = ctx.const_operand(node, inputs, index, what)
    if data is None:
        return None
    if data.size != 1:
        raise ModelError(f"{node.op_type} node '{node.name}': {what} must be a scalar, got shape {data.shape}")
    return int(data.reshape(-1)[0])


def dft_matrix(n: int, c: int, length: int, inverse: bool, onesided: bool) -> np.ndarray:
    """``W`` (float64, shape ``(n * c, m * c_out)``) with ``x.reshape(n * c) @ W`` the DFT of one
    signal ``x`` of shape ``(n, c)`` as the ONNX reference defines it."""
    basis = np.eye(n * c).reshape(n * c, n, c)
    z = basis[..., 0] + (1j * basis[..., 1] if c == 2 else 0)
    if inverse and onesided:
        y = np.fft.irfft(z, n=length, axis=1)[..., np.newaxis]
    else:
        f = np.fft.ifft(z, n=length, axis=1) if inverse else np.fft.fft(z, n=length, axis=1)
        if onesided:
            f = f[:, :length // 2 + 1]
        y = np.stack([f.real, f.imag], axis=-1)
    return y.reshape(n * c, -1)


def _check_size(node, rows: int, cols: int) -> None:
    if rows * cols > DFT_MATRIX_MAX_ELEMENTS:
        raise UnsupportedOpError(node.op_type, node.name, None,
                                 detail=f"a {rows} x {cols} DFT matrix is over the {DFT_MATRIX_MAX_ELEMENTS} "
                                        f"elements opfuse imports as a constant (no FFT kernel)")


def _apply(w: _Writer, x: Value, weights: np.ndarray, c_out: int, *, last: bool = True) -> Value:
    """``x`` of shape ``(..., n, c)`` times ``weights`` over its last two axes -> ``(..., m, c_out)``.

    The product is summed in ``x``'s type, as onnxruntime and the ONNX reference (numpy.fft in
    float32 for float32) do: a bin that is exactly zero comes out within ~1e-7 * sum|x| of it."""
    lead = [int(d) for d in x.shape[:-2]]
    n, c = int(x.shape[-2]), int(x.shape[-1])
    flat = w.op("Reshape", [x, w.const("rows", np.array(lead + [n * c], np.int64))])
    y = w.op("MatMul", [flat, w.const("dft", weights.astype(x.dtype))])
    m = weights.shape[1] // c_out
    return w.op("Reshape", [y, w.const("bins", np.array(lead + [m, c_out], np.int64))], last=last)


@canonicalizes("DFT")
def dft(ctx, node, inputs):
    x = inputs[0]
    rank = len(x.shape)
    if rank < 2 or x.shape[-1] not in (1, 2):
        raise ShapeError(f"node '{node.name}' (DFT): input must be (..., n, 1 or 2), got {x.shape}")
    if x.dtype.kind != "f":
        raise ModelError(f"node '{node.name}' (DFT): input type {x.dtype} (floating point expected)")
    length = _scalar(ctx, node, inputs, 1, "dft_length")
    if node.version >= 20:
        axis = _scalar(ctx, node, inputs, 2, "axis")
        axis = -2 if axis is None else axis
    else:
        axis = int(node.attrs.get("axis", 1))
    if not -rank <= axis < rank or axis % rank == rank - 1:
        raise ModelError(f"node '{node.name}' (DFT): axis {axis} for an input of rank {rank} "
                         f"(the last axis holds the real and imaginary parts)")
    axis %= rank
    inverse, onesided = bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))
    n, c = int(x.shape[axis]), int(x.shape[-1])
    if length is None:
        length = 2 * (n - 1) if inverse and onesided else n
    if length < 1:
        raise ModelError(f"node '{node.name}' (DFT): dft_length {length}")
    c_out = 1 if inverse and onesided else 2
    m = length // 2 + 1 if onesided else length
    _check_size(node, n * c, m * c_out)
    weights = dft_matrix(n, c, length, inverse, onesided)
    w = _Writer(ctx, node)
    if axis == rank - 2:
        return [_apply(w, x, weights, c_out)]
    perm = [i for i in range(rank - 1) if i != axis] + [axis, rank - 1]
    moved = w.op("Transpose", [x], {"perm": perm})
    y = _apply(w, moved, weights, c_out, last=False)
    back = [perm.index(i) for i in range(rank)]
    return [w.op("Transpose", [y], {"perm": back}, last=True)]


@canonicalizes("STFT")
def stft(ctx, node, inputs):
    x = inputs[0]
    if len(x.shape) != 3 or x.shape[-1] not in (1, 2):
        raise ShapeError(f"node '{node.name}' (STFT): signal must be (batch, length, 1 or 2), got {x.shape}")
    if x.dtype.kind != "f":
        raise ModelError(f"node '{node.name}' (STFT): signal type {x.dtype} (floating point expected)")
    step = _scalar(ctx, node, inputs, 1, "frame_step")
    window = inputs[2] if len(inputs) > 2 else None
    length = _scalar(ctx, node, inputs, 3, "frame_length")
    signal_length, c = int(x.shape[1]), int(x.shape[2])
    if window is not None:
        if len(window.shape) != 1 or (length is not None and window.shape[0] != length):
            raise ShapeError(f"node '{node.name}' (STFT): window of shape {window.shape} for frame_length {length}")
        length = int(window.shape[0])
    length = signal_length if length is None else length
    if step is None or step < 1 or not 1 <= length <= signal_length:
        raise ModelError(f"node '{node.name}' (STFT): frame_step {step} and frame_length {length} for a "
                         f"signal of length {signal_length}")
    onesided = bool(node.attrs.get("onesided", 1))
    frames = (signal_length - length) // step + 1
    m = length // 2 + 1 if onesided else length
    _check_size(node, length * c, m * 2)
    weights = dft_matrix(length, c, length, False, onesided)
    w = _Writer(ctx, node)
    index = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(length, dtype=np.int64)[None, :]
    framed = w.op("Gather", [x, w.const("frames", index)], {"axis": 1})  # (batch, frames, length, c)
    if window is not None and window.const is not None:
        weights = np.repeat(window.const.astype(np.float64), c)[:, None] * weights
    elif window is not None:
        win = w.op("Reshape", [window, w.const("window_shape", np.array([length, 1], np.int64))])
        framed = w.op("Mul", [framed, w.cast(win, x.dtype)])
    return [_apply(w, framed, weights, 2)]


def mel_weight_matrix(num_mel_bins: int, dft_length: int, sample_rate: int, lower_hz: float, upper_hz: float
                      ) -> np.ndarray:
    """The ONNX definition's triangular mel filters, ``(dft_length // 2 + 1, num_mel_bins)`` in float64."""
    edges = np.arange(num_mel_bins + 2)
    low_mel = 2595 * np.log1p(lower_hz / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper_hz / 700) / np.log(10)
    mel = edges * ((high_mel - low_mel) / edges.shape[0]) + low_mel
    hz = 700 * np.expm1(mel / 2595 * np.log(10))
    bins = (((dft_length + 1) * hz) // sample_rate).astype(int)
    out = np.zeros((dft_length // 2 + 1, num_mel_bins))
    for i in range(num_mel_bins):
        left, center, right = bins[i], bins[i + 1], bins[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            for j in range(left, center + 1):
                out[j, i] = (j - left) / (center - left)
        for j in range(center, right):
            out[j, i] = (right - j) / (right - center)
    return out


@canonicalizes("MelWeightMatrix")
def mel_weights(ctx, node, inputs):
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    vals = []
    for i, what in enumerate(names):
        data = ctx.const_operand(node, inputs, i, what)
        if data is None or data.size != 1:
            raise ModelError(f"node '{node.name}' (MelWeightMatrix): {what} must be a scalar")
        vals.append(data.reshape(-1)[0])
    n_mel, length, rate = (int(v) for v in vals[:3])
    lo, hi = float(vals[3]), float(vals[4])
    if n_mel < 1 or length < 1 or rate < 1 or not 0 <= lo < hi <= rate / 2:
        raise ModelError(f"node '{node.name}' (MelWeightMatrix): num_mel_bins {n_mel}, dft_length {length}, "
                         f"sample_rate {rate}, edges {lo}..{hi} Hz")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(node.attrs["output_datatype"])) \
        if "output_datatype" in node.attrs else np.dtype(np.float32)
    return [ctx.const(node.outputs[0], mel_weight_matrix(n_mel, length, rate, lo, hi).astype(dtype))]
