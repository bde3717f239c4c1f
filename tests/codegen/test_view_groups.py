"""A group whose output the memory plan makes a view of its input (a lone Reshape, Flatten, Squeeze or Unsqueeze:
``memory.plan`` "view" aliases) emits no kernel: its bytes already are where the output lives. Before this test
nothing checked it (issue 13, mutation testing: loops ``is_view_store`` 5-7 made such a group copy its input onto
itself, through two ``restrict`` pointers to the same bytes, and every test still passed)."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import generate
from opfuse.codegen.options import PORTABLE, CodegenOptions
from opfuse.ops import GraphBuilder


def _graph(view: str):
    b = GraphBuilder(f"view_{view.lower()}")
    x = b.input("x", (2, 3, 4))
    r = b.op("Relu", x, name="relu")
    if view == "Reshape":
        v = b.op("Reshape", r, b.const("shape", np.array([6, 4], np.int64)), name="view")
    elif view == "Flatten":
        v = b.op("Flatten", r, axis=1, name="view")
    else:
        v = b.op("Unsqueeze", r, axes=[0], name="view")
    return b.build(b.op("Sigmoid", v, name="sig"))


@pytest.mark.parametrize("options", [PORTABLE, CodegenOptions()], ids=["portable", "default"])
@pytest.mark.parametrize("view", ["Reshape", "Flatten", "Unsqueeze"])
def test_a_view_group_emits_no_kernel(view, options, cache_dir):
    g = _graph(view)
    plan = group_by_names(g, [])
    prog = generate(g, plan, options=options)
    views = [a for a in prog.memory.aliases if a.kind == "view"]
    assert [a.value for a in views] == ["view"], "the lone relabel's output is a view of its input"
    functions = {k.group: k.function for k in prog.kernels}
    assert functions["view"] is None, "no kernel copies a view's bytes onto themselves"
    assert functions["relu"] and functions["sig"] and prog.num_functions == 2
    got, want, model = run_both(g, plan, cache_dir, options=options)
    assert_close(got, want)
