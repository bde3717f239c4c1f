"""Filesystem and compiler faults around the build cache: each ends in one line or a sound build,
never in a traceback, a stale entry or a half-written file."""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from opfuse.errors import OpfuseError, StorageError
from opfuse.ops import GraphBuilder
from opfuse.runtime import native, reference, toolchain
from opfuse.runtime.native import build
from opfuse.runtime.toolchain import (BUILD_PREFIX, CACHE_ENV, LIBRARY_NAME, LOAD_PREFIX, LOCK_NAME, STALE_BUILD_S,
                                      ToolchainError, Toolchain, find_compiler)


def _graph(scale=2.0):
    b = GraphBuilder("faults")
    x = b.input("x", (4, 4))
    return b.build(b.op("Mul", b.op("Sigmoid", x), b.const("k", np.float32(scale))))


def _works(model):
    feeds = reference.random_inputs(model.graph, 0)
    np.testing.assert_allclose(model.run(feeds)["mul"], reference.run(model.graph, feeds)["mul"], rtol=1e-5)


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith((BUILD_PREFIX, LOAD_PREFIX))]


def _is_library_compile(cmd) -> bool:
    return any(str(c).endswith(LIBRARY_NAME) for c in cmd)


# Read-only and full disks ---------------------------------------------------------------------
def test_a_read_only_cache_still_loads_a_hit(tmp_path, monkeypatch):
    build(_graph(), None, cache_dir=tmp_path)
    real = shutil.copyfile

    def copy(src, dst, *a, **k):
        if Path(dst).is_relative_to(tmp_path):
            raise PermissionError(errno.EACCES, "Permission denied", str(dst))
        return real(src, dst, *a, **k)
    monkeypatch.setattr(native.shutil, "copyfile", copy)
    m = build(_graph(), None, cache_dir=tmp_path)
    assert m.report["cache_hit"]
    _works(m)
    assert _leftovers(tmp_path) == []


def test_no_place_to_load_from_is_one_line(tmp_path, monkeypatch):
    build(_graph(), None, cache_dir=tmp_path)

    def copy(src, dst, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))
    monkeypatch.setattr(native.shutil, "copyfile", copy)
    with pytest.raises(StorageError, match="cannot load the compiled library.*No space left on device"):
        build(_graph(), None, cache_dir=tmp_path)


def test_full_disk_writing_the_source_is_a_storage_error_and_leaves_nothing(tmp_path, monkeypatch):
    real = Path.write_text

    def write_text(self, *a, **k):
        if self.name == toolchain.SOURCE_NAME:
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)
    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(StorageError, match="cannot write the build cache.*No space left on device"):
        build(_graph(), None, cache_dir=tmp_path)
    assert _leftovers(tmp_path) == [] and not list(tmp_path.rglob(LIBRARY_NAME))


def test_full_disk_in_the_linker_is_not_a_failure_on_generated_code(tmp_path, monkeypatch):
    real = toolchain._run

    def run(cmd, *a, **k):
        if _is_library_compile(cmd):
            Path(cmd[cmd.index("-o") + 1]).write_bytes(b"")  # what ld leaves behind
            return subprocess.CompletedProcess(cmd, 1, "", "/usr/bin/ld: final link failed: No space left on device\n")
        return real(cmd, *a, **k)
    monkeypatch.setattr(toolchain, "_run", run)
    with pytest.raises(StorageError, match="No space left on device") as e:
        build(_graph(), None, cache_dir=tmp_path)
    assert "generated code" not in str(e.value)
    assert _leftovers(tmp_path) == [] and not list(tmp_path.rglob(LIBRARY_NAME))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_cache_folder_on_a_cold_build(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(StorageError, match="Permission denied.*OPFUSE_CACHE_DIR"):
        build(_graph(), None, cache_dir=ro)


# Where the cache is -----------------------------------------------------------------------------
def test_cache_dir_pointing_at_a_file(tmp_path, monkeypatch):
    f = tmp_path / "not-a-folder"
    f.write_text("mine")
    monkeypatch.setenv(CACHE_ENV, str(f))
    with pytest.raises(StorageError, match="not a folder"):
        build(_graph(), None)
    assert f.read_text() == "mine"  # the user's file is never removed


def test_home_that_cannot_hold_a_cache(tmp_path, monkeypatch):
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(StorageError, match="build cache.*not a folder.*OPFUSE_CACHE_DIR"):
        build(_graph(), None)


def test_tilde_is_expanded_for_both_caches(tmp_path, monkeypatch):
    from opfuse.targets import cache as profile_cache
    from opfuse.targets.calibrate import CACHE_FILE
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(CACHE_ENV, "~/opfuse-cache")
    assert profile_cache.cache_dir() == toolchain.cache_root(None) == tmp_path / "opfuse-cache"
    m = build(_graph(), None)
    assert m.build_result.library.is_relative_to(tmp_path / "opfuse-cache")
    profile_cache.atomic_write_json(profile_cache.cache_dir() / CACHE_FILE, {"x": 1})
    assert (tmp_path / "opfuse-cache" / CACHE_FILE).is_file()
    assert not any(p.name == "~" for p in tmp_path.rglob("*")) and not Path("~").exists()


def test_cache_folders_and_files_are_private(tmp_path):
    from opfuse.targets import cache as profile_cache
    root = tmp_path / "a" / "cache"
    m = build(_graph(), None, cache_dir=root)
    entry = m.build_result.library.parent
    for d in (tmp_path / "a", root, entry.parent, entry):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in entry.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    profile_cache.atomic_write_json(root / "corrections" / "h.json", {"x": 1})
    assert stat.S_IMODE((root / "corrections").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "corrections" / "h.json").stat().st_mode) == 0o600


