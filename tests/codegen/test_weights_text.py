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


def test_arrays_are_placed_64_byte_aligned_once_per_key():
    blob = WeightsBlob()
    a, b, c = np.arange(3, dtype=np.uint8), np.arange(70, dtype=np.uint8), np.array([7], dtype=np.uint8)
    assert blob.add(("a",), a) == 0
    assert blob.add(("b",), b) == 64  # after 3 bytes: the next multiple of 64
    assert blob.add(("a",), c) == 0  # a key added before: its first offset, nothing added
    assert blob.add(("c",), c) == 192  # after 64 + 70 = 134 bytes
    assert (len(blob), blob.size) == (3, 193)
    want = bytearray(256)  # the size rounded up to 64
    want[0:3] = a.tobytes()
    want[64:134] = b.tobytes()
    want[192] = 7
    assert blob.tobytes() == bytes(want)
    assert WeightsBlob().tobytes() == b""


def test_c_array_is_an_aligned_static_definition_of_the_words():
    blob = WeightsBlob()
    blob.add(("w",), np.array([1, 2], dtype="<u4"))
    n, body = blob.c_words()
    assert n == 16
    assert blob.c_array("opfuse_weights") == (
        "static const uint32_t opfuse_weights[16] __attribute__((aligned(64))) = {\n" + body + "\n};\n")
    assert WeightsBlob().c_array("w") == ("static const uint32_t w[1] __attribute__((aligned(64))) = {\n"
                                          "  0x00000000u,\n};\n")


@pytest.mark.parametrize("n", [1, 7, 8, 9, 17])
def test_initializer_lines_of_any_word_count(n):
    """The blob always has whole 64-byte lines (16 words); the text is laid out for any count."""
    from opfuse.codegen.weights import _initializer_lines
    words = np.arange(1, n + 1, dtype="<u4") * 0x01010101
    text = _initializer_lines(words)
    assert _parse(text) == list(words)
    lines = text.split("\n")
    assert [line.count("0x") for line in lines] == [8] * (n // 8) + ([n % 8] if n % 8 else [])
    assert all(line.startswith("  0x") and line.endswith("u,") for line in lines)
    assert text == "\n".join("  " + " ".join(f"0x{w:08x}u," for w in words[i:i + 8]) for i in range(0, n, 8))
