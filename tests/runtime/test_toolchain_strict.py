"""Strict C (``OPFUSE_STRICT_C=1``, which tests/conftest.py sets for the whole suite): GCC builds make the
warnings that mean a code generator slip errors (``toolchain.STRICT_FLAGS``); users' builds keep them warnings."""
from __future__ import annotations

import subprocess

import pytest

from opfuse.runtime import toolchain
from opfuse.runtime.toolchain import STRICT_ENV, STRICT_FLAGS, Toolchain, find_compiler, is_gcc

pytestmark = pytest.mark.skipif(not is_gcc(find_compiler()), reason="strict C is GCC's flags")

CONST_STORE = """
static void store(float* p) { p[0] = 1.0f; }
void kernel(const float* restrict out) { store(out); }
"""


def test_the_suite_builds_in_strict_c():
    assert toolchain.strict_c()
    assert set(STRICT_FLAGS) <= set(Toolchain.detect().flags)


@pytest.mark.parametrize("value, strict", [("1", True), ("0", False), ("", False), (" 1 ", True), ("yes", False)])
def test_only_1_turns_strict_c_on(monkeypatch, value, strict):
    monkeypatch.setenv(STRICT_ENV, value)
    assert toolchain.strict_c() is strict
    flags = Toolchain.detect().flags
    assert (set(STRICT_FLAGS) <= set(flags)) is strict and bool(set(STRICT_FLAGS) & set(flags)) is strict


def test_users_builds_keep_the_warnings(monkeypatch):
    monkeypatch.delenv(STRICT_ENV, raising=False)
    assert not toolchain.strict_c()


def test_a_store_through_a_const_pointer_fails_only_in_strict_c(tmp_path, monkeypatch):
    src = tmp_path / "k.c"
    src.write_text(CONST_STORE)
    for value, ok in (("0", True), ("1", False)):
        monkeypatch.setenv(STRICT_ENV, value)
        tc = Toolchain.detect(native=False, threads=False)
        r = subprocess.run([*tc.cc.split(), *tc.flags, "-c", str(src), "-o", str(tmp_path / "k.o")],
                           capture_output=True, text=True)
        assert (r.returncode == 0) is ok and "discards" in r.stderr
