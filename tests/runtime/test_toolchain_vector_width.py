"""The host toolchain's compiler-vectorised loops run 256 bits wide where ``-march=native`` has AVX-512
(``toolchain.AVX512_VECTOR_WIDTH_FLAGS``): GCC 12.2's 512-bit loop vectorizer miscompiled a fused int64 Concat
(tests/e2e/repro/gcc12_avx512_concat_select, whose ``kernel.c`` is that kernel cut down to a few lines)."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from opfuse.runtime.toolchain import AVX512_VECTOR_WIDTH_FLAGS, Toolchain, native_avx512

KERNEL = Path(__file__).parents[1] / "e2e" / "repro" / "gcc12_avx512_concat_select" / "kernel.c"


def test_the_width_flag_follows_the_native_target():
    tc = Toolchain.detect()
    has = all(f in tc.flags for f in AVX512_VECTOR_WIDTH_FLAGS)
    assert has == native_avx512(tc.cc)
    assert not any(f in Toolchain.detect(native=False).flags for f in AVX512_VECTOR_WIDTH_FLAGS)


def test_the_cut_down_kernel_compiles_right_with_the_host_flags(tmp_path):
    tc = Toolchain.detect()
    flags = [f for f in tc.flags if f not in ("-shared", "-fPIC")]
    exe = tmp_path / "kernel"
    subprocess.run([*shlex.split(tc.cc), *flags, "-DCC", "-DRE", str(KERNEL), "-o", str(exe)], check=True,
                   capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["11", "12", "7", "6", "5", "4"], out
