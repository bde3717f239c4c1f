"""A ConvTranspose with one tap per output pixel becomes a 1x1 Conv and a DepthToSpace."""
import numpy as np
import pytest

import opfuse
from opfuse.ops import GraphBuilder
from opfuse.runtime.reference import random_inputs, run
from rewrite_cases import applied, assert_same_outputs, ops, randn, refusals, rewritten

RULE = "conv_transpose_as_conv"


def up(k=2, stride=None, bias=True, group=1, c=6, m=4, hw=(5, 7), **attrs):
    b = GraphBuilder("up")
    x = b.input("x", (2, c, *hw))
    w = b.const("w", randn((c, m // group, k, k), 1))
    inputs = [x, w] + ([b.const("bias", randn(m, 2))] if bias else [])
    s = stride or k
    y = b.op("ConvTranspose", *inputs, name="up", kernel_shape=[k, k], strides=[s, s], group=group, **attrs)
    return b.build(b.op("Relu", y, name="relu"))


@pytest.mark.parametrize("k, bias", [(2, True), (2, False), (3, True)])
def test_non_overlapping_conv_transpose_becomes_conv_and_depth_to_space(k, bias):
    g0, g1, res = rewritten(up(k=k, bias=bias))
    assert "ConvTranspose" not in ops(g1) and ops(g1).count("Conv") == 1 and ops(g1).count("DepthToSpace") == 1
    conv = next(n for n in g1.nodes if n.op_type == "Conv")
    assert conv.inputs[1].shape == (4 * k * k, 6, 1, 1)
    assert res.provenance.of(conv.name) == ["up"]
    assert applied(res, RULE) == 1
    assert_same_outputs(g0, g1)


def test_the_rewritten_model_matches_the_reference_in_c():
    g = up(k=2)
    feeds = random_inputs(g, 0)
    ref = run(g, feeds)
    for fuse in (True, False):
        out = opfuse.compile(g, fuse=fuse).run(feeds)
        for a, b in zip(out.values(), ref.values(), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, reason", [
    ({"k": 3, "stride": 2}, "not one square tap per output pixel"),
    ({"k": 2, "pads": [1, 1, 1, 1]}, "not one square tap per output pixel"),
    ({"k": 2, "output_padding": [1, 1]}, "not one square tap per output pixel"),
    ({"k": 2, "group": 2}, "group=2"),
])
def test_overlapping_or_grouped_conv_transpose_is_left_alone(kwargs, reason):
    g0, g1, res = rewritten(up(**kwargs))
    assert "ConvTranspose" in ops(g1)
    assert any(reason in r for r in refusals(res, RULE))
    assert_same_outputs(g0, g1)


def test_refused_for_a_weight_computed_at_run_time():
    b = GraphBuilder("up_dyn")
    x, w = b.input("x", (1, 3, 4, 4)), b.input("w", (3, 2, 2, 2))
    g0, g1, res = rewritten(b.build(b.op("ConvTranspose", x, w, name="up", kernel_shape=[2, 2], strides=[2, 2])))
    assert "ConvTranspose" in ops(g1)
    assert any("the weight is not a constant" in r for r in refusals(res, RULE))


def test_refused_when_disabled():
    g0, g1, res = rewritten(up(), disabled=frozenset({RULE}))
    assert "ConvTranspose" in ops(g1) and refusals(res, RULE)
