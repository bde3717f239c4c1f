"""Quantization parameters: the affine map ``real = scale * (q - zero_point)`` of each tensor.

* Activations, per tensor, asymmetric: over the calibrated range ``[lo, hi]`` (0 included),
  ``scale = (hi - lo) / (qmax - qmin)``, ``zero_point = round(qmin - lo / scale)`` clamped to the
  type's range. int8 is the default: onnxruntime's ``quantize_static`` writes QDQ with int8
  activations and int8 weights (S8S8) unless told otherwise; uint8 (U8S8) is the other choice.
* Weights, per output channel, symmetric int8 over ``[-127, 127]`` (``zero_point = 0``):
  ``scale_c = max|W_c| / 127`` (the narrowed range keeps ``-W`` representable, as onnxruntime).
* Bias, per output channel, int32 with ``scale_c = x_scale * w_scale_c`` and ``zero_point = 0``,
  so the int32 accumulator ``sum (x_q - x_zp) * w_q`` and the bias add without rescaling.

A zero range (a constant-zero tensor or channel) gets scale 1. Rounding is half to even, as
``QuantizeLinear``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ACTIVATION_TYPES = {"int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8)}
DEFAULT_ACTIVATION_TYPE = "int8"  # onnxruntime's quantize_static default for QDQ on CPU (S8S8)
WEIGHT_QMAX = 127  # symmetric int8 weights use [-127, 127]
INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class ActivationParams:
    """One activation tensor's per-tensor parameters."""

    scale: np.float32
    zero_point: int
    dtype: np.dtype

    def fake_quantize(self, x: np.ndarray) -> np.ndarray:
        """``x`` quantized and dequantized (float32), as QuantizeLinear then DequantizeLinear."""
        info = np.iinfo(self.dtype)
        q = np.clip(np.round(np.asarray(x, np.float32) / self.scale) + self.zero_point, info.min, info.max)
        return ((q - self.zero_point) * self.scale).astype(np.float32)


def activation_params(lo: float, hi: float, dtype: np.dtype) -> ActivationParams:
    info = np.iinfo(dtype)
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = np.float32((hi - lo) / (int(info.max) - int(info.min)))
    if not np.isfinite(scale) or scale <= np.finfo(np.float32).tiny:
        return ActivationParams(np.float32(1.0), 0, np.dtype(dtype))
    zp = int(np.clip(np.round(info.min - np.float32(lo) / scale), info.min, info.max))
    return ActivationParams(scale, zp, np.dtype(dtype))


def weight_scales(w: np.ndarray, axis: int) -> np.ndarray:
    """Per-channel symmetric scales (float32) of ``w`` along ``axis``."""
    other = tuple(i for i in range(w.ndim) if i != axis)
    absmax = np.max(np.abs(w.astype(np.float64)), axis=other) if other else np.abs(w.astype(np.float64))
    scale = (absmax / WEIGHT_QMAX).astype(np.float32)
    return np.where(scale > np.finfo(np.float32).tiny, scale, np.float32(1.0)).astype(np.float32)


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def quantize_weight(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``(w_q int8, scales float32)``, ``w ~ w_q * scale`` per channel along ``axis``."""
    scales = weight_scales(w, axis)
    q = np.round(w.astype(np.float32) / _along(scales, axis, w.ndim))
    return np.clip(q, -WEIGHT_QMAX, WEIGHT_QMAX).astype(np.int8), scales


def quantize_bias(b: np.ndarray, x_scale: np.float32, w_scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(b_q int32, scales float32)`` with ``scale_c = x_scale * w_scale_c`` (saturated to int32)."""
    scales = (np.float32(x_scale) * w_scales.astype(np.float32)).astype(np.float32)
    scales = np.where(scales > np.finfo(np.float32).tiny, scales, np.float32(1.0)).astype(np.float32)
    q = np.round(b.astype(np.float64) / scales.astype(np.float64))
    return np.clip(q, INT32.min, INT32.max).astype(np.int32), scales


def sqnr_db(reference: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB (``inf`` when equal; ``0`` signal gives ``-inf``)."""
    ref = np.asarray(reference, np.float64)
    noise = float(np.sum((ref - np.asarray(approx, np.float64)) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))
