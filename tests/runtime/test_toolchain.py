"""The build cache (hits, corruption, partial entries, atomicity) and compiler discovery."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build
from opfuse.runtime.toolchain import (CACHE_ENV, LIBRARY_NAME, META_NAME, SOURCE_NAME, ToolchainError,
                                      build_library, find_compiler, Toolchain)


def _graph(scale=2.0):
    b = GraphBuilder("cache")
    x = b.input("x", (4, 4))
    return b.build(b.op("Mul", b.op("Sigmoid", x), b.const("k", np.float32(scale))))


def _entry(model):
    return model.build_result.library.parent


def _check(model):
    feeds = reference.random_inputs(model.graph, 0)
    want = reference.run(model.graph, feeds)
    got = model.run(feeds)
    assert np.allclose(got["mul"], want["mul"], rtol=1e-5, atol=1e-6)


def test_second_build_hits_the_cache(tmp_path):
    a = build(_graph(), None, cache_dir=tmp_path)
    b = build(_graph(), None, cache_dir=tmp_path)
    assert not a.report["cache_hit"] and b.report["cache_hit"]
    assert a.build_result.key == b.build_result.key
    assert build(_graph(3.0), None, cache_dir=tmp_path).build_result.key != a.build_result.key


def test_cache_dir_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "envcache"))
    m = build(_graph(), None)
    assert str(tmp_path / "envcache") in str(m.build_result.library)


@pytest.mark.parametrize("damage", ["truncate_library", "garbage_library", "delete_meta", "garbage_meta",
                                    "edit_source"])
def test_corrupt_entries_are_detected_and_rebuilt(tmp_path, damage):
    m = build(_graph(), None, cache_dir=tmp_path)
    entry = _entry(m)
    lib, meta, src = entry / LIBRARY_NAME, entry / META_NAME, entry / SOURCE_NAME
    if damage == "truncate_library":
        lib.write_bytes(lib.read_bytes()[:100])
    elif damage == "garbage_library":
        lib.write_bytes(b"\x7fELF garbage" * 10)
    elif damage == "delete_meta":
        meta.unlink()
    elif damage == "garbage_meta":
        meta.write_text("{not json")
    else:
        src.write_text(src.read_text() + "\n/* edited */\n")
    again = build(_graph(), None, cache_dir=tmp_path)
    assert not again.report["cache_hit"]
    assert json.loads(meta.read_text())["library_sha256"]
    _check(again)
    assert build(_graph(), None, cache_dir=tmp_path).report["cache_hit"]


def test_partial_entry_without_library_is_rebuilt(tmp_path):
    m = build(_graph(), None, cache_dir=tmp_path)
    (_entry(m) / LIBRARY_NAME).unlink()
    again = build(_graph(), None, cache_dir=tmp_path)
    assert not again.report["cache_hit"]
    _check(again)


def test_builds_leave_no_temporary_directories(tmp_path):
    build(_graph(), None, cache_dir=tmp_path)
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith(".build-")]
    assert leftovers == []


def test_no_compiler_names_the_reference_backend(monkeypatch):
    monkeypatch.setenv("CC", "definitely-not-a-compiler-xyz")
    with pytest.raises(ToolchainError, match="reference"):
        find_compiler()
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolchainError, match="no C compiler"):
        build(_graph(), None)


def test_compile_errors_are_not_user_errors(tmp_path):
    from opfuse.errors import OpfuseError
    from opfuse.runtime.toolchain import CompileError
    with pytest.raises(CompileError) as e:
        build_library("this is not C;", Toolchain.detect(), tmp_path)
    assert not isinstance(e.value, OpfuseError)
    assert not any(p.name.startswith(".build-") for p in tmp_path.rglob("*"))
    assert os.listdir(tmp_path)  # the shard directory exists, but holds no entry


def test_float16_in_c_computes_in_float32(cache_dir):
    """float16 ops run in the C backend (widened to float32 between Casts, ``rewrites.float32_compute``)."""
    b = GraphBuilder("f16")
    g = b.build(b.op("Relu", b.input("half_x", (2, 2), np.float16)))
    x = np.array([[-1.5, 2.0], [0.0, -0.0]], np.float16)
    y = build(g, None, cache_dir=cache_dir).run({"half_x": x})
    np.testing.assert_array_equal(list(y.values())[0], np.maximum(x, 0))
