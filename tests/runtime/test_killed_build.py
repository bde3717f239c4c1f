"""A build killed with ``kill -9`` leaves its temporary folder (and its entry lock); the next
build removes them once older than the grace (``STALE_BUILD_S``: the instants a live build's
folder is not locked yet), never while the build runs (its lock, which the kernel drops when
the process dies)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from opfuse.runtime.toolchain import BUILD_PREFIX, KEY_LOCK_PREFIX, STALE_BUILD_S, remove_stale_builds
from test_concurrent_cold_start import WAIT_S, _env, _temporaries


def test_a_build_killed_by_sigkill_leaves_a_folder_the_next_build_removes(tmp_path):
    """A compiler that hangs stands for a long build; the building process is killed with
    SIGKILL (its process group: the compiler too). While it runs its folder stays even when old;
    once killed the kernel has dropped its lock, and the next build removes the folder."""
    hang = tmp_path / "slowcc"
    started = tmp_path / "started"
    hang.write_text(f"#!/bin/sh\ncase \"$*\" in *libmodel.so*) touch {started}; sleep 60;; esac\n"
                    f"exec {os.environ.get('CC', 'cc')} \"$@\"\n")
    hang.chmod(0o755)
    cache = tmp_path / "cache"
    env = dict(_env(cache), CC=str(hang))
    code = ("import numpy as np, opfuse\nfrom opfuse.ops import GraphBuilder\n"
            "b = GraphBuilder('k')\nx = b.input('x', (4,))\n"
            "opfuse.compile(b.build(b.op('Relu', x)), fuse=False)\n")
    p = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while not started.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.02)
        assert started.exists(), p.stderr.read() if p.poll() is not None else "the build did not start"
        (folder,) = cache.glob(f"*/{BUILD_PREFIX}*")
        old = time.time() - STALE_BUILD_S - 60
        os.utime(folder, (old, old))
        assert remove_stale_builds(cache) == [] and folder.exists()  # locked by a live build: kept
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=WAIT_S)
    assert p.returncode == -signal.SIGKILL
    assert folder.exists()  # what kill -9 leaves
    os.utime(folder, (old, old))
    for lock in cache.glob(f"*/{KEY_LOCK_PREFIX}*"):  # the killed build's entry lock too
        os.utime(lock, (old, old))
    removed = remove_stale_builds(cache)
    assert folder in removed and not folder.exists()
    assert _temporaries(cache) == []


@pytest.mark.parametrize("age_s", [0.0, STALE_BUILD_S / 2])
def test_a_young_unlocked_build_folder_is_kept(tmp_path, age_s):
    """Within the grace a folder may be one a build has just made and not locked yet."""
    shard = tmp_path / "ab"
    folder = shard / f"{BUILD_PREFIX}young"
    folder.mkdir(parents=True)
    t = time.time() - age_s
    os.utime(folder, (t, t))
    assert remove_stale_builds(tmp_path) == [] and folder.exists()
