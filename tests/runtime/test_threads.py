"""Threads of the native runtime: the default count, and workers that sleep between runs (also when the
library loads into a process that already runs threads or OpenMP). The pool itself: tests/codegen/test_pool.py."""
from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from opfuse.runtime import threads
from opfuse.runtime.native import build
from opfuse.runtime.threads import POOL_DESCRIPTION
from opfuse.runtime.toolchain import Toolchain
from opfuse.zoo import load


@pytest.mark.parametrize("env, want", [("3", 3), ("4,2", 4), (" 5 ", 5)])
def test_default_threads_honours_omp_num_threads(monkeypatch, env, want):
    monkeypatch.setenv("OMP_NUM_THREADS", env)
    assert threads.default_threads() == want


@pytest.mark.parametrize("env", [None, "", "0", "many"])
def test_default_threads_is_the_cores_this_process_may_use(monkeypatch, env):
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    assert threads.default_threads() == len(os.sched_getaffinity(0))


def test_compiled_models_default_to_the_available_cores(monkeypatch, cache_dir):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    model = build(load("resnet8"), cache_dir=cache_dir)
    assert model.threads == model.report["threads"] == len(os.sched_getaffinity(0))


RUNS = 40
# Each case runs in a fresh interpreter (a pool's workers live as long as its library).
_PROBE = r"""
import ctypes, json, os, sys, time
if sys.argv[1] == "preload":          # another library (PyTorch, scikit-learn) brought OpenMP in first
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
elif sys.argv[1] == "threads":        # a process that already runs threads of its own
    import threading
    stop = threading.Event()
    for _ in range(2):
        threading.Thread(target=stop.wait, daemon=True).start()
from opfuse.runtime.native import build
from opfuse.runtime.reference import random_inputs
from opfuse.zoo import load

def cpu_ms():
    out = {}
    for t in os.listdir("/proc/self/task"):
        f = open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()
        out[t] = (int(f[11]) + int(f[12])) * 1000 // os.sysconf("SC_CLK_TCK")
    return out

model = build(load("resnet8"), threads=2)
feeds = random_inputs(model.graph, 0)
model.run(feeds)
before = cpu_ms()
for _ in range(int(sys.argv[3])):    # the caller works between runs: here it sleeps
    model.run(feeds)
    time.sleep(0.005)
after = cpu_ms()
me = str(os.getpid())
others = sum(v - before.get(k, 0) for k, v in after.items() if k != me)
maps = open("/proc/self/maps").read()
print(json.dumps({"pool": model.report["thread_pool"], "gomp_mapped": "libgomp" in maps,
                  "tasks": len(after), "worker_cpu_ms": others, "main_cpu_ms": after[me] - before[me]}))
"""


def _probe(mode: str) -> dict:
    gomp = ctypes.util.find_library("gomp") or "libgomp.so.1"
    r = subprocess.run([sys.executable, "-c", _PROBE, mode, gomp, str(RUNS)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


needs_pool = pytest.mark.skipif(not (Toolchain.detect().threads and os.path.exists("/proc/self/maps")),
                                reason="needs a compiler that builds POSIX threads, and /proc")


@needs_pool
@pytest.mark.parametrize("mode", ["fresh", "threads", "preload"])
def test_workers_spin_briefly_then_sleep_between_runs(mode):
    got = _probe(mode)
    assert got["pool"] == POOL_DESCRIPTION
    if mode != "preload":  # the generated library brings no OpenMP runtime in
        assert not got["gomp_mapped"]
    # A worker spins 0.1 ms after a loop, then sleeps while the caller sleeps: well under a millisecond of CPU
    # a run (libgomp's default spin took ~15 ms a run on the 2-core machine this was written on).
    assert got["worker_cpu_ms"] < RUNS * 5, got


def test_opfuse_run_uses_the_available_cores_unless_told(capsys, monkeypatch):
    from opfuse.cli import main
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert main(["run", "zoo:resnet8", "--backend", "c"]) == 0
    assert f"{cores} thread{'s' if cores > 1 else ''}, arena" in capsys.readouterr().out
    assert main(["run", "zoo:resnet8", "--backend", "c", "--threads", "1"]) == 0
    assert "1 thread, arena" in capsys.readouterr().out
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert main(["run", "zoo:resnet8", "--backend", "c"]) == 0
    assert "3 threads, arena" in capsys.readouterr().out
