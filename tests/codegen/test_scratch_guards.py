"""``CodegenOptions.scratch_guard_bytes``: a guard after every scratch region a kernel reserves, filled before
the kernel runs and checked after it; ``arena_guard_bytes``: the same after every arena block a kernel writes.
A region sized too small for what its kernel writes spills into the next region, which that kernel fills later
or has done with: no output shows it (mutants of pool.py that shrink the padded plane or the dense output rows
survived every pool test so). With the guards it is the fault "stored outside its scratch regions or output
tensors"; without them the C is what it always was."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close
from opfuse.codegen import kernel as kernel_mod
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import build_native, plan_model
from opfuse.errors import InputError, OpfuseError
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

GUARDED = CodegenOptions(scratch_guard_bytes=64, arena_guard_bytes=64)


@pytest.mark.parametrize("model", ["resnet8", "ds_cnn", "mobilenet_v1_025_96", "yolo_block"])
def test_guards_change_no_output_and_none_trips(model):
    comp = plan_model(f"zoo:{model}")
    feeds = reference.random_inputs(comp.original, 0)
    for threads in (1, 2):
        plain = build_native(comp, threads=threads)
        guarded = build_native(comp, threads=threads, codegen_options=GUARDED)
        assert "opfuse_guard" not in plain.program.source
        assert guarded.program.source.count("opfuse_guard_fill(scratch") >= 3
        want, got = plain.run(feeds), guarded.run(feeds)
        for k in want:
            assert np.array_equal(want[k], got[k], equal_nan=True), (model, threads, k)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_region_smaller_than_its_kernel_writes_is_caught(monkeypatch, threads):
    """Every region reserved 64 bytes short of what its kernel was sized for: the unguarded build may still
    give the right outputs; the guarded one names the first kernel that wrote past a region."""
    reserve = kernel_mod.KernelContext.scratch
    monkeypatch.setattr(kernel_mod.KernelContext, "scratch", lambda self, n: reserve(self, max(n - 64, 0)))
    comp = plan_model("zoo:resnet8")
    feeds = reference.random_inputs(comp.original, 0)
    with pytest.raises(OpfuseError, match=r"kernel '\w+' \(group '\w+'\) stored outside its scratch regions") as caught:
        build_native(comp, threads=threads, codegen_options=GUARDED).run(feeds)
    assert not isinstance(caught.value, InputError)  # a code generator's bug, not the inputs'


# 2-D float pools through the row kernels (``pool._lower_rows``): windows that skip the last input rows or
# columns (stride past the kernel), overhanging ones (ceil_mode: one more output row and column than floor
# gives in the last two), asymmetric padding, dilation.
POOLS = [
    ("MaxPool", (1, 2, 6, 7), dict(kernel_shape=[2, 2], strides=[3, 3], pads=[0, 0, 1, 1])),
    ("MaxPool", (1, 2, 9, 8), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 2, 1], ceil_mode=1)),
    ("MaxPool", (2, 3, 11, 10), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 2, 2, 0])),
    ("MaxPool", (1, 2, 10, 9), dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[2, 2], pads=[1, 1, 0, 2])),
    ("MaxPool", (1, 1, 7, 40), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("MaxPool", (1, 2, 7, 7), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),  # 4 x 4, not 3 x 3
    ("AveragePool", (1, 2, 6, 7), dict(kernel_shape=[2, 2], strides=[3, 3], pads=[0, 0, 1, 1])),
    ("AveragePool", (1, 2, 9, 8), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 2, 1], ceil_mode=1)),
    ("AveragePool", (2, 3, 11, 10), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 2, 2, 0],
                                         count_include_pad=1)),
    ("AveragePool", (1, 1, 13, 37), dict(kernel_shape=[4, 3], strides=[3, 1], pads=[2, 1, 0, 1])),
    ("AveragePool", (1, 2, 8, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
]


@pytest.mark.parametrize("simd", ["auto", "none"])
@pytest.mark.parametrize("threads", [1, 2])
def test_pools_stay_inside_their_scratch(cache_dir, simd, threads):
    b = GraphBuilder("pools")
    outs = []
    for i, (op, shape, attrs) in enumerate(POOLS):
        x = b.input(f"x{i}", shape)
        outs.append(b.op(op, b.op("Relu", x, name=f"relu{i}"), name=f"pool{i}", **attrs))
    g = b.build(*outs)
    feeds = reference.random_inputs(g, 3)
    options = CodegenOptions(scratch_guard_bytes=64, arena_guard_bytes=64, simd=simd, parallel_min_work=0)
    model = build(g, None, cache_dir=cache_dir, options=options, threads=threads)
    assert model.program.source.count("opfuse_guard_fill(scratch") >= len(POOLS)
    assert_close(model.run(feeds), reference.run(g, feeds))


@pytest.mark.parametrize("kw,message", [(dict(scratch_guard_bytes=-64), "non-negative multiple of 64"),
                                        (dict(scratch_guard_bytes=32), "non-negative multiple of 64"),
                                        (dict(scratch_guard_bytes=64, platform="mcu"), "host builds")])
def test_guard_options_are_checked(kw, message):
    with pytest.raises(OpfuseError, match=message):
        CodegenOptions(**kw)


@pytest.mark.parametrize("model", ["resnet8", "mobilenet_v1_025_96", "yolo_block"])
def test_each_arena_guard_is_its_blocks_alone_while_the_kernel_runs(model):
    """A guard sits right after a block the kernel writes and inside no block live at that kernel (the plan
    placed every block as if 64 bytes longer), so filling it loses nothing and a store there is out of bounds."""
    from opfuse.codegen import program
    from opfuse.memory import plan_memory
    comp = plan_model(f"zoo:{model}")
    memory = plan_memory(comp.plan, guard_bytes=64)
    options = GUARDED.resolved(program.host_simd_isa(), program.host_full_width_fma())
    builder = program.ProgramBuilder(comp.graph, comp.plan, memory, options)
    seen = 0
    for t, group in enumerate(comp.plan.groups):
        before = len(builder.kernels)
        builder.kernel(t, group)
        if len(builder.kernels) == before:
            continue
        guards = builder.last_arena_guards
        seen += len(guards)
        live = [(off, size) for off, size, start, end in memory.blocks.values() if start <= t <= end]
        ends = {off + size for off, size in live}
        for g0, n in guards:
            assert n == 64 and g0 in ends
            assert not any(off < g0 + n and g0 < off + size for off, size in live), (group.name, g0)
    assert seen >= len(comp.plan.groups) // 2
    assert memory.arena_bytes >= comp.memory.arena_bytes


@pytest.mark.parametrize("threads", [1, 2])
def test_a_store_past_a_tensor_is_caught(monkeypatch, threads):
    """Every arena guard moved 64 bytes back, onto the last bytes of the tensor the kernel writes: the run
    fails naming the first kernel, where the same build without guards is right."""
    from opfuse.codegen.program import ProgramBuilder
    arena_guards = ProgramBuilder._arena_guards
    monkeypatch.setattr(ProgramBuilder, "_arena_guards",
                        lambda self, kc, index: [(off - 64, n) for off, n in arena_guards(self, kc, index)])
    comp = plan_model("zoo:resnet8")
    feeds = reference.random_inputs(comp.original, 0)
    with pytest.raises(OpfuseError, match=r"kernel '\w+' \(group '\w+'\) stored outside its scratch regions or "
                                          r"output tensors"):
        build_native(comp, threads=threads, codegen_options=CodegenOptions(arena_guard_bytes=64)).run(feeds)
