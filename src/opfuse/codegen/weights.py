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
        lines = []
        for i in range(0, len(words), _WORDS_PER_LINE):
            lines.append("  " + ", ".join(f"0x{w:08x}u" for w in words[i:i + _WORDS_PER_LINE]) + ",")
        return len(words), "\n".join(lines)

    def c_array(self, name: str) -> str:
        """The blob as a C definition of 32-bit little-endian words (for embedding)."""
        n, body = self.c_words()
        return (f"static const uint32_t {name}[{n}] __attribute__((aligned({WEIGHTS_ALIGNMENT}))) = {{\n"
                f"{body}\n}};\n")
