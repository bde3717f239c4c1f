"""The precompiled system headers of host builds (``toolchain.precompiled_prelude``): built once per cache, compiler,
flags and header block; the same library byte for byte as without them; a damaged one costs a rebuild, never a
failed or different build; off with ``$OPFUSE_PCH=0``, for a compiler other than GCC, and for a source that does
not begin with the block."""
from __future__ import annotations

import filecmp

import numpy as np
import pytest

from opfuse.codegen import CodegenOptions
from opfuse.codegen.program import SYSTEM_HEADERS, generate, system_headers
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference, toolchain
from opfuse.runtime.native import build
from opfuse.runtime.toolchain import (PCH_DIR_ENV, PCH_ENV, PCH_FOLDER, PCH_HEADER, Toolchain, build_library,
                                      precompiled_prelude)

pytestmark = pytest.mark.skipif(not toolchain.is_gcc(toolchain.find_compiler()),
                                reason="precompiled headers are GCC's (.gch) here")


@pytest.fixture(autouse=True)
def _headers_in_each_cache(monkeypatch):
    """The default place, ``<cache>/pch`` (the suite shares one folder, ``$OPFUSE_PCH_DIR``)."""
    monkeypatch.delenv(PCH_DIR_ENV, raising=False)


def _graph(scale: float):
    b = GraphBuilder("pch")
    x = b.input("x", (4, 8))
    return b.build(b.op("Mul", b.op("Sigmoid", x), b.const("k", np.float32(scale))))


def _gch(root):
    return sorted((root / PCH_FOLDER).glob(f"*/{PCH_HEADER}.gch"))


def test_same_library_bytes_with_and_without_and_one_header_per_cache(tmp_path, monkeypatch):
    g = _graph(2.0)
    monkeypatch.setenv(PCH_ENV, "0")
    plain = build(g, None, cache_dir=tmp_path / "plain", threads=1)
    assert not (tmp_path / "plain" / PCH_FOLDER).exists()
    monkeypatch.setenv(PCH_ENV, "1")
    pre = build(g, None, cache_dir=tmp_path / "pch", threads=1)
    prelude = system_headers(CodegenOptions())
    assert plain.program.source.split("\n", 2)[2].startswith(prelude) and pre.program.prelude == prelude
    assert "immintrin" in prelude and "immintrin" not in system_headers(CodegenOptions(simd="none"))
    assert plain.build_result.key == pre.build_result.key
    assert filecmp.cmp(plain.build_result.library, pre.build_result.library, shallow=False)
    (gch,) = _gch(tmp_path / "pch")
    assert (gch.parent / PCH_HEADER).read_text() == prelude and gch.stat().st_mode & 0o077 == 0
    stamp = gch.stat().st_mtime_ns
    other = build(_graph(3.0), None, cache_dir=tmp_path / "pch", threads=1)  # another source: the same header
    assert _gch(tmp_path / "pch") == [gch] and gch.stat().st_mtime_ns == stamp
    feeds = reference.random_inputs(g, 0)
    np.testing.assert_allclose(other.run(feeds)["mul"], reference.run(_graph(3.0), feeds)["mul"], rtol=1e-6)


@pytest.mark.parametrize("damage", [b"", b"not a precompiled header" * 100], ids=["empty", "garbage"])
def test_a_damaged_header_is_rebuilt_or_skipped_never_a_failed_build(tmp_path, damage):
    g = _graph(2.0)
    first = build(g, None, cache_dir=tmp_path, threads=1)
    (gch,) = _gch(tmp_path)
    gch.write_bytes(damage)
    second = build(_graph(5.0), None, cache_dir=tmp_path, threads=1)  # a miss: compiled with the damaged header
    feeds = reference.random_inputs(g, 0)
    np.testing.assert_allclose(second.run(feeds)["mul"], reference.run(_graph(5.0), feeds)["mul"], rtol=1e-6)
    assert first.run(feeds)["mul"].shape == (4, 8)
    third = build(_graph(7.0), None, cache_dir=tmp_path, threads=1)  # the header made again (its stamp differs)
    assert third.run(feeds)["mul"].shape == (4, 8)
    (remade,) = _gch(tmp_path)
    assert remade.stat().st_size > 1 << 20 and toolchain._sound_pch(remade)


def test_not_used_off_for_other_compilers_or_a_source_that_does_not_begin_with_it(tmp_path, monkeypatch):
    tc = Toolchain.detect()
    assert precompiled_prelude(tmp_path, tc, "") == []
    monkeypatch.setenv(PCH_ENV, "0")
    assert precompiled_prelude(tmp_path, tc, SYSTEM_HEADERS) == []
    monkeypatch.setenv(PCH_ENV, "1")
    monkeypatch.setattr(toolchain, "is_gcc", lambda cc: False)
    assert precompiled_prelude(tmp_path, tc, SYSTEM_HEADERS) == []
    monkeypatch.undo()
    flags = precompiled_prelude(tmp_path, tc, SYSTEM_HEADERS)
    assert flags[0] == "-include" and flags[1].endswith(PCH_HEADER)
    assert toolchain._begins_with("/* banner */\n\n" + SYSTEM_HEADERS + "int x;\n", SYSTEM_HEADERS)
    assert not toolchain._begins_with("#define M 1\n" + SYSTEM_HEADERS, SYSTEM_HEADERS)  # a macro the headers see
    assert not toolchain._begins_with("int x;\n", SYSTEM_HEADERS)
    # a source that does not begin with the block builds without the header (no folder made)
    source = generate(_graph(2.0)).source.replace(SYSTEM_HEADERS, "#define OPFUSE_X 1\n" + SYSTEM_HEADERS)
    build_library(source, tc, tmp_path / "x", prelude=SYSTEM_HEADERS)
    assert not (tmp_path / "x" / PCH_FOLDER).exists()


def test_one_folder_for_every_cache(tmp_path, monkeypatch):
    """``$OPFUSE_PCH_DIR``: two caches, one precompiled header, none in either cache."""
    monkeypatch.setenv(PCH_DIR_ENV, str(tmp_path / "shared"))
    a = build(_graph(2.0), None, cache_dir=tmp_path / "a", threads=1)
    b = build(_graph(2.0), None, cache_dir=tmp_path / "b", threads=1)
    assert not a.report["cache_hit"] and not b.report["cache_hit"]
    assert len(list((tmp_path / "shared").glob(f"*/{PCH_HEADER}.gch"))) == 1
    assert not (tmp_path / "a" / PCH_FOLDER).exists() and not (tmp_path / "b" / PCH_FOLDER).exists()
