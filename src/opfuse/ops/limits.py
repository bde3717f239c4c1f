"""The size limit on one tensor, checked before anything is allocated, folded or planned.

A model of a few bytes can describe an enormous tensor (``ConstantOfShape`` of ``[65536, 65536]``
is 16 GiB; a Conv with ``pads=[2**31, 0, 0, 0]`` pads its input to 64 GiB). Every tensor shape
inference produces (``registry.infer_node``), every graph input, every padded window buffer of
the reference, and every random input is checked against one limit, in bytes:

    max_tensor_bytes() = $OPFUSE_MAX_TENSOR_BYTES  (e.g. "16G", "512M", "1073741824"), default 8 GiB

so the error names the tensor and its size instead of a ``MemoryError`` (or the OOM killer)
later. The limit is read on every check: set the variable before compiling or running.
"""
from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from opfuse.errors import SizeLimitError

MAX_TENSOR_BYTES_ENV = "OPFUSE_MAX_TENSOR_BYTES"
DEFAULT_MAX_TENSOR_BYTES = 8 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """``'524288'``, ``'512K'``, ``'512KiB'``, ``'1.5G'`` in bytes (K/M/G/T are powers of 1024)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    try:
        value = float(t[:len(t) - len(unit)])
    except ValueError:
        raise ValueError(f"not a size in bytes: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a size in bytes: {text!r}")
    return int(value * _UNITS[unit])


def max_tensor_bytes() -> int:
    """The limit on one tensor, in bytes: ``$OPFUSE_MAX_TENSOR_BYTES`` or ``DEFAULT_MAX_TENSOR_BYTES``."""
    text = os.environ.get(MAX_TENSOR_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_TENSOR_BYTES
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise SizeLimitError(f"${MAX_TENSOR_BYTES_ENV}: {e}") from None


def format_bytes(n: int) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = _UNITS[unit[0]]
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def tensor_bytes(shape: Sequence[int], dtype) -> int:
    """Bytes of a dense tensor (Python integers: no overflow however large the shape)."""
    return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


def check_tensor_size(shape: Sequence[int], dtype, what: str) -> None:
    """``SizeLimitError`` naming ``what``, its shape and size when it is over ``max_tensor_bytes()``."""
    if any(int(d) < 0 for d in shape):
        return  # a negative dimension is the shape checks' to report
    nbytes = tensor_bytes(shape, dtype)
    limit = max_tensor_bytes()
    if nbytes > limit:
        raise SizeLimitError(f"{what} of shape {tuple(int(d) for d in shape)} {np.dtype(dtype).name} would take "
                             f"{format_bytes(nbytes)} ({nbytes:,} bytes), over the limit of {format_bytes(limit)} "
                             f"per tensor (raise it with ${MAX_TENSOR_BYTES_ENV})")
