"""The weight blob as C initializer text (``WeightsBlob.c_words``): every word, in order, 8 a line."""
import re

import numpy as np
import pytest

from opfuse.codegen.weights import WeightsBlob


def _parse(body: str) -> list[int]:
    return [int(h, 16) for h in re.findall(r"0x([0-9a-f]{8})u", body)]


@pytest.mark.parametrize("n_bytes", [0, 1, 4, 31, 32, 33, 64, 100, 4096 + 12])
def test_words_round_trip_and_line_layout(n_bytes):
    data = bytes((i * 37 + 11) % 256 for i in range(n_bytes))
    blob = WeightsBlob()
    if n_bytes:
        blob.add(("w",), np.frombuffer(data, dtype=np.uint8))
    n, body = blob.c_words()
    words = _parse(body)
    assert n == len(words)
    raw = blob.tobytes()
    raw += b"\0" * (-len(raw) % 4)
    want = list(np.frombuffer(raw, dtype="<u4")) if raw else [0]
    assert words == want
    lines = body.split("\n")
    assert all(line.startswith("  0x") and line.endswith("u,") for line in lines)
    assert [line.count("0x") for line in lines[:-1]] == [8] * (len(lines) - 1)
    assert 1 <= lines[-1].count("0x") <= 8
    assert ", ".join(f"0x{w:08x}u" for w in want[:8]) + "," == lines[0][2:]


def test_extreme_words_print_as_eight_lowercase_hex_digits():
    blob = WeightsBlob()
    blob.add(("w",), np.array([0, 0xFFFFFFFF, 0x2A, 0x80000000], dtype="<u4"))
    _, body = blob.c_words()
    assert body.startswith("  0x00000000u, 0xffffffffu, 0x0000002au, 0x80000000u,")
