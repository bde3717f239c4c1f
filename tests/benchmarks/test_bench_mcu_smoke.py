"""benchmarks/bench_mcu.py runs end to end on one model and writes its JSON (it must not rot)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from opfuse.runtime import mcu

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_mcu.py"


@pytest.mark.skipif(not mcu.tools_available(), reason="Cortex-M7 tests need arm-none-eabi-gcc, newlib and "
                                                      "qemu-system-arm: run `make mcu-tools`")
def test_bench_mcu_smoke(tmp_path):
    out = tmp_path / "mcu.json"
    r = subprocess.run([sys.executable, str(BENCH), "ds_cnn", "--out", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = json.loads(out.read_text())["models"]
    assert row["model"] == "ds_cnn" and "| ds_cnn |" in r.stdout
    for plan in ("unfused", "fused", "patched"):
        assert row[plan]["bit_identical_to_host"] and row[plan]["max_rel_error"] < 1e-4
    for plan in ("unfused", "fused"):
        assert row[plan]["arena_bytes"] >= row[plan]["arena_lower_bound_bytes"] > 0
    # Patch-based execution goes below the fused plan's layer-by-layer bound, with the same bits.
    assert row["patched"]["arena_bytes"] < row["fused"]["arena_lower_bound_bytes"]
    assert row["patched"]["same_as_fused"] and row["patched"]["patching"]["runs"]
    assert row["fused"]["kernels"] < row["unfused"]["kernels"]


CASE = BENCH.parent / "bench_mcu_case.py"


@pytest.mark.skipif(not mcu.tools_available(), reason="Cortex-M7 tests need arm-none-eabi-gcc, newlib and "
                                                      "qemu-system-arm: run `make mcu-tools`")
def test_bench_mcu_case_smoke(tmp_path):
    out = tmp_path / "case.json"
    r = subprocess.run([sys.executable, str(CASE), "--size", "24", "--out", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    plans = data["plans"]
    assert data["size"] == 24 and set(plans) == {"unfused", "fused", "patched"}
    assert all(p["within_tolerance"] for p in plans.values()) and plans["patched"]["bit_identical_to_fused"]
    assert plans["patched"]["arena_bytes"] < plans["fused"]["arena_bytes"] < plans["unfused"]["arena_bytes"]
    assert data["at_224"]["patched"]["arena_bytes"] < data["at_224"]["fused"]["arena_bytes"]
    assert "| patched |" in r.stdout
