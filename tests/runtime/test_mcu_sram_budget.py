"""The SRAM budget of the Cortex-M7 (``--memory-budget``): the arena, scratch included, must fit it."""
from __future__ import annotations

import re

import numpy as np
import pytest

from opfuse.cli import main
from opfuse.codegen.options import PORTABLE
from opfuse.compiler import CompileOptions, plan_model
from opfuse.errors import OpfuseError
from opfuse.runtime import mcu, reference
from opfuse.runtime.native import build
from opfuse.targets.builtin import cortex_m7

KIB = 1024


def test_the_default_budget_is_the_sram_and_the_record_is_the_arena_that_runs():
    comp = plan_model("zoo:resnet8", CompileOptions(target="cortex-m7"))
    rec = comp.report["memory_budget"]
    assert rec["budget_bytes"] == rec["sram_bytes"] == cortex_m7().onchip_bytes and rec["source"] == "cortex-m7 SRAM"
    assert rec["raised_from"] is None and rec["recompute_limit"] == 0.3 and rec["fits"] and not rec["enforced"]
    assert rec["arena_bytes"] == mcu.generate_mcu(comp.graph, comp.plan, comp.memory).arena_bytes
    # The host has no SRAM budget: nothing recorded.
    assert "memory_budget" not in plan_model("zoo:resnet8", CompileOptions(target="host")).report


def test_a_tighter_budget_raises_the_recompute_limit_until_it_fits():
    comp = plan_model("zoo:mobilenet_v1_025_96", CompileOptions(target="cortex-m7", memory_budget_bytes=110 * KIB))
    rec = comp.report["memory_budget"]
    assert rec["source"] == "--memory-budget" and rec["raised_from"] == 0.3 and rec["recompute_limit"] > 0.3
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    assert program.arena_bytes == rec["arena_bytes"] <= 110 * KIB
    default = plan_model("zoo:mobilenet_v1_025_96", CompileOptions(target="cortex-m7")).report["memory_budget"]
    assert default["arena_bytes"] > 110 * KIB  # the default limit alone would not have fitted


def test_when_nothing_fits_the_error_names_the_smallest_arena_and_that_one_works(capsys):
    assert main(["compile", "zoo:resnet8", "--target", "cortex-m7", "--memory-budget", "40K"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not fit the memory budget of 40,960 bytes" in err
    m = re.search(r"smallest arena that would work is ([\d,]+) bytes, with --patch-recompute-limit ([\d.]+)", err)
    assert m is not None, err
    smallest, limit = int(m.group(1).replace(",", "")), m.group(2)
    assert smallest > 40 * KIB
    # The arena it names is one that compiles within exactly that budget, with the option it names.
    assert main(["compile", "zoo:resnet8", "--target", "cortex-m7", "--memory-budget", str(smallest),
                 "--patch-recompute-limit", limit]) == 0
    assert f"arena {smallest:,} bytes" in capsys.readouterr().out
    with pytest.raises(OpfuseError, match=f"smallest arena that would work is {smallest:,} bytes"):
        plan_model("zoo:resnet8", CompileOptions(target="cortex-m7", memory_budget_bytes=smallest - 1))


def test_a_fixed_recompute_limit_is_not_raised(capsys):
    assert main(["compile", "zoo:mobilenet_v1_025_96", "--target", "cortex-m7", "--memory-budget", "110K",
                 "--patch-recompute-limit", "0.3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "with --patch-recompute-limit 1" in err
    assert main(["compile", "zoo:resnet8", "--target", "cortex-m7", "--memory-budget", "100K", "--no-fuse"]) == 2
    assert "without fusion" in capsys.readouterr().err


@pytest.mark.skipif(not mcu.tools_available(), reason="Cortex-M7 tests need arm-none-eabi-gcc, newlib and "
                                                        "qemu-system-arm: run `make mcu-tools`")
def test_the_budgeted_plan_runs_on_the_m7_bit_for_bit(tmp_path, cache_dir):
    comp = plan_model("zoo:mobilenet_v1_025_96", CompileOptions(target="cortex-m7", memory_budget_bytes=110 * KIB))
    feeds = reference.random_inputs(comp.graph, 0)
    res = mcu.run_on_qemu(mcu.generate_mcu(comp.graph, comp.plan, comp.memory), feeds, tmp_path)
    assert res.arena_bytes <= 110 * KIB
    host = build(comp.graph, comp.plan, memory=comp.memory, cache_dir=cache_dir, options=PORTABLE).run(feeds)
    ref = reference.run(comp.original, feeds)
    for name, want in host.items():
        assert res.outputs[name].tobytes() == want.tobytes()
        np.testing.assert_allclose(res.outputs[name], ref[name], rtol=1e-4, atol=1e-6)


def test_over_the_sram_without_a_budget_is_noted_not_refused(capsys):
    """Without --memory-budget the SRAM is only checked: 224x224 MobileNet plans (the case study's closing
    note) and runs under QEMU, and the compile says it is over a 512 KB part."""
    assert main(["compile", "zoo:mobilenet_v1", "--target", "cortex-m7"]) == 0
    out = capsys.readouterr().out
    assert "is over the 524,288 bytes of the cortex-m7 SRAM" in out
    assert main(["compile", "zoo:mobilenet_v1", "--target", "cortex-m7", "--memory-budget", "512K"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "smallest arena that would work is" in err
