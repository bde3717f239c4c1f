"""The thread gates (``CodegenOptions.thread_gates``): a kernel with a product splits its loops only where it
is worth it as a whole (``parallel_min_flops`` or ``parallel_min_bytes``), and an inference wakes sleeping
workers only where its split kernels are worth it (``pool_wake_min_flops`` or ``pool_wake_min_bytes``); below
both it runs on one thread. The rest of the suite runs with the gates off (``tests/conftest.py``)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from opfuse.codegen.options import ONE_THREAD, THREAD_GATES_ENV, CodegenOptions
from opfuse.codegen.program import generate
from opfuse.ir.plan import FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.ops.registry import get_spec
from opfuse.runtime.toolchain import Toolchain

GATES = CodegenOptions(thread_gates=True)


def _graph():
    """A small 3x3 Conv + Relu (0.6 MFLOP, 20 KB), a 1 x 1024 x 1000 Gemm (2.0 MFLOP, 4 MB of weights), a
    128 x 768 x 768 MatMul (151 MFLOP) and a 1M-element Add (no product)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("gates")
    x = b.input("x", (1, 8, 16, 16))
    c = b.op("Relu", b.op("Conv", x, b.const("w", rng.standard_normal((16, 8, 3, 3)).astype(np.float32)),
                          pads=[1, 1, 1, 1]))
    v = b.input("v", (1, 1024))
    fc = b.op("Gemm", v, b.const("fw", rng.standard_normal((1024, 1000)).astype(np.float32)))
    m = b.op("MatMul", b.input("a", (128, 768)), b.const("mw", rng.standard_normal((768, 768)).astype(np.float32)))
    big = b.op("Add", b.input("p", (1024, 1024)), b.input("q", (1024, 1024)))
    return b.build(c, fc, m, big)


def _kernels(options: CodegenOptions) -> dict[str, object]:
    g = _graph()
    return {k.ops[0]: k for k in generate(g, FusionPlan.unfused(g), options=options).kernels}


def test_a_small_product_runs_on_one_thread_and_says_why():
    k = _kernels(GATES)
    conv = k["Conv"]
    assert conv.parallel == ()
    assert re.fullmatch(r"one thread \(\d+ FLOPs and \d+ bytes of operands and results, below parallel_min_flops "
                        r"2097152 and parallel_min_bytes 262144\)", conv.one_thread), conv.one_thread
    assert k["Relu"].one_thread == ""  # no product: its loops decide (parallel_min_work)
    ungated = _kernels(CodegenOptions(thread_gates=False))["Conv"]
    assert ungated.parallel and ungated.one_thread == ""


def test_a_product_of_many_flops_or_many_bytes_splits():
    k = _kernels(GATES)
    assert k["MatMul"].parallel and k["MatMul"].one_thread == ""  # 151 MFLOP
    assert k["Gemm"].parallel and k["Gemm"].one_thread == ""  # 2.0 MFLOP (below the gate) but 4 MB
    assert k["Add"].parallel  # 1M elements: parallel_min_work as before
    tight = _kernels(CodegenOptions(thread_gates=True, parallel_min_bytes=1 << 23))
    assert tight["Gemm"].parallel == () and "parallel_min_bytes 8388608" in tight["Gemm"].one_thread


def test_the_thresholds_are_inclusive():
    g = _graph()
    conv = next(n for n in g.nodes if n.op_type == "Conv")
    flops = get_spec("Conv").flops(conv)
    data = sum(v.nbytes for v in conv.input_values()) + conv.outputs[0].nbytes
    for knob, at in (("parallel_min_flops", flops), ("parallel_min_bytes", data)):
        on = _kernels(CodegenOptions(thread_gates=True, **{knob: at}))["Conv"]
        off = _kernels(CodegenOptions(thread_gates=True, **{knob: at + 1}))["Conv"]
        assert on.parallel and not off.parallel, knob


def test_a_build_that_never_splits_gives_no_reason():
    """The microcontroller's (``parallel_min_work`` ONE_THREAD): every kernel on one thread, none for these gates."""
    k = _kernels(CodegenOptions(thread_gates=True, parallel_min_work=ONE_THREAD))
    assert not any(x.parallel for x in k.values()) and all(x.one_thread == "" for x in k.values())


def program_sizes(program, g) -> tuple[int, int]:
    """The FLOPs and boundary bytes of the program's kernels that split, computed here from the graph."""
    split = {k.group for k in program.kernels if k.parallel}
    flops = data = 0
    for n in g.nodes:
        if n.name in split:  # unfused: one node a group, named after it
            flops += get_spec(n.op_type).flops(n)
            data += sum(v.nbytes for v in n.input_values()) + sum(v.nbytes for v in n.outputs)
    return flops, data


def _run_line(source: str) -> str:
    return next(ln for ln in source.splitlines() if "const int nt" in ln and "threads" in ln)


