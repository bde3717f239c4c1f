"""Test support: hand-built fusion plans (stand-ins for the fusion passes) and comparisons.

``epilogue_plan`` grows each group from an anchor (or any first op) along single-use
elementwise consumers: Conv -> BN -> Relu, MatMul -> Add -> GELU chain, Conv -> Add
(residual) -> Relu. ``group_by_names`` builds a plan from explicit node-name lists.
"""
from __future__ import annotations

import numpy as np

from opfuse.codegen.options import WINDOWS_MR_MAX_FULL_WIDTH
from opfuse.ir.graph import Graph, Node
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops.registry import Category, get_spec

POINTWISE = (Category.ELEMWISE, Category.BROADCAST)
# ``CodegenOptions`` fields that generate the C an AVX-512 host with full-width FMA pipes (Zen 5) gets from
# "host", whatever CPU runs the test: the AVX-512 register blocks and their structure (notes, blocks, tiles).
# The C keeps its AVX2 and plain bodies behind the target's macros, so it builds and runs on any x86 host.
WIDE_HOST = dict(vector_isa="avx512", winograd_avx512=True, depthwise_avx512=True,
                 windows_mr_max=WINDOWS_MR_MAX_FULL_WIDTH)
ANCHOR_KINDS = {"Conv": "conv_epilogue", "MatMul": "gemm_epilogue", "Gemm": "gemm_epilogue",
                "Softmax": "reduction", "ReduceMean": "reduction", "MaxPool": "reduction",
                "AveragePool": "reduction", "GlobalAveragePool": "reduction",
                "LayerNormalization": "reduction"}


def _pointwise(n: Node) -> bool:
    return get_spec(n.op_type).category in POINTWISE and n.op_type != "Expand"


def epilogue_plan(graph: Graph) -> FusionPlan:
    groups: list[FusionGroup] = []
    assigned: set[int] = set()
    outs = {id(v) for v in graph.outputs}
    for n in graph.nodes:
        if id(n) in assigned:
            continue
        members = [n]
        assigned.add(id(n))
        cur = n
        while len(cur.outputs) == 1 and id(cur.outputs[0]) not in outs:
            users = cur.outputs[0].consumers
            if len(users) != 1:
                break
            u = users[0]
            if id(u) in assigned or not _pointwise(u) or u.outputs[0].shape != cur.outputs[0].shape:
                break
            if any(w.producer is not None and id(w.producer) not in assigned
                   for w in u.input_values() if w is not cur.outputs[0]):
                break
            members.append(u)
            assigned.add(id(u))
            cur = u
        if len(members) == 1:
            kind = "single"
        elif n.op_type in ANCHOR_KINDS:
            kind = ANCHOR_KINDS[n.op_type]
        else:
            kind = "elementwise" if all(_pointwise(m) for m in members) else "injective"
        groups.append(FusionGroup(n.name, members, kind, n if n.op_type in ANCHOR_KINDS else None))
    plan = FusionPlan(graph, groups)
    plan.verify()
    return plan


def group_by_names(graph: Graph, spec: list[tuple[str, list[str]]]) -> FusionPlan:
    """``spec``: ``(kind, [node names])`` per fused group; every other node is its own group.
    Groups are ordered by their first node's position."""
    by_name = {n.name: n for n in graph.nodes}
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    taken: set[int] = set()
    groups = []
    for kind, names in spec:
        nodes = sorted((by_name[x] for x in names), key=lambda n: pos[id(n)])
        taken.update(id(n) for n in nodes)
        anchor = next((n for n in nodes if n.op_type in ANCHOR_KINDS), None)
        groups.append(FusionGroup("+".join(names[:1]) + f"_{kind}", nodes, kind, anchor))
    for n in graph.nodes:
        if id(n) not in taken:
            groups.append(FusionGroup(n.name, [n], "single", n))
    # Order groups so every producer group precedes its consumers (stable on first node).
    groups.sort(key=lambda g: pos[id(g.nodes[0])])
    placed: list[FusionGroup] = []
    done: set[int] = set()
    pending = list(groups)
    while pending:
        for g in pending:
            ids = {id(n) for n in g.nodes}
            if all(v.producer is None or id(v.producer) in ids or id(v.producer) in done
                   for n in g.nodes for v in n.input_values()):
                placed.append(g)
                done.update(ids)
                pending.remove(g)
                break
        else:
            raise ValueError("group spec makes a cycle")
    plan = FusionPlan(graph, placed)
    plan.verify()
    return plan


# Comparison against the reference executor ------------------------------------------------
RTOL, ATOL = 1e-4, 1e-5


def pointwise_relu(c: int, oc: int, hw: int, rng: np.random.Generator, name: str = "pointwise", batch: int = 1,
                   width: int | None = None):
    """(graph, plan): a 1x1 convolution ``c -> oc`` at ``hw x hw`` (``hw x width`` with ``width``) with a bias, then a
    Relu, fused in one group, on ``batch`` images."""
    from opfuse.ops import GraphBuilder
    b = GraphBuilder(name)
    x = b.input("x", (batch, c, hw, hw if width is None else width))
    w = b.const("w", (rng.standard_normal((oc, c, 1, 1)) / np.sqrt(c)).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(oc).astype(np.float32))
    y = b.op("Conv", x, w, bias, kernel_shape=[1, 1], name="conv")
    g = b.build(b.op("Relu", y, name="relu"))
    return g, group_by_names(g, [("conv_epilogue", ["conv", "relu"])])


