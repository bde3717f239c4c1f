"""Narrow-float Casts are priced (``cost.analysis.narrow_cast_ops``): the planner sees the conversions
that ``rewrites.float32_compute`` puts around every float16/bfloat16 op; float32 Casts stay free."""
import numpy as np

from opfuse.cost import CostModel, analyze_group
from opfuse.cost.analysis import NARROW_CAST_HW_OPS, NARROW_CAST_OPS
from opfuse.ir.dtypes import BFLOAT16
from opfuse.ops import GraphBuilder
from opfuse.rewrites import RewriteContext
from opfuse.rewrites.edit import Provenance
from opfuse.rewrites.float32_compute import compute_in_float32
from opfuse.rules.options import FusionOptions

from test_roofline import toy_profile

N = 4 * 256


def _chain(dt, conv: bool = False):
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 16, 16), dt)
    if conv:
        x = b.op("Conv", x, b.const("w", np.ones((4, 4, 1, 1), np.float32).astype(dt)))
    g = b.build(b.op("Relu", b.op("Mul", x, x)))
    compute_in_float32(g, RewriteContext(FusionOptions(), Provenance(g)))
    return g


def test_float16_casts_cost_f16c_in_pointwise_groups_and_the_helpers_with_an_anchor():
    g = _chain(np.float16)
    casts = [n for n in g.nodes if n.op_type == "Cast"]
    a = analyze_group(g, g.nodes)
    plain = analyze_group(_chain(np.float32), _chain(np.float32).nodes)
    # x widened, Mul rounded back (Relu of a float16 value is one: no pair around it), output rounded
    assert a.base_flops - plain.base_flops == NARROW_CAST_HW_OPS * N * len(casts)
    c = _chain(np.float16, conv=True)
    group = c.nodes[1:]  # the Conv and its epilogue; x's widening is a kernel of its own
    assert c.nodes[0].op_type == "Cast" and group[0].op_type == "Conv"
    conv_casts = [n for n in group if n.op_type == "Cast"]
    anchored = analyze_group(c, group)
    conv_plain = analyze_group(_chain(np.float32, conv=True), _chain(np.float32, conv=True).nodes)
    widen, rnd = NARROW_CAST_OPS["widen_float16"], NARROW_CAST_OPS["round_float16"]
    n_widen = sum(1 for n in conv_casts if n.outputs[0].dtype == np.float32)
    n_round = len(conv_casts) - n_widen
    assert anchored.flops - conv_plain.flops == N * (n_widen * widen + n_round * rnd)
    assert anchored.duplicated_flops == conv_plain.duplicated_flops == 0
    # an anchor's epilogue conversions are priced at the scalar rate; a pointwise group's are not
    assert anchored.scalar_flops == N * (n_widen * widen + n_round * rnd) and a.scalar_flops == 0
    f32 = _chain(np.float32, conv=True)
    assert CostModel(toy_profile()).group_cost(c, group).t_compute > \
        CostModel(toy_profile()).group_cost(f32, f32.nodes).t_compute


def test_bfloat16_casts_are_priced_and_float32_casts_are_free():
    g = _chain(BFLOAT16)
    casts = [n for n in g.nodes if n.op_type == "Cast"]
    widen = sum(1 for n in casts if n.outputs[0].dtype == np.float32)
    a = analyze_group(g, g.nodes)
    plain = analyze_group(_chain(np.float32), _chain(np.float32).nodes)
    assert a.flops - plain.flops == N * (widen * NARROW_CAST_OPS["widen_bfloat16"]
                                         + (len(casts) - widen) * NARROW_CAST_OPS["round_bfloat16"])
    b = GraphBuilder("f")
    f = b.build(b.op("Cast", b.op("Cast", b.input("x", (N,)), to=6), to=1))  # float32 -> int32 -> float32
    assert analyze_group(f, f.nodes).flops == 0
