"""``opfuse compile --target cortex-m7 -o DIR`` and ``opfuse run --backend cortex-m7``."""
from __future__ import annotations

import json

import pytest

from opfuse.cli import main
from opfuse.runtime import mcu

needs_tools = pytest.mark.skipif(not mcu.tools_available(),
                                 reason="Cortex-M7 tests need arm-none-eabi-gcc, newlib and qemu-system-arm: "
                                        "run `make mcu-tools`")


@pytest.fixture
def no_tools(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    mcu.find_tools.cache_clear()
    yield
    mcu.find_tools.cache_clear()


def test_export_writes_a_firmware_library(tmp_path, capsys):
    out = tmp_path / "m7"
    assert main(["compile", "zoo:resnet8", "--target", "cortex-m7", "-o", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "model.c", "model.h", "model_weights.c", "report.json"]
    rep = json.loads((out / "report.json").read_text())
    assert rep["arena_bytes"] >= rep["arena_tensor_bytes"] >= rep["arena_lower_bound_bytes"] > 0
    assert f"#define OPFUSE_ARENA_BYTES {rep['arena_bytes']}u" in (out / "model.h").read_text()
    assert rep["flash_bytes"] >= rep["weights_bytes"] > 0
    assert all("predicted_latency_s" in k and "scratch_bytes" in k for k in rep["kernel_estimates"])
    assert "OPFUSE_ARENA_BYTES" in (out / "README.md").read_text()
    if mcu.tools_available():
        assert rep["code_bytes"] > 0 and rep["flash_bytes"] > rep["weights_bytes"]
        assert 0 < rep["stack_bound_bytes"] < 4096 and "opfuse_run" in rep["stack_frames"]
    assert "wrote" in capsys.readouterr().out


def test_export_without_the_cross_compiler_counts_the_weights(tmp_path, no_tools):
    assert main(["compile", "zoo:ds_cnn", "--target", "cortex-m7", "-o", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["code_bytes"] is None and rep["flash_bytes"] == rep["weights_bytes"]
    assert rep["stack_bound_bytes"] is None


def test_other_targets_are_still_planned_only(tmp_path, capsys):
    assert main(["compile", "zoo:resnet8", "--target", "a100", "-o", str(tmp_path)]) == 2
    assert "planned only" in capsys.readouterr().err


def test_missing_toolchain_is_one_line_and_exit_2(no_tools, capsys):
    assert main(["run", "zoo:resnet8", "--backend", "cortex-m7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "make mcu-tools" in err[0] and "arm-none-eabi-gcc" in err[0]


@needs_tools
def test_run_on_the_emulated_m7_prints_count_sizes_and_errors(capsys):
    assert main(["run", "zoo:resnet8", "--backend", "cortex-m7", "--compare", "reference"]) == 0
    out = capsys.readouterr().out
    assert "instructions executed" in out and "arm-none-eabi-size" in out and "SRAM" in out
    err = float(out.split("max rel error ")[1].split()[0])
    assert err < 1e-4


@needs_tools
def test_run_prints_the_patched_runs_and_the_limit_turns_them_off(capsys):
    assert main(["run", "zoo:ds_cnn", "--backend", "cortex-m7", "--compare", "reference"]) == 0
    out = capsys.readouterr().out
    patched = [line for line in out.splitlines() if line.startswith("patched: ")]
    assert patched and all("bands of" in line and "recomputed" in line for line in patched)
    arena = int(out.split("arena ")[1].split()[0].replace(",", ""))
    bound = int(out.split("layer-by-layer bound ")[1].split(")")[0].replace(",", ""))
    assert float(out.split("max rel error ")[1].split()[0]) < 1e-4
    assert main(["run", "zoo:ds_cnn", "--backend", "cortex-m7", "--patch-recompute-limit", "0"]) == 0
    plain = capsys.readouterr().out
    assert "patched: " not in plain
    assert arena < int(plain.split("layer-by-layer bound ")[1].split(")")[0].replace(",", "")) and bound > 0


def test_compile_reports_patching_and_rejects_a_bad_limit(tmp_path, capsys):
    out = tmp_path / "m7"
    assert main(["compile", "zoo:ds_cnn", "--target", "cortex-m7", "-o", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["patching"]["runs"] and rep["arena_bytes"] < 62.5 * 1024 * 0.75
    assert {"group": "fc", "reason": "Gemm 'fc' needs the whole feature map"} in rep["patching"]["stops"]
    assert main(["compile", "zoo:ds_cnn", "--target", "cortex-m7", "--patch-recompute-limit", "-1"]) == 2
    assert "recompute limit" in capsys.readouterr().err


def test_the_summary_names_the_arena_that_runs(tmp_path, capsys):
    """On the M7 the kernels' scratch (a patched run's workspace) is in the arena: the summary's
    arena is the exported OPFUSE_ARENA_BYTES, the tensors' share named beside it."""
    from opfuse.report.summary import human_bytes
    out = tmp_path / "m7"
    assert main(["compile", "zoo:resnet8", "--target", "cortex-m7", "-o", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    first = capsys.readouterr().out.splitlines()[0]
    assert rep["arena_bytes"] > rep["arena_tensor_bytes"]
    assert (f"arena {human_bytes(rep['arena_bytes'])} with kernel scratch, "
            f"tensors {human_bytes(rep['arena_tensor_bytes'])}") in first
