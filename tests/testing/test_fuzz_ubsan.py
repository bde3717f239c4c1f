"""The fuzzer's ``ubsan`` profile: builds with UBSan (``toolchain.SANITIZE_FLAGS``), so undefined behaviour in
the generated C is a crash verdict carrying UBSan's message, even where x86's conversion happens to give the
reference's answer. The child below puts back the bare C cast a float Cast to an integer type was before
``float_to_int_helper`` (``(uint8_t)NaN``): with UBSan the case crashes and says why; without, it passes."""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from opfuse.runtime.toolchain import SANITIZE_FLAGS, Toolchain, find_compiler, supports_sanitizer
from opfuse.testing.fuzz_check import CODEGEN_PROFILES, SANITIZED_PROFILES, Worker, _serve, pack_inputs

REPRO = Path(__file__).parents[1] / "e2e" / "repro" / "quantize_dequantize_of_a_nan_fused"

needs_ubsan = pytest.mark.skipif(not supports_sanitizer(find_compiler()), reason="the C compiler has no UBSan")


def _serve_with_bare_casts(conn, cache_dir):
    """The checking child's loop, its float-to-integer Casts written as bare C casts (undefined for NaN)."""
    from opfuse.codegen import rules
    from opfuse.codegen.ctype import c_type
    rules.float_to_int_helper = lambda program, src, dst, in_range=False: f"({c_type(dst)})"
    _serve(conn, cache_dir)


def _die_with_another_report(conn, cache_dir):
    """A child that writes a report without a UBSan runtime error where UBSan would write, then aborts."""
    conn.recv()
    log = dict(kv.split("=", 1) for kv in os.environ["UBSAN_OPTIONS"].split(":"))["log_path"]
    Path(f"{log}.{os.getpid()}").write_text("==1==WARNING: something else\n")
    os.abort()


def _die_quietly(conn, cache_dir):
    conn.recv()
    os.abort()


def test_a_crash_without_a_ubsan_runtime_error_has_no_ubsan_detail():
    model, npz = _case()
    for serve in (_die_with_another_report, _die_quietly):
        with Worker(serve=serve) as w:
            v = w.check(model, npz, codegen="ubsan")
        assert v.detail == "the process running the case died: SIGABRT", (serve.__name__, v.detail)


def _case():
    return (REPRO / "model.onnx").read_bytes(), pack_inputs(dict(np.load(REPRO / "inputs.npz")))


@needs_ubsan
def test_undefined_behaviour_is_a_crash_with_ubsans_message(tmp_path):
    model, npz = _case()
    assert "ubsan" in SANITIZED_PROFILES and CODEGEN_PROFILES["ubsan"] == CODEGEN_PROFILES["thresholds"]
    with Worker(str(tmp_path), serve=_serve_with_bare_casts) as w:
        v = w.check(model, npz, codegen="ubsan")
        assert (v.status, v.stage) == ("crash", "process"), v.line()
        assert re.search(r"died: exit status 1 \(UBSan: model\.c:\d+:\d+: runtime error: nan is outside the range of "
                         r"representable values of type 'unsigned char'\)$", v.detail), v.detail
        assert w.check(model, npz, codegen="thresholds").status != "crash"  # the same C unsanitized runs
    with Worker(str(tmp_path)) as w:  # the C as generated: no undefined behaviour there
        assert w.check(model, npz, codegen="ubsan").status == "ok"


@needs_ubsan
def test_a_sanitized_build_has_the_flags_and_its_own_cache_key():
    plain, sanitized = Toolchain.detect(), Toolchain.detect(sanitize=True)
    assert set(SANITIZE_FLAGS) <= set(sanitized.flags) and not set(SANITIZE_FLAGS) & set(plain.flags)
    from opfuse.runtime.toolchain import build_key
    assert build_key("int x;", plain) != build_key("int x;", sanitized)


def test_a_compiler_without_ubsan_is_a_toolchain_error(monkeypatch):
    from opfuse.runtime import toolchain
    monkeypatch.setattr(toolchain, "supports_sanitizer", lambda cc: False)
    with pytest.raises(toolchain.ToolchainError, match="cannot build with -fsanitize"):
        Toolchain.detect(sanitize=True)


def _asan_runtime() -> str | None:
    """libasan and libstdc++ to preload (ASan must come first; it looks up the C++ exception runtime), or None."""
    import subprocess
    libs = []
    for name in ("libasan.so", "libstdc++.so"):
        path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(path):
            return None
        libs.append(path)
    return " ".join(libs)


def _read_past_an_array(conn, cache_dir):
    """A child that builds a kernel with AddressSanitizer and lets it read one float past a NumPy array."""
    import ctypes
    import subprocess
    import tempfile
    conn.recv()
    d = tempfile.mkdtemp()
    Path(d, "k.c").write_text("float k_sum(const float* p, long n) { float s = 0; for (long i = 0; i <= n; ++i) "
                              "s += p[i]; return s; }\n")
    subprocess.run(["gcc", "-fsanitize=address", "-O1", "-fPIC", "-shared", "-o", f"{d}/k.so", f"{d}/k.c"], check=True)
    lib = ctypes.CDLL(f"{d}/k.so")
    lib.k_sum.restype = ctypes.c_float
    a = np.ones(1000, np.float32)
    conn.send(lib.k_sum(a.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(a.size)))


def test_an_address_sanitizer_error_names_its_kind_and_kernel(monkeypatch):
    """``make fuzz-sanitized``: children under libasan (LD_PRELOAD), builds with -fsanitize=address; a read past a
    tensor ends the case with AddressSanitizer's kind of error and the function it was in."""
    runtime = _asan_runtime()
    if runtime is None:
        pytest.skip("no libasan for gcc")
    monkeypatch.setenv("LD_PRELOAD", runtime)
    monkeypatch.setenv("ASAN_OPTIONS", "detect_leaks=0")
    model, npz = _case()
    with Worker(serve=_read_past_an_array) as w:
        v = w.check(model, npz)
    assert v.detail == "the process running the case died: exit status 1 (AddressSanitizer: heap-buffer-overflow " \
                       "in k_sum)", v.detail


def test_a_convolution_reads_no_window_past_its_input_under_asan(monkeypatch, tmp_path):
    """``make fuzz-sanitized`` (seed 68001, shrunk to one node): a 1x1 convolution of a graph input (2 x 2 x 5 x 6:
    30 positions a channel, blocks of 12) in the plain C build read its last block's rows past the input's end: the
    row-step micro-kernel reads all 12 rows of a block from its first, and the last block has 6
    (AddressSanitizer: heap-buffer-overflow). A part block now takes its rows one by one, those past the end
    repeating the last (``gemm.py``: no row step where M mod MR rows end without tail panels)."""
    runtime = _asan_runtime()
    if runtime is None:
        pytest.skip("no libasan for gcc")
    monkeypatch.setenv("LD_PRELOAD", runtime)
    monkeypatch.setenv("ASAN_OPTIONS", "detect_leaks=0")
    monkeypatch.setenv("CC", "gcc -fsanitize=address,undefined -fno-sanitize-recover=all")
    repro = Path(__file__).parents[1] / "e2e" / "repro" / "windows_row_step_past_the_input"
    model, npz = (repro / "model.onnx").read_bytes(), pack_inputs(dict(np.load(repro / "inputs.npz")))
    with Worker(str(tmp_path)) as w:
        v = w.check(model, npz, "rules", 2, "portable")
    assert v.status == "ok", v.line()
