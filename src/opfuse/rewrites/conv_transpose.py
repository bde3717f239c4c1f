"""A ConvTranspose whose taps do not overlap is a 1x1 Conv followed by DepthToSpace.

With stride ``s`` equal to the ``s x s`` kernel, no dilation, no padding and no output padding
(the 2x up-sampling of U-Nets, FPNs and text-detection heads), every output pixel receives
exactly one tap:

    y[n, m, i*s + a, j*s + b] = sum_c x[n, c, i, j] * W[c, m, a, b] + bias[m]

which is a 1x1 Conv with ``M*s*s`` output channels ``z[n, (m, a, b), i, j]`` (weight
``W2[(m, a, b), c] = W[c, m, a, b]``, bias repeated ``s*s`` times) and a ``DepthToSpace`` of
block ``s`` in ``CRD`` order. The Conv runs on the GEMM core and the shuffle is an injective op
its consumers absorb, where the ConvTranspose kernel is a gather reading a whole channel column
of ``x`` and ``W`` per output element (measured 3x slower on PP-OCRv4's DB head, whole model).
The arithmetic is the same products summed in the same order (over ``c``).

Refusals (the op is left as it is, with the reason in the decision log): the weight or bias is
not a constant; more than one group; not 2-D; a non-square kernel, or a stride, dilation,
padding or output shape other than the above; a non-floating-point output.
"""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, Node
from opfuse.ops.registry import get_spec
from opfuse.rewrites.context import RewriteContext
from opfuse.rewrites.edit import add_const, add_node, substitute
from opfuse.rules.decisions import Refusal, RefusalKind, refuse

RULE = "conv_transpose_as_conv"


def refusal(node: Node) -> Refusal | None:
    """Why ``node`` (a ConvTranspose) cannot become Conv + DepthToSpace, or None."""
    from opfuse.ops.nn import convT_geometry
    x, w = node.input(0), node.input(1)
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if not w.is_const or (b is not None and not b.is_const):
        return refuse(f"the {'weight' if not w.is_const else 'bias'} is not a constant")
    if not np.issubdtype(node.output.dtype, np.floating):
        return refuse(f"output is {node.output.dtype}, not floating point")
    if len(x.shape) != 4:
        return refuse(f"{len(x.shape) - 2}-D, not 2-D")
    g = convT_geometry(node, get_spec("ConvTranspose").attrs_of(node))
    if g.group != 1:
        return refuse(f"group={g.group}")
    k = g.kernel[0]
    overlapping = g.kernel != (k, k) or g.strides != (k, k) or g.dilations != (1, 1) or any(g.pads_begin) \
        or g.out != (x.shape[2] * k, x.shape[3] * k)
    if overlapping:
        return refuse(f"kernel {list(g.kernel)}, strides {list(g.strides)}, dilations {list(g.dilations)}, "
                      f"output {list(g.out)} from {list(x.shape[2:])}: not one square tap per output pixel")
    return None


def rewrite_one(graph: Graph, node: Node, rc: RewriteContext) -> str:
    """Replace ``node`` by Conv (1x1) + DepthToSpace; returns the decision's detail."""
    x, w = node.input(0), node.input(1)
    wt = np.asarray(w.const)
    c, m, k = wt.shape[0], wt.shape[1], wt.shape[2]
    w2 = wt.transpose(1, 2, 3, 0).reshape(m * k * k, c, 1, 1)
    inputs = [x, add_const(graph, f"{node.name}_conv_weight", w2)]
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        bias = np.repeat(np.asarray(node.inputs[2].const), k * k)
        inputs.append(add_const(graph, f"{node.name}_conv_bias", bias))
    conv = add_node(graph, "Conv", inputs, name=f"{node.name}_conv",
                    attrs={"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
                           "group": 1})
    shuffle = add_node(graph, "DepthToSpace", [conv.output], name=f"{node.name}_shuffle",
                       attrs={"blocksize": k, "mode": "CRD"})
    rc.provenance.absorb(conv, [node])
    substitute(graph, node.output, shuffle.output)
    return f"ConvTranspose {k}x{k}/{k} ({c} -> {m} channels) became a 1x1 Conv to {m * k * k} channels and a " \
           f"DepthToSpace of block {k}"


def conv_transpose_as_conv(graph: Graph, rc: RewriteContext) -> bool:
    """Apply the rewrite to every ConvTranspose it holds for (the others are logged as refused)."""
    changed = False
    for node in [n for n in graph.nodes if n.op_type == "ConvTranspose"]:
        if rc.options.is_disabled(RULE):
            rc.log_refusal(RULE, [node.name], Refusal(RefusalKind.DISABLED, f"rule '{RULE}' is disabled"))
            continue
        why = refusal(node)
        if why is not None:
            rc.log_refusal(RULE, [node.name], why)
            continue
        rc.log_applied(RULE, [node.name], rewrite_one(graph, node, rc))
        changed = True
    if changed:
        graph.toposort()
    return changed
