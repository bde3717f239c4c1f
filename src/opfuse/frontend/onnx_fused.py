"""The fused model as ONNX: every fusion group of a plan is one model-local ONNX function.

``export_fused_model(graph, plan)`` exports ``graph`` as ``onnx_export`` does, then gathers the
ONNX nodes of each group of two or more ops into a ``FunctionProto`` of the domain
``opfuse.fused``, named after the rule that formed it and its ops (``epilogue_Conv_Relu_3``: rule,
distinct op types in order, the group's place in the plan), and calls it from the main graph
under the group's name. A function's inputs are the names its nodes read from outside
(activations and weights alike: functions hold no initializers); its outputs are the values read
outside the group or that are graph outputs, so the call computes exactly what the group's
kernel does. One-op groups stay plain nodes.

Netron draws each call as one box, expandable into its ops; onnxruntime inlines the functions
and computes the same outputs as the unfused export. ``group_meta`` (group name -> figures, e.g.
the fusion report's kernels, bytes, eta) is written into each call's and function's
``doc_string``, and all of it as JSON into the model's ``metadata_props["opfuse.groups"]``.
"""
from __future__ import annotations

import json
import os
import re
from typing import Mapping

import onnx
from onnx import helper

from opfuse.frontend.onnx_export import export_graph, write_model
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionGroup, FusionPlan

FUNCTION_DOMAIN = "opfuse.fused"
MAX_NAMED_OPS = 4  # op types spelled out in a function's name; longer groups end in "_etc"
GROUPS_METADATA_KEY = "opfuse.groups"


def function_name(group: FusionGroup, index: int) -> str:
    """``{rule}_{op types}_{index}``, e.g. ``epilogue_Conv_Relu_3`` (an identifier)."""
    ops = list(dict.fromkeys(group.op_types))
    words = [str(group.attrs.get("rule") or group.kind), *ops[:MAX_NAMED_OPS]]
    if len(ops) > MAX_NAMED_OPS:
        words.append("etc")
    return re.sub(r"\W", "_", "_".join(words)) + f"_{index}"


def describe_group(meta: Mapping) -> str:
    """One line of a group's figures for a ``doc_string`` (the keys of the fusion report)."""
    parts = []
    if meta.get("rule"):
        parts.append(f"rule {meta['rule']}")
    if "ops" in meta:
        parts.append("ops " + "+".join(meta["ops"]))
    if "kernels_before" in meta:
        parts.append(f"kernels {meta['kernels_before']} -> {meta['kernels_after']}")
    if "bytes_before" in meta:
        parts.append(f"main-memory bytes {meta['bytes_before']:,} -> {meta['bytes_after']:,} (eta {meta['eta']:.3f})")
    if "flops" in meta:
        parts.append(f"FLOPs {meta['flops']:,}")
    if meta.get("predicted_latency_s") is not None:
        parts.append(f"predicted {meta['predicted_latency_s'] * 1e6:.1f} us")
    if meta.get("measured_latency_s") is not None:
        parts.append(f"measured {meta['measured_latency_s'] * 1e6:.1f} us")
    return "; ".join(parts)


def export_fused_model(graph: Graph, plan: FusionPlan, *, group_meta: Mapping[str, Mapping] | None = None,
                       opset: int | None = None) -> onnx.ModelProto:
    """``graph`` as ONNX with each multi-op group of ``plan`` a local function (module docstring)."""
    ex = export_graph(graph, opset)
    nodes = ex.ctx.nodes
    meta = group_meta or {}
    readers: dict[str, set[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            readers.setdefault(name, set()).add(i)
    graph_outputs = {o.name for o in ex.outputs}
    owned = {i for start, end in ex.spans.values() for i in range(start, end)}
    first = min((start for start, _ in ex.spans.values()), default=len(nodes))
    top = [nodes[i] for i in range(len(nodes)) if i not in owned and i < first]  # constant outputs' Identities
    hidden: set[str] = set()  # values internal to a function: no value_info in the main graph
    functions = []
    for index, group in enumerate(plan.groups, 1):
        idx = [i for n in group.nodes for i in range(*ex.spans[n.name])]
        figures = dict(meta.get(group.name, {}))
        if len(group.nodes) < 2:
            for i in idx:
                nodes[i].doc_string = describe_group(figures) if figures else nodes[i].doc_string
            top += [nodes[i] for i in idx]
            continue
        inside = set(idx)
        body = [nodes[i] for i in idx]
        produced = [o for n in body for o in n.output if o]
        produced_set = set(produced)
        inputs = list(dict.fromkeys(x for n in body for x in n.input if x and x not in produced_set))
        outputs = [o for o in produced if o in graph_outputs or readers.get(o, set()) - inside]
        hidden.update(o for o in produced if o not in outputs)
        fname = function_name(group, index)
        doc = describe_group({"rule": group.attrs.get("rule"), "ops": group.op_types, **figures})
        functions.append(helper.make_function(FUNCTION_DOMAIN, fname, inputs, outputs, body,
                                              [helper.make_opsetid("", ex.ctx.opset)], doc_string=doc))
        top.append(helper.make_node(fname, inputs, outputs, name=group.name, domain=FUNCTION_DOMAIN,
                                    doc_string=doc))
    top += [nodes[i] for i in range(len(nodes)) if i not in owned and i >= first]  # repeated outputs' copies
    value_info = [vi for vi in ex.value_info if vi.name not in hidden]
    model = ex.model(top, value_info, functions=functions, function_domain=FUNCTION_DOMAIN)
    if meta:
        helper.set_model_props(model, {GROUPS_METADATA_KEY: json.dumps(meta, sort_keys=True, default=str)})
    return model


def save_fused_model(graph: Graph, plan: FusionPlan, path: str | os.PathLike, *,
                     group_meta: Mapping[str, Mapping] | None = None) -> None:
    """``export_fused_model`` written to ``path`` (weights beside it when they are very large)."""
    write_model(export_fused_model(graph, plan, group_meta=group_meta), graph, path)