def test_an_inference_wakes_the_workers_only_for_enough_split_work():
    g = _graph()
    plan = FusionPlan.unfused(g)
    line = _run_line(generate(g, plan, options=GATES).source)
    assert "opfuse_pool_begin(threads, 1)" in line  # 151 MFLOP + the rest split: worth waking
    small = CodegenOptions(thread_gates=True, pool_wake_min_flops=1 << 40, pool_wake_min_bytes=1 << 40)
    assert "opfuse_pool_begin(threads, 0)" in _run_line(generate(g, plan, options=small).source)
    ungated = CodegenOptions(thread_gates=False, pool_wake_min_flops=1 << 40, pool_wake_min_bytes=1 << 40)
    assert "opfuse_pool_begin(threads, 1)" in _run_line(generate(g, plan, options=ungated).source)
    program = generate(g, plan, options=GATES)
    flops, data = program_sizes(program, g)
    for knobs, worth in (({"pool_wake_min_flops": flops, "pool_wake_min_bytes": data + 1}, 1),
                         ({"pool_wake_min_flops": flops + 1, "pool_wake_min_bytes": data}, 1),
                         ({"pool_wake_min_flops": flops + 1, "pool_wake_min_bytes": data + 1}, 0)):
        line = _run_line(generate(g, plan, options=CodegenOptions(thread_gates=True, **knobs)).source)
        assert f"opfuse_pool_begin(threads, {worth})" in line and f"{flops} FLOPs, {data} bytes" in line, knobs
    b = GraphBuilder("tiny")
    tiny = b.build(b.op("Relu", b.input("x", (4, 4))))
    assert _run_line(generate(tiny, FusionPlan.unfused(tiny), options=GATES).source).strip() == \
        "const int nt = threads > 0 ? threads : 1;"  # nothing splits: no pool


def test_the_environment_sets_the_default(monkeypatch):
    monkeypatch.setenv(THREAD_GATES_ENV, "0")
    assert CodegenOptions().thread_gates is False
    monkeypatch.setenv(THREAD_GATES_ENV, "1")
    assert CodegenOptions().thread_gates is True
    monkeypatch.delenv(THREAD_GATES_ENV)
    assert CodegenOptions().thread_gates is True


# A fresh interpreter per case: a pool's workers live as long as its library.
_PROBE = r"""
import json, os, sys, time
import numpy as np
from opfuse.codegen.options import CodegenOptions
from opfuse.ops import GraphBuilder
from opfuse.ops.registry import get_spec
from opfuse.runtime.native import build
from opfuse.runtime import reference

rng = np.random.default_rng(0)
b = GraphBuilder("probe")
a = b.input("a", (64, 256))
y = b.op("Relu", b.op("MatMul", a, b.const("w", rng.standard_normal((256, 256)).astype(np.float32))))
g = b.build(y)  # 8.4 MFLOP: the kernel splits, the inference is below pool_wake_min_flops
options = CodegenOptions(thread_gates=True, pool_wake_min_flops=int(sys.argv[1]))
model = build(g, None, options=options, threads=2)
feeds = reference.random_inputs(g, 0)
want = reference.run(g, feeds)
tasks = len(os.listdir("/proc/self/task"))
same = True
for _ in range(20):
    got = model.run(feeds)
    same = same and all(np.allclose(got[k], want[k], rtol=1e-4, atol=1e-4) for k in want)
    time.sleep(0.002)  # the workers (if any) go to sleep between runs
started = len(os.listdir("/proc/self/task")) - tasks
line = next(ln for ln in model.program.source.splitlines() if "const int nt" in ln)
print(json.dumps({"split": bool(model.program.kernels[0].parallel), "started": started, "same": same, "line": line}))
"""


@pytest.mark.skipif(not (Toolchain.detect().threads and os.path.exists("/proc/self/task")),
                    reason="needs a compiler that builds POSIX threads, and /proc")
@pytest.mark.parametrize("wake_min, started", [(1 << 26, 0), (0, 1)])
def test_a_model_not_worth_waking_the_workers_never_starts_them(wake_min, started):
    r = subprocess.run([sys.executable, "-c", _PROBE, str(wake_min)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, THREAD_GATES_ENV: "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["split"] and got["same"], got
    assert got["started"] == started, got  # the worker thread of the 2-thread pool, started by the first split loop


def test_the_report_and_opfuse_run_say_when_an_inference_may_run_on_one_thread(monkeypatch, capsys):
    from opfuse.cli import main
    monkeypatch.setenv(THREAD_GATES_ENV, "1")
    assert main(["run", "zoo:resnet8", "--backend", "c", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 threads, arena" in out and "finds the thread pool's workers asleep runs on one thread" in out
    assert main(["run", "zoo:resnet18", "--backend", "c", "--threads", "2"]) == 0  # 3.6 GFLOP split: woken
    assert "asleep" not in capsys.readouterr().out
    g = _graph()
    assert generate(g, FusionPlan.unfused(g), options=GATES).wakes_workers is True
    small = CodegenOptions(thread_gates=True, pool_wake_min_flops=1 << 40, pool_wake_min_bytes=1 << 40)
    assert generate(g, FusionPlan.unfused(g), options=small).wakes_workers is False
    b = GraphBuilder("tiny")
    tiny = b.build(b.op("Relu", b.input("x", (4, 4))))
    assert generate(tiny, FusionPlan.unfused(tiny), options=GATES).wakes_workers is None
