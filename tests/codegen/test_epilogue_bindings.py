"""``codegen/epilogue.finish_element``'s contract: it binds the anchor's result (and every relabelled view of it: a
Reshape, Flatten, Identity or Dropout in the epilogue) for one output element, stores the stage's outputs, and leaves
nothing bound behind. A binding that outlived its element would make a later read of that value in the same stage
return a C temporary of another element (or another C scope) instead of computing it (issue 13, mutation testing:
epilogue ``finish_element`` 54 and 94 left the relabelled views bound and no test saw it).

Each case lowers a group whose epilogue holds a relabel op, on the scalar (portable) path and on the default one,
checks after every stage that the stage bound the relabelled value and left no binding, and compares the results
with the reference."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import generate, lowering
from opfuse.codegen.evaluator import Evaluator
from opfuse.codegen.options import PORTABLE
from opfuse.ops import GraphBuilder


def _conv_reshape():
    rng = np.random.default_rng(5)
    b = GraphBuilder("conv_reshape")
    x = b.input("x", (1, 4, 6, 6))
    w = b.const("w", rng.standard_normal((8, 4, 3, 3)).astype(np.float32))
    y = b.op("Conv", x, w, pads=[1, 1, 1, 1], name="conv")
    y = b.op("Relu", y, name="act")
    y = b.op("Reshape", y, b.const("shape", np.array([1, 8, 36], np.int64)), name="view")
    g = b.build(b.op("Sigmoid", y, name="sig"))
    return g, [("conv_epilogue", ["conv", "act", "view", "sig"])], "view"


def _matmul_flatten():
    rng = np.random.default_rng(6)
    b = GraphBuilder("matmul_flatten")
    x = b.input("x", (4, 16))
    w = b.const("w", rng.standard_normal((16, 8)).astype(np.float32))
    y = b.op("MatMul", x, w, name="mm")
    y = b.op("Add", y, b.const("bias", rng.standard_normal(8).astype(np.float32)), name="bias_add")
    y = b.op("Flatten", y, axis=0, name="view")
    g = b.build(b.op("Relu", y, name="act"))
    return g, [("gemm_epilogue", ["mm", "bias_add", "view", "act"])], "view"


def _pool_identity():
    b = GraphBuilder("pool_identity")
    x = b.input("x", (1, 3, 8, 8))
    y = b.op("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2], name="pool")
    y = b.op("Identity", y, name="view")
    g = b.build(b.op("Neg", y, name="neg"))
    return g, [("pool_epilogue", ["pool", "view", "neg"])], "view"


CASES = {"conv-reshape": _conv_reshape, "matmul-flatten": _matmul_flatten, "pool-identity": _pool_identity}
OPTIONS = {"portable": PORTABLE, "default": None}


@pytest.mark.parametrize("opts", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_finish_element_leaves_no_binding_behind(case, opts, monkeypatch, cache_dir):
    g, spec, view = CASES[case]()
    plan = group_by_names(g, spec)
    bound_names: list[str] = []
    left: list[list[str]] = []
    real_bind, real_lower = Evaluator.bind, lowering.lower_stage

    def bind(self, v, idx, expr):
        bound_names.append(v.name)
        return real_bind(self, v, idx, expr)

    def lower_stage(kc, ev, stage, analysis):
        real_lower(kc, ev, stage, analysis)
        left.append(sorted(ev._bound))  # ids of the values still bound once the stage is lowered

    monkeypatch.setattr(Evaluator, "bind", bind)
    monkeypatch.setattr(lowering, "lower_stage", lower_stage)
    options = OPTIONS[opts]
    generate(g, plan, **({} if options is None else {"options": options}))
    view_out = next(n for n in g.nodes if n.name == view).outputs[0].name
    assert view_out in bound_names, "the relabel op's output is bound by finish_element (the path under test)"
    assert left and all(not ids for ids in left), f"values left bound after their stage: {left}"
    monkeypatch.undo()
    got, want, model = run_both(g, plan, cache_dir, **({} if options is None else {"options": options}))
    assert_close(got, want)
    assert model.report["kernels"] == 1
