"""``opfuse.compile(model, target="cortex-m7")``: the Python face of the Cortex-M7 backend."""
from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.cli import main
from opfuse.codegen.options import PORTABLE
from opfuse.compiler import CompileOptions, build_mcu, plan_model
from opfuse.errors import InputError, OpfuseError
from opfuse.runtime import mcu, reference
from opfuse.runtime.mcu import McuModel
from opfuse.runtime.native import build
from opfuse.runtime.toolchain import ToolchainError

needs_tools = pytest.mark.skipif(not mcu.tools_available(),
                                 reason="Cortex-M7 tests need arm-none-eabi-gcc, newlib and qemu-system-arm: "
                                        "run `make mcu-tools`")


def test_export_is_what_the_cli_writes(tmp_path, capsys):
    m7 = opfuse.compile("zoo:ds_cnn", target="cortex-m7")
    assert isinstance(m7, McuModel) and m7.instructions is None
    assert m7.arena_bytes == m7.program.arena_bytes > 0 and m7.report["target"] == "cortex-m7"
    files = m7.export_c(tmp_path / "api")
    assert sorted(p.name for p in files) == ["README.md", "model.c", "model.h", "model_weights.c", "report.json"]
    assert main(["compile", "zoo:ds_cnn", "--target", "cortex-m7", "-o", str(tmp_path / "cli")]) == 0
    capsys.readouterr()
    for name in ("model.c", "model.h", "model_weights.c", "README.md", "report.json"):
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name


def test_the_library_needs_a_cortex_m7_plan():
    with pytest.raises(OpfuseError, match="target 'cortex-m7', not 'host'"):
        build_mcu(plan_model("zoo:ds_cnn", CompileOptions(target="host")))


def test_without_the_toolchain_running_is_one_line_and_export_still_works(monkeypatch, tmp_path):
    m7 = opfuse.compile("zoo:ds_cnn", target="cortex-m7")
    monkeypatch.setenv("PATH", "/nonexistent")
    mcu.find_tools.cache_clear()
    try:
        with pytest.raises(ToolchainError) as err:
            m7.run(reference.random_inputs(m7.graph, 0))
        assert len(str(err.value).splitlines()) == 1 and "make mcu-tools" in str(err.value)
        assert (tmp_path / "lib" / "model.c") in m7.export_c(tmp_path / "lib")
    finally:
        mcu.find_tools.cache_clear()


def test_inputs_are_checked_before_the_toolchain(monkeypatch):
    m7 = opfuse.compile("zoo:ds_cnn", target="cortex-m7")
    with pytest.raises(InputError, match="shape"):
        m7.run({m7.graph.inputs[0].name: np.zeros((1, 2), np.float32)})


@needs_tools
def test_run_under_qemu_matches_the_cli_and_the_host_bit_for_bit(tmp_path, capsys, cache_dir):
    m7 = opfuse.compile("zoo:ds_cnn", target="cortex-m7")
    feeds = reference.random_inputs(m7.graph, 0)
    out = m7.run(feeds)
    assert m7.instructions > 100_000 and m7.last_run.instructions == m7.instructions
    comp = m7.compilation
    host = build(comp.graph, comp.plan, memory=comp.memory, cache_dir=cache_dir, options=PORTABLE).run(feeds)
    ref = reference.run(comp.original, feeds)
    for name, want in host.items():
        assert out[name].tobytes() == want.tobytes()
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-4, atol=1e-6)
    np.savez(tmp_path / "x.npz", **feeds)
    assert main(["run", "zoo:ds_cnn", "--backend", "cortex-m7", "--inputs", str(tmp_path / "x.npz")]) == 0
    assert f"{m7.instructions:,} instructions executed" in capsys.readouterr().out
    first = m7.instructions
    m7.run({k: v.astype(np.float64) for k, v in feeds.items()}, cast=True)
    assert m7.instructions == first  # deterministic, and cast inputs give the same run