def assert_threshold_inclusive(notes, graph: Graph, plan, option: str, size: int) -> None:
    """A size threshold option (``option``, bytes) takes effect at ``size`` itself and not at ``size + 1``: the
    kernel notes ``notes(program)`` name it in the first build only."""
    from opfuse.codegen import CodegenOptions
    from opfuse.codegen.program import generate
    assert notes(generate(graph, plan, options=CodegenOptions(**{option: size})))
    assert not notes(generate(graph, plan, options=CodegenOptions(**{option: size + 1})))


def assert_close(got: dict, want: dict, rtol: float = RTOL, atol: float = ATOL) -> None:
    import numpy as np
    assert sorted(got) == sorted(want)
    for name in want:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
        if not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
            err = np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))
            raise AssertionError(f"output '{name}' differs from the reference: max abs error {err:.3g}")


def run_both(graph: Graph, plan, cache_dir, seed: int = 0, **build_kw):
    """(native outputs, reference outputs, compiled model) for seeded random inputs."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    feeds = reference.random_inputs(graph, seed)
    model = build(graph, plan, cache_dir=cache_dir, **build_kw)
    return model.run(feeds), reference.run(graph, feeds), model


# The zoo BERT layer, fused the way the fusion passes are meant to (QKV one pass, attention
# one kernel, GEMMs with epilogues, LayerNorm statistics with prologue/epilogue).
BERT_SPEC = [
    ("horizontal", ["query_matmul", "query_add", "key_matmul", "key_add", "value_matmul", "value_add"]),
    ("attention", ["query_reshape", "query_transpose", "key_reshape", "key_transpose", "value_reshape",
                   "value_transpose", "scores", "scores_scale", "attention_probs", "context", "context_transpose",
                   "context_reshape"]),
    ("gemm_epilogue", ["attention_output_matmul", "attention_output_add", "attention_residual"]),
    ("reduction", ["attention_ln_sub", "attention_ln_pow", "attention_ln_var", "attention_ln_add_eps",
                   "attention_ln_sqrt"]),
    ("elementwise", ["attention_ln_div", "attention_ln_scale", "attention_ln_shift"]),
    ("gemm_epilogue", ["intermediate_matmul", "intermediate_add", "gelu_div", "gelu_erf", "gelu_add", "gelu_mul",
                       "gelu_mul_half"]),
    ("gemm_epilogue", ["output_dense_matmul", "output_dense_add", "output_residual"]),
    ("reduction", ["output_ln_sub", "output_ln_pow", "output_ln_var", "output_ln_add_eps", "output_ln_sqrt"]),
    ("elementwise", ["output_ln_div", "output_ln_scale", "output_ln_shift"]),
]


def fused_plan(name: str, graph: Graph) -> FusionPlan:
    """The hand-built fused plan of a zoo model."""
    if name == "bert_layer":
        return group_by_names(graph, BERT_SPEC)
    return epilogue_plan(graph)


def assert_relu_keeps_nan_and_negative_zero(graph: Graph, plan, x, cache_dir, option_sets, flag: str) -> None:
    """Build ``graph`` with each of ``option_sets`` and ``flag`` on and off, run it on ``x`` (NaN in column 0,
    -0 in column 1 of the first row): max(0, y) must return y where y is NaN or -0 in every build, as the C
    epilogue does: the first build's column 0 is NaN and every build has the first's bits, signs included."""
    import numpy as np

    from opfuse.runtime.native import build
    outs = [build(graph, plan, cache_dir=cache_dir, options=o.with_(**{flag: e})).run({"x": x})
            for o in option_sets for e in (True, False)]
    first = list(outs[0].values())[0]
    assert np.isnan(first[0, :, 0, 0]).all()
    for o in outs[1:]:
        v = list(o.values())[0]
        assert np.array_equal(np.signbit(v), np.signbit(first)) and np.array_equal(v, first, equal_nan=True)


def bit_sweep(stride: int) -> np.ndarray:
    """Float32 bit patterns 0, stride, 2 stride, ... below 2^31, and each with the sign bit set."""
    bits = np.arange(0, 1 << 31, stride, dtype=np.uint32)
    return np.concatenate([bits, bits | np.uint32(1 << 31)]).view(np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """The same float32 bits element by element, any NaN equal to any NaN."""
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


def assert_plain_storing_kernel(graph: Graph, plan, feeds: dict, marker: str, off: dict, cache_dir) -> None:
    """The plain C99 build (``simd="none"``) generates the storing micro-kernel ``marker`` (e.g. ``"stba("``) and
    gives the bits of the same build with the options ``off`` (the C tile's epilogue), within tolerance of the
    reference."""
    from opfuse.codegen import CodegenOptions, generate
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    plain = CodegenOptions(simd="none")
    assert marker in generate(graph, plan, options=plain).source
    want = build(graph, plan, cache_dir=cache_dir, options=CodegenOptions(simd="none", **off)).run(feeds)
    got = build(graph, plan, cache_dir=cache_dir, options=plain).run(feeds)
    assert all(same_bits(got[k], want[k]) for k in want)
    assert_close(got, reference.run(graph, feeds))
