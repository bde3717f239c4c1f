"""``KernelContext`` on its own (no compiler): the OpenMP schedule chosen per loop and its threshold, scratch
regions laid out one after another, read-only parameters declared ``const``, fault flags reduced by every
parallel loop and returned in node order, and the notes of the report and of the C comment."""
from __future__ import annotations

import numpy as np

from opfuse.codegen.kernel import SCRATCH_ALIGN, KernelContext
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.outline import parallel_loops
from opfuse.codegen.program import ProgramBuilder
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.memory import plan_memory
from opfuse.ops import GraphBuilder

MIN_WORK = CodegenOptions().parallel_dynamic_min_work


def _context(**options) -> tuple[KernelContext, object]:
    """A context for the one group of ``Relu(x) -> Neg`` (x: 4 x 8 float32), and the graph."""
    b = GraphBuilder("kc")
    x = b.input("x", (4, 8))
    g = b.build(b.op("Neg", b.op("Relu", x, name="relu"), name="neg"))
    plan = FusionPlan(g, [FusionGroup("relu_neg", list(g.nodes), "elementwise", None)])
    builder = ProgramBuilder(g, plan, plan_memory(plan), CodegenOptions(**options))
    return KernelContext(builder, plan.groups[0], 0), g


def _loop(kc: KernelContext, work: int, iterations: int) -> None:
    kc.parallel_for(work)
    with kc.w.block(f"for (long i = 0; i < {iterations}; ++i)"):
        kc.w.line(";")


def test_iterations_worth_the_threshold_each_go_one_at_a_time():
    kc, _ = _context(parallel_min_work=1)
    _loop(kc, 4 * MIN_WORK, 4)          # each iteration exactly the threshold: dynamic
    _loop(kc, 4 * MIN_WORK - 4, 4)      # each just below it: static chunks
    text = kc.function_text("c")
    assert [(p.iterations, p.work, p.schedule) for p in kc.loops] == [
        (4, 4 * MIN_WORK, "dynamic"), (4, 4 * MIN_WORK - 4, "static")]
    assert text.count("schedule(dynamic, 1)") == 1 and text.count("schedule(static)") == 1


def test_a_loop_below_parallel_min_work_stays_on_one_thread():
    kc, _ = _context(parallel_min_work=100)
    _loop(kc, 99, 4)
    text = kc.function_text("c")
    assert "opfuse_parallel" not in text and kc.loops == [] and not kc.uses_threads


def test_scratch_regions_follow_each_other_at_cache_line_boundaries():
    kc, _ = _context()
    assert kc.scratch(10) == 0
    assert kc.scratch(SCRATCH_ALIGN + 1) == SCRATCH_ALIGN
    assert kc.scratch(1) == 3 * SCRATCH_ALIGN
    assert kc.scratch_bytes == 4 * SCRATCH_ALIGN


def test_read_pointers_are_const_and_written_ones_are_not():
    kc, g = _context()
    x, y = g.inputs[0], g.outputs[0]
    src, dst = kc.ptr(x), kc.ptr(y, write=True)
    assert kc.ptr(x) == src  # one parameter per storage location
    sig = kc.signature()
    assert f"const float* restrict {src}" in sig
    assert f"float* restrict {dst}" in sig and f"const float* restrict {dst}" not in sig
    assert sig.endswith("char* restrict scratch, int nt)") and sig.startswith("OPFUSE_KERNEL static void ")


def test_folded_values_are_weights_pointers_each_to_its_own_data():
    kc, g = _context()
    x, y = g.inputs[0], g.outputs[0]
    kc.program.memory.static[id(x)] = np.arange(32, dtype=np.float32).reshape(4, 8)
    kc.program.memory.static[id(y)] = -np.arange(32, dtype=np.float32).reshape(4, 8)
    px, py = kc.ptr(x), kc.ptr(y)
    assert px != py and kc.ptr(x) == px
    blob = kc.program.weights.tobytes()
    for p, want in ((px, np.arange(32)), (py, -np.arange(32))):
        (param,) = [q for q in kc.params.values() if q.name == p]
        region, _, offset = param.expr_key
        assert region == "weights" and not param.writable
        assert np.array_equal(np.frombuffer(blob, np.float32, 32, offset), want)


