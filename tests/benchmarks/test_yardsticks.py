"""``opfuse.yardsticks``: the sgemm yardstick is OpenBLAS's own choice for this CPU, whatever
``OPENBLAS_CORETYPE`` and the like say, and every result says where it came from."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from opfuse.yardsticks import BLAS_TUNING_ENVS, blas_tuning, describe, machine_sgemm, sgemm_provenance

SMALL = 64  # the provenance, not the figure: a small sgemm keeps the children quick


def _kernels_in(env: dict[str, str]) -> str | None:
    """The BLAS kernels a fresh process loads NumPy's OpenBLAS with, under ``env``."""
    code = ("import numpy, threadpoolctl; print([i['architecture'] for i in threadpoolctl.threadpool_info() "
            "if i['user_api'] == 'blas'][0])")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return r.stdout.strip()


def test_the_sgemm_runs_without_the_tuning_variables_and_says_so(monkeypatch):
    for k in BLAS_TUNING_ENVS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    ys = machine_sgemm(SMALL)
    assert ys["sgemm_env_removed"] == {"OPENBLAS_CORETYPE": "Haswell"} == blas_tuning()
    assert ys["sgemm_gflops"] > 0 and ys["sgemm_gflops_as_set"] > 0 and ys["sgemm_n"] == SMALL
    assert "child process" in ys["sgemm_one_thread_by"]
    if ys["sgemm_blas"] is not None and ys["sgemm_blas"].startswith("openblas"):  # threadpoolctl names the kernels
        clean = {k: v for k, v in os.environ.items() if k not in BLAS_TUNING_ENVS}
        assert ys["sgemm_blas"].split()[-1] == _kernels_in(clean)  # what OpenBLAS picks with nothing set
        assert ys["sgemm_blas_as_set"] == "openblas Haswell"  # the other child kept the variable
    line = describe({**ys, "copy_gbps": 20.0})
    assert line.startswith(f"yardsticks (timed now): NumPy sgemm n={SMALL} one thread ")
    assert "without OPENBLAS_CORETYPE=Haswell (set here; with them " in line.splitlines()[1]


def test_without_tuning_variables_one_child_and_nothing_removed(monkeypatch):
    for k in BLAS_TUNING_ENVS:
        monkeypatch.delenv(k, raising=False)
    ys = machine_sgemm(SMALL)
    assert ys["sgemm_env_removed"] == {} and ys["sgemm_gflops_as_set"] is None and ys["sgemm_blas_as_set"] is None
    assert "without" not in sgemm_provenance(ys) and sgemm_provenance(ys).endswith("one thread in a child process")
    assert sgemm_provenance({"sgemm_gflops": 90.0}) == ""  # a result from before provenance was recorded


def test_make_bench_notes_where_the_sgemm_came_from():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from bench_zoo import sgemm_note
    finally:
        sys.path.pop(0)
    row = {"sgemm_gflops": 207.0, "sgemm_blas": "openblas SkylakeX", "sgemm_blas_as_set": "openblas Haswell",
           "sgemm_env_removed": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"},
           "sgemm_gflops_as_set": 106.0}
    note = sgemm_note([row, dict(row, sgemm_gflops_as_set=116.0)])
    assert note.startswith(" (openblas SkylakeX kernels: the BLAS's own choice for this CPU, timed in a child process "
                           "without OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=512")
    assert "with them 106 to 116 GFLOP/s, openblas Haswell kernels)" in note
    assert sgemm_note([{"sgemm_gflops": 90.0}]) == ""


def test_bench_kernels_removes_the_tuning_variables_before_numpy_loads(tmp_path):
    out = tmp_path / "kernels.json"
    env = {**{k: v for k, v in os.environ.items() if k not in BLAS_TUNING_ENVS}, "OPENBLAS_CORETYPE": "Haswell"}
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernels.py"
    r = subprocess.run([sys.executable, str(script), "--only", "r18.ds", "--repeat", "1", "--warmup", "0", "--no-check",
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    meta = json.loads(out.read_text())["meta"]
    assert (meta["blas_env_removed"], meta["blas_env_kept"]) == ({"OPENBLAS_CORETYPE": "Haswell"}, {})
    if meta["blas"] and meta["blas"].startswith("openblas"):
        clean = {k: v for k, v in env.items() if k not in BLAS_TUNING_ENVS}
        assert meta["blas"].split()[-1] == _kernels_in(clean)
    assert "removed OPENBLAS_CORETYPE=Haswell before NumPy loaded" in r.stderr and "warning" not in r.stderr