def test_an_entry_writable_by_others_is_not_loaded(tmp_path):
    m = build(_graph(), None, cache_dir=tmp_path)
    entry = m.build_result.library.parent
    entry.chmod(0o777)
    again = build(_graph(), None, cache_dir=tmp_path)
    assert not again.report["cache_hit"]
    assert stat.S_IMODE(again.build_result.library.parent.stat().st_mode) == 0o700


# A cache that changes under us -----------------------------------------------------------------
def test_cache_removed_during_the_build_is_rebuilt(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    real = toolchain._run
    removed = []

    def run(cmd, *a, **k):
        if _is_library_compile(cmd) and not removed:
            shutil.rmtree(root)
            removed.append(True)
        return real(cmd, *a, **k)
    monkeypatch.setattr(toolchain, "_run", run)
    m = build(_graph(), None, cache_dir=root)
    assert removed and m.build_result.library.is_file()
    _works(m)


@pytest.mark.parametrize("where", ["entry", "shard"])
def test_a_file_where_a_folder_should_be(tmp_path, where):
    m = build(_graph(), None, cache_dir=tmp_path)
    entry = m.build_result.library.parent
    target = entry if where == "entry" else entry.parent
    shutil.rmtree(target)
    target.write_text("in the way")
    for _ in range(2):  # every later run works, the second one from the cache
        m = build(_graph(), None, cache_dir=tmp_path)
        _works(m)
    assert m.report["cache_hit"]


def test_stale_build_folders_are_removed_unless_locked(tmp_path):
    m = build(_graph(), None, cache_dir=tmp_path)
    shard = m.build_result.library.parent.parent
    old = time.time() - STALE_BUILD_S - 60
    stale, locked, young = (shard / f"{BUILD_PREFIX}{n}" for n in ("stale", "locked", "young"))
    load = shard / f"{LOAD_PREFIX}1-2-abc.so"
    for d in (stale, locked, young):
        d.mkdir()
        (d / "model.c").write_text("int x;")
    load.write_bytes(b"")
    holder = open(locked / LOCK_NAME, "w")  # a build that is still running
    fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
    try:
        for p in (stale, locked, load):
            os.utime(p, (old, old))
        build(_graph(3.0), None, cache_dir=tmp_path)  # a miss: builds clean up
        assert not stale.exists() and not load.exists()
        assert locked.exists() and young.exists()
    finally:
        holder.close()


# Compilers that exist but fail ---------------------------------------------------------------------
@pytest.mark.parametrize("cc,why", [("/bin/false", "failed \\(exit 1\\)"), ("/bin/true", "wrote no library")])
def test_a_compiler_that_does_not_work(monkeypatch, tmp_path, cc, why):
    monkeypatch.setenv("CC", cc)
    with pytest.raises(ToolchainError, match=f"C compiler '{cc}' does not work: .*{why}.*reference"):
        build(_graph(), None, cache_dir=tmp_path)
    assert _leftovers(tmp_path) == []


def test_cc_may_be_a_command_line_such_as_ccache_gcc(monkeypatch, tmp_path):
    gcc = shutil.which("gcc") or shutil.which("cc")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "ccache"  # a stand-in that runs the compiler it is given, as ccache does
    wrapper.write_text('#!/bin/sh\nexec "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CC", f"ccache {Path(gcc).name}")
    assert find_compiler() == f"{wrapper} {Path(gcc).name}"
    m = build(_graph(), None, cache_dir=tmp_path / "c")
    assert m.toolchain.cc.startswith(str(wrapper))
    _works(m)


def test_a_compiler_killed_by_a_signal(monkeypatch, tmp_path):
    real = toolchain._run

    def run(cmd, *a, **k):
        if _is_library_compile(cmd):
            return subprocess.CompletedProcess(cmd, -9, "", "")
        return real(cmd, *a, **k)
    monkeypatch.setattr(toolchain, "_run", run)
    with pytest.raises(ToolchainError, match="killed by signal 9"):
        build(_graph(), None, cache_dir=tmp_path)


def test_every_fault_here_is_a_user_facing_error():
    assert issubclass(StorageError, OpfuseError) and issubclass(ToolchainError, OpfuseError)
    assert Toolchain.detect().cc


def test_a_full_temporary_folder_is_named_as_such_when_testing_the_compiler(monkeypatch):
    real = toolchain._run

    def run(cmd, *a, **k):
        if any(str(c).endswith("probe.so") for c in cmd):
            return subprocess.CompletedProcess(cmd, 1, "", "error closing /tmp/cc.s: No space left on device")
        return real(cmd, *a, **k)
    monkeypatch.setattr(toolchain, "_run", run)
    toolchain.check_compiler.cache_clear()
    try:
        with pytest.raises(StorageError, match="cannot write its files: No space left on device"):
            toolchain.check_compiler("/usr/bin/some-cc")
    finally:
        toolchain.check_compiler.cache_clear()