def test_fault_flags_are_reduced_by_the_parallel_loops_that_set_them_and_returned_in_node_order():
    kc, g = _context(parallel_min_work=1)
    relu, neg = g.nodes
    f_neg = kc.fault(neg, "neg failed")
    f_relu = kc.fault(relu, "relu failed")
    assert kc.fault(neg, "neg failed") == f_neg  # one flag per node
    for flags in ([f_neg], [f_relu, f_neg]):
        kc.parallel_for(10)
        with kc.w.block("for (long i = 0; i < 4; ++i)"):
            kc.w.line(" ".join(f"{f} |= i > 2;" for f in flags))
    text = kc.function_text("c")
    # each loop ORs the flags it sets into its kernel's (outline.py)
    assert [lp.reduces for lp in parallel_loops(text)] == [(f_neg,), (f_relu, f_neg)]  # flags in node order
    assert text.count(f"{f_neg} |= c") == 2 and text.count(f"{f_relu} |= c") == 1
    codes = {m: kc.program.fault_code(m) for m in ("neg failed", "relu failed")}
    assert text.index(f"if ({f_relu}) return {codes['relu failed']};") \
        < text.index(f"if ({f_neg}) return {codes['neg failed']};") < text.index("return 0;")
    assert kc.signature().startswith("OPFUSE_KERNEL static int ")


def test_notes_name_the_node_in_the_report_and_its_c_identifier_in_the_comment():
    kc, g = _context()
    node = g.nodes[0]
    node.name = "a*/b"
    kc.note(lambda name: f"'{name}': direct", node)
    assert kc.notes == ["'a*/b': direct"]
    text = kc.function_text("group c")
    comment = text[:text.index("*/")]
    assert comment.startswith("/* group c\n * '") and ": direct" in comment and "a*/b" not in text


def test_a_table_declared_with_braces_is_shared_with_the_parallel_loop_after_it():
    """The outliner followed every brace, an initializer's too: after ``static const float a[2] = {...};`` it
    opened a scope the next table went into and closed it with that table's own braces, so a loop reading
    both had only the first in its context ('ccount5' undeclared: an AveragePool with padding, parallel)."""
    from opfuse.codegen.outline import Outliner
    lines = ["static const float rc1[2] = {0x1p+1f, 0x1p+2f};",
             "static const float cc2[3] = {0x1p+1f, 0x1.8p+1f, 0x1p+1f};",
             "const long n3 = 3;",
             "OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) if(nt > 1))",
             "for (long i = 0; i < 2; ++i) {",
             "  for (long j = 0; j < n3; ++j) out[i * 3 + j] = rc1[i] * cc2[j];",
             "}"]
    outliner = Outliner("k0", [("float* restrict", "out")], [])
    kernel = "\n".join(outliner.run(lines))
    function = "\n".join(outliner.functions)
    for name in ("rc1", "cc2"):
        assert f"const float* const {name} = c_->{name};" in function, function
    assert "const long n3 = 3;" in function and "opfuse_parallel(" in kernel


def test_scratch_guards_follow_each_region_from_its_exact_end():
    kc, _ = _context(scratch_guard_bytes=64)
    first, second = kc.scratch(100), kc.scratch(SCRATCH_ALIGN)
    assert kc.scratch_guards == [(0, 64), (first + 100, 2 * SCRATCH_ALIGN - 100 + 64), (second + SCRATCH_ALIGN, 64)]
    assert first == 64 and second % SCRATCH_ALIGN == 0 and kc.scratch_bytes == second + SCRATCH_ALIGN + 64
    plain, _ = _context()
    assert plain.scratch(100) == 0 and plain.scratch_guards == []
