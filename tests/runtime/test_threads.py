"""Threads of the native runtime: the default count, and passive OpenMP waits between kernels
(also when the library loads into a process that already runs threads or OpenMP)."""
from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from opfuse.runtime import threads
from opfuse.runtime.native import build
from opfuse.runtime.threads import SPIN_COUNT_DEFAULT
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
# Each case runs in a fresh interpreter: libgomp reads its wait policy once per process.
_PROBE = r"""
import ctypes, json, os, sys, time, warnings
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

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
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
print(json.dumps({"policy": model.report["openmp_wait_policy"], "env": os.environ.get("OMP_WAIT_POLICY"),
                  "spin": os.environ.get("GOMP_SPINCOUNT"),
                  "warnings": [str(w.message) for w in caught], "worker_cpu_ms": others,
                  "main_cpu_ms": after[me] - before[me]}))
"""


def _probe(mode: str, env: dict | None = None) -> dict:
    run_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    run_env.update(env or {})
    gomp = ctypes.util.find_library("gomp") or "libgomp.so.1"
    r = subprocess.run([sys.executable, "-c", _PROBE, mode, gomp, str(RUNS)], capture_output=True, text=True,
                       env=run_env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


needs_gomp = pytest.mark.skipif(not (Toolchain.detect().openmp and os.path.exists("/proc/self/maps")),
                                reason="needs a compiler with OpenMP and /proc")


@needs_gomp
@pytest.mark.parametrize("mode", ["fresh", "threads"])
def test_waits_spin_briefly_then_sleep_between_runs(mode):
    got = _probe(mode)
    assert got["policy"] == f"GOMP_SPINCOUNT={SPIN_COUNT_DEFAULT}" and got["spin"] == str(SPIN_COUNT_DEFAULT)
    assert got["env"] is None and not got["warnings"]
    # Workers spin a bounded while, then sleep while the caller sleeps: ~0.3 ms of CPU a run here,
    # while workers spinning libgomp's default took ~15 ms a run on the 2-core machine this was written on.
    assert got["worker_cpu_ms"] < RUNS * 5, got


@needs_gomp
def test_openmp_loaded_before_opfuse_is_named_not_silently_spinning():
    got = _probe("preload")
    assert got["policy"].startswith("unknown:")
    assert any("OMP_WAIT_POLICY=PASSIVE" in w for w in got["warnings"])


@needs_gomp
def test_a_users_wait_policy_wins():
    got = _probe("preload", {"OMP_WAIT_POLICY": "passive"})
    assert got["policy"] == "user: OMP_WAIT_POLICY=passive" and not got["warnings"]
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
