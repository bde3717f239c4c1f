"""The weights blob: every read-only array the kernels use, laid out once, 64-byte aligned.

Model constants, values folded at compile time, and arrays the generator derives (packed
GEMM panels, folded BatchNorm scale/shift, Resize tables) all live here. The host runtime
hands the blob to the compiled library as one pointer (it is too big for C source: 45 MB
for ResNet-18); ``c_array`` renders it as a ``static const`` array instead, for targets that
want weights in flash.
"""
from __future__ import annotations

import numpy as np

WEIGHTS_ALIGNMENT = 64
_WORDS_PER_LINE = 8


class WeightsBlob:
    def __init__(self):
        self._offsets: dict[tuple, int] = {}
        self._chunks: list[tuple[int, bytes]] = []
        self.size = 0

    def add(self, key: tuple, array: np.ndarray) -> int:
        """Byte offset of ``array`` (added once per ``key``; later calls return the first offset)."""
        if key in self._offsets:
            return self._offsets[key]
        data = np.ascontiguousarray(array).tobytes()
        offset = -(-self.size // WEIGHTS_ALIGNMENT) * WEIGHTS_ALIGNMENT
        self._offsets[key] = offset
        self._chunks.append((offset, data))
        self.size = offset + len(data)
        return offset

    def __len__(self) -> int:
        return len(self._chunks)

    def tobytes(self) -> bytes:
        buf = bytearray(-(-self.size // WEIGHTS_ALIGNMENT) * WEIGHTS_ALIGNMENT)
        for off, data in self._chunks:
            buf[off:off + len(data)] = data
        return bytes(buf)

    def c_words(self) -> tuple[int, str]:
        """The blob as 32-bit little-endian words: (count, C initializer lines)."""
        data = self.tobytes()
        data += b"\0" * (-len(data) % 4)
        words = np.frombuffer(data, dtype="<u4") if data else np.zeros(1, dtype="<u4")
        return len(words), _initializer_lines(words)

    def c_array(self, name: str) -> str:
        """The blob as a C definition of 32-bit little-endian words (for embedding)."""
        n, body = self.c_words()
        return (f"static const uint32_t {name}[{n}] __attribute__((aligned({WEIGHTS_ALIGNMENT}))) = {{\n"
                f"{body}\n}};\n")


# The products whose constant operands (weights, biases) ``flush_subnormal_weights`` stores flushed.
PRODUCT_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def flush_subnormals(array: np.ndarray) -> tuple[np.ndarray, int]:
    """``(array with its subnormal float32 values replaced by zeros of their sign, how many there were)``; the array
    itself where there are none (``CodegenOptions.flush_subnormal_weights``)."""
    if array.dtype != np.float32:
        return array, 0
    bits = np.ascontiguousarray(array).view(np.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    sub = (magnitude != 0) & (magnitude < np.uint32(0x00800000))
    count = int(np.count_nonzero(sub))
    if not count:
        return array, 0
    out = bits.copy()
    out[sub] &= np.uint32(0x80000000)
    return out.view(np.float32).reshape(array.shape), count


def _initializer_lines(words: np.ndarray) -> str:
    """``words`` as C initializer lines, ``_WORDS_PER_LINE`` a line: ``  0x0000002au, 0x...u,``.

    Built as one byte array (a model's blob is millions of words; formatting each in Python took
    most of a Cortex-M7 compile of MobileNetV1): every word is the fixed-width unit
    ``0x<8 hex digits>u, `` and a full line is two spaces, its units, and a newline in place of its
    last unit's space."""
    n = len(words)
    hexes = np.frombuffer(words.astype(">u4").tobytes().hex().encode("ascii"), dtype=np.uint8).reshape(n, 8)
    units = np.empty((n, 13), dtype=np.uint8)
    units[:, 0:2] = np.frombuffer(b"0x", dtype=np.uint8)
    units[:, 2:10] = hexes
    units[:, 10:13] = np.frombuffer(b"u, ", dtype=np.uint8)
    full, rest = divmod(n, _WORDS_PER_LINE)
    lines = np.empty((full, 2 + 13 * _WORDS_PER_LINE), dtype=np.uint8)
    lines[:, :2] = ord(" ")
    lines[:, 2:] = units[:full * _WORDS_PER_LINE].reshape(full, 13 * _WORDS_PER_LINE)
    lines[:, -1] = ord("\n")
    text = lines.tobytes().decode("ascii")
    if rest:
        text += "  " + units[full * _WORDS_PER_LINE:].tobytes().decode("ascii")[:-1]
    return text[:-1] if not rest else text

