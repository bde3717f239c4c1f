"""Post-training static quantization of a float model into QDQ-form ONNX.

    result = quantize("zoo:resnet8", calibration_random=64, method="entropy")
    result.save("resnet8_int8.onnx")

The order is the seed's (section 3.4.2): first opfuse's own rewrites and fusion rules, then
quantization, so that

1. weights are quantized after BatchNorm folding (the folded ``W * gamma / sqrt(var + eps)`` is
   quantized once, per output channel);
2. only tensors that still exist after fusion get activation scales: the graph inputs and the
   outputs of the fusion groups (``FusionPlan``, the rules' maximal grouping: ``planner="rules"``),
   not e.g. a Conv's output that its fused Relu consumes inside the same kernel. Calibration runs
   the fused (rewritten) graph in the reference executor.

Each quantized activation ``T`` becomes ``T -> QuantizeLinear -> DequantizeLinear -> consumers``;
each Conv / Gemm / MatMul weight an int8 initializer behind a per-axis ``DequantizeLinear`` and its
bias an int32 one (scale ``x_scale * w_scale``) when the op's input is quantized (a MatMul's bias: the
constant vector of the Add that alone reads its unquantized product, as an exported ``Linear`` writes
it). Kept in float, with the reason recorded: the graph outputs (a caller wants real values), outputs
of data-movement ops whose input is quantized (they carry its scale: ``SCALE_PRESERVING``), non-float
tensors, and biases whose op input has no scale.

A Concat's inputs take the Concat's output parameters (``share_concat_params``, as TensorFlow Lite's
converter restricts CONCATENATION to one input and output scale; onnxruntime's QDQ quantizer gives each
input its own): dequantizing at the output's scale and zero point and quantizing again is then exact,
so the import's ``int8_concat`` rule turns the float Concat into a Concat of the 8-bit tensors, which the
producers write in place (no dequantize / copy / requantize kernel). The output's range covers every
input's (minmax: it is their union), so an input only loses resolution: at most the ratio of the two
scales. An input that carries another tensor's scale (a Split's part) moves that tensor's parameters;
the parameters a tensor takes from a Concat are recorded (``QuantizeResult.shared``), and a Concat
whose inputs cannot all take them keeps its own (``QuantizeResult.kept_apart``, with the reason).
``share_concat_scales=False`` keeps every tensor's own parameters.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from opfuse.errors import InputError, ModelError
from opfuse.ir.graph import Graph
from opfuse.quantization.accuracy import DEFAULT_REPORT_SAMPLES
from opfuse.quantization.calibration import (DEFAULT_PERCENTILE, METHODS, TensorRange, collect_ranges, load_samples,
                                         random_samples, split_samples)
from opfuse.quantization.params import (ACTIVATION_TYPES, DEFAULT_ACTIVATION_TYPE, ActivationParams, activation_params,
                                    quantize_bias, quantize_weight)

# Ops whose output holds (a subset of) the input's values: they keep the input's scale.
SCALE_PRESERVING = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity", "MaxPool",
                              "GlobalMaxPool", "Slice", "Gather", "Split"})
WEIGHT_OPS = ("Conv", "Gemm", "MatMul")
FUSION_PLANNER = "rules"  # which tensors exist: the rules' maximal grouping (target-independent)


@dataclass
class QuantizeResult:
    """A quantized model and how it was made."""

    model: onnx.ModelProto
    method: str
    activation_type: str
    samples: int
    activations: dict[str, ActivationParams]  # quantized tensor -> parameters
    ranges: dict[str, TensorRange]
    inherited: dict[str, str]  # tensor -> the quantized tensor whose scale it carries
    weights: list[dict[str, Any]]  # one per quantized weight: node, op, weight, axis, channels, bias
    kept_float: dict[str, str]  # tensor -> why it is not quantized
    fused_graph: Graph = field(repr=False)
    report: dict | None = None  # the accuracy report, when asked for
    shared: dict[str, str] = field(default_factory=dict)  # tensor -> the Concat output whose parameters it took
    kept_apart: dict[str, str] = field(default_factory=dict)  # Concat output -> why its inputs keep their own

    def save(self, path) -> None:
        from opfuse.files import check_writable
        check_writable(str(path))
        onnx.save_model(self.model, str(path))

    def compile(self, target: str = "host", **kwargs):
        """The quantized model compiled (``opfuse.compile``): int8 tensors between kernels, integer
        convolutions; the report's ``int8`` record says what runs in int8."""
        from opfuse.compiler import compile as compile_model
        return compile_model(self.model, target, **kwargs)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {
            "method": self.method, "activation_type": self.activation_type, "calibration_samples": self.samples,
            "activations": {t: {"scale": float(p.scale), "zero_point": p.zero_point, "lo": self.ranges[t].lo,
                                "hi": self.ranges[t].hi, "min": self.ranges[t].min, "max": self.ranges[t].max}
                            for t, p in self.activations.items()},
            "inherited": dict(self.inherited), "weights": list(self.weights), "kept_float": dict(self.kept_float),
            "concat_shared": dict(self.shared), "concat_kept_apart": dict(self.kept_apart)}
        if self.report is not None:
            out["accuracy"] = self.report
        return out


# Which tensors ------------------------------------------------------------------------------------

def select_tensors(graph: Graph, plan) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """``(quantized, inherited, kept_float)`` over the tensors that exist after fusion."""
    outputs = {v.name for v in graph.outputs}
    existing = [v for v in graph.inputs]
    for group in plan.groups:
        existing.extend(group.outputs(graph))
    quantized: list[str] = []
    inherited: dict[str, str] = {}
    kept: dict[str, str] = {}
    for v in existing:
        if v.name in quantized or v.name in inherited or v.name in kept:
            continue
        if v.dtype != np.float32:
            kept[v.name] = f"{v.dtype} tensor"
        elif v.name in outputs:
            kept[v.name] = "graph output (kept in float)"
        elif v.producer is not None and v.producer.op_type in SCALE_PRESERVING and v.producer.inputs \
                and v.producer.inputs[0] is not None:
            src = v.producer.inputs[0].name
            src = inherited.get(src, src)
            if src in quantized:
                inherited[v.name] = src
            else:
                quantized.append(v.name)
        else:
            quantized.append(v.name)
    return quantized, inherited, kept


def share_concat_params(graph: Graph, params: dict[str, ActivationParams], inherited: Mapping[str, str]
                        ) -> tuple[dict[str, ActivationParams], dict[str, str], dict[str, str]]:
    """``(params, shared, kept_apart)``: every quantized Concat's inputs (through ``inherited``, the tensor
    whose scale each carries) take the Concat output's parameters. Concats are visited consumers first,
    so a Concat feeding another passes the outer one's parameters on to its own inputs. A tensor takes
    one Concat's parameters at most: a second Concat reading it keeps its own (``kept_apart``)."""
    out = dict(params)
    shared: dict[str, str] = {}
    apart: dict[str, str] = {}
    concats = [n for n in graph.nodes if n.op_type == "Concat" and n.outputs[0].name in params]
    for node in reversed(concats):
        c = node.outputs[0].name
        sources = []
        reason = None
        for v in node.input_values():
            src = inherited.get(v.name, v.name)
            if src not in out:
                reason = f"input '{v.name}' is not quantized"
            elif src in shared and shared[src] != c:
                reason = f"input '{v.name}' already takes the parameters of '{shared[src]}'"
            elif src == c:
                reason = f"input '{v.name}' is the Concat's own output"
            if reason is not None:
                break
            sources.append(src)
        if reason is not None:
            apart[c] = reason
            continue
        for src in sources:
            out[src] = out[c]
            shared[src] = c
    return out, shared, apart


# Building the QDQ model ---------------------------------------------------------------------------

class _Names:
    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.used = {x.name for x in g.initializer} | {x.name for x in g.input} | {x.name for x in g.output}
        self.used |= {o for n in g.node for o in n.output} | {n.name for n in g.node}

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


def _qdq_pair(names: _Names, tensor: str, p: ActivationParams, inits: list) -> tuple[list[onnx.NodeProto], str]:
    scale = names.fresh(f"{tensor}_scale")
    zp = names.fresh(f"{tensor}_zero_point")
    inits.append(numpy_helper.from_array(np.array(p.scale, np.float32), scale))
    inits.append(numpy_helper.from_array(np.array(p.zero_point, p.dtype), zp))
    q, dq = names.fresh(f"{tensor}_quantized"), names.fresh(f"{tensor}_dequantized")
    return [helper.make_node("QuantizeLinear", [tensor, scale, zp], [q], name=names.fresh(f"{tensor}_QuantizeLinear")),
            helper.make_node("DequantizeLinear", [q, scale, zp], [dq],
                             name=names.fresh(f"{tensor}_DequantizeLinear"))], dq


def _dq_const(names: _Names, base: str, q: np.ndarray, scales: np.ndarray, axis: int,
              inits: list) -> tuple[onnx.NodeProto, str]:
    qn, sn, zn = names.fresh(f"{base}_quantized"), names.fresh(f"{base}_scale"), names.fresh(f"{base}_zero_point")
    inits.append(numpy_helper.from_array(q, qn))
    inits.append(numpy_helper.from_array(scales.astype(np.float32), sn))
    inits.append(numpy_helper.from_array(np.zeros(scales.shape, q.dtype), zn))
    out = names.fresh(f"{base}_dequantized")
    return helper.make_node("DequantizeLinear", [qn, sn, zn], [out], name=names.fresh(f"{base}_DequantizeLinear"),
                            axis=axis), out


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _weight_spec(node: onnx.NodeProto, consts: Mapping[str, np.ndarray]) -> tuple[int, int | None] | None:
    """``(weight axis, bias input index or None)`` of a weight op with a constant float weight."""
    if node.op_type not in WEIGHT_OPS or len(node.input) < 2 or node.input[1] not in consts:
        return None
    w = consts[node.input[1]]
    if w.dtype != np.float32:
        return None
    if node.op_type == "Conv":
        if w.ndim < 3:
            return None
        has_bias = len(node.input) > 2 and node.input[2] in consts and consts[node.input[2]].shape == (w.shape[0],)
        return 0, 2 if has_bias else None
    if w.ndim != 2:
        return None
    if node.op_type == "MatMul":
        return 1, None
    axis = 0 if _attr(node, "transB", 0) else 1
    plain = _attr(node, "alpha", 1.0) == 1.0 and _attr(node, "beta", 1.0) == 1.0
    has_bias = plain and len(node.input) > 2 and node.input[2] in consts \
        and consts[node.input[2]].shape == (w.shape[axis],)
    return axis, 2 if has_bias else None


def _matmul_bias_adds(g: onnx.GraphProto, consts: Mapping[str, np.ndarray],
                      activations: Mapping[str, ActivationParams]) -> dict[str, tuple[str, int]]:
    """``{MatMul name: (Add name, the Add's bias input index)}`` for a MatMul with a constant 2-D weight whose
    product (not quantized itself) is read only by an ``Add`` of a constant float vector of one value per
    output column: the bias an exported ``Linear`` adds after its MatMul, which then becomes an int32 constant
    behind a DequantizeLinear as a Gemm's bias does (the integer matmul adds it in its accumulator)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for i in node.input:
            readers.setdefault(i, []).append(node)
    outputs = {o.name for o in g.output}
    found = {}
    for node in g.node:
        if node.op_type != "MatMul" or len(node.input) < 2 or node.input[1] not in consts:
            continue
        w, y = consts[node.input[1]], node.output[0]
        users = readers.get(y, [])
        if w.ndim != 2 or y in activations or y in outputs or len(users) != 1 or users[0].op_type != "Add":
            continue
        add = users[0]
        if not node.name or not add.name or len(add.input) != 2 or add.input[0] == add.input[1]:
            continue
        index = 1 if add.input[0] == y else 0
        b = consts.get(add.input[index])
        if b is not None and b.dtype == np.float32 and b.shape == (w.shape[1],):
            found[node.name] = (add.name, index)
    return found


def build_qdq_model(float_model: onnx.ModelProto, activations: Mapping[str, ActivationParams],
                    inherited: Mapping[str, str]) -> tuple[onnx.ModelProto, list[dict], dict[str, str]]:
    """The QDQ model: activations as Q/DQ pairs, weights and biases as DQ of int8 / int32 constants."""
    g = float_model.graph
    names = _Names(float_model)
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    new_inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    dq_of: dict[str, str] = {}
    weights: list[dict] = []
    kept: dict[str, str] = {}
    quantized_consts: dict[tuple, str] = {}

    def emit_qdq(tensor: str) -> None:
        pair, dq = _qdq_pair(names, tensor, activations[tensor], new_inits)
        nodes.extend(pair)
        dq_of[tensor] = dq

    def params_of(tensor: str) -> ActivationParams | None:
        return activations.get(inherited.get(tensor, tensor))

    bias_adds = _matmul_bias_adds(g, consts, activations)
    add_bias: dict[str, tuple[int, str]] = {}  # Add name -> (input index, its int32 bias DQ's output)
    for v in g.input:
        if v.name in activations:
            emit_qdq(v.name)
    for node in g.node:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        if node.name in add_bias:
            index, dq_out = add_bias[node.name]
            new.input[index] = dq_out
        spec = _weight_spec(node, consts)
        if spec is not None:
            axis, bias_index = spec
            w_name = node.input[1]
            bias_add = bias_adds.get(node.name)
            key = ("w", w_name, axis)
            w_q, w_scales = quantize_weight(consts[w_name], axis)
            if key not in quantized_consts:
                dq, out = _dq_const(names, w_name, w_q, w_scales, axis, new_inits)
                nodes.append(dq)
                quantized_consts[key] = out
            new.input[1] = quantized_consts[key]
            x = params_of(node.input[0])
            bias_state = None
            if bias_index is not None or bias_add is not None:
                add_node = next(n for n in g.node if n.name == bias_add[0]) if bias_add is not None else node
                b_name = add_node.input[bias_add[1] if bias_add is not None else bias_index]
                if x is None:
                    kept[b_name] = f"bias of '{node.name}': its input '{node.input[0]}' has no scale (kept in float)"
                    bias_state = "float"
                else:
                    b_q, b_scales = quantize_bias(consts[b_name], x.scale, w_scales)
                    bkey = ("b", b_name, float(x.scale), w_name)
                    if bkey not in quantized_consts:
                        dq, out = _dq_const(names, b_name, b_q, b_scales, 0, new_inits)
                        nodes.append(dq)
                        quantized_consts[bkey] = out
                    if bias_add is not None:
                        add_bias[bias_add[0]] = (bias_add[1], quantized_consts[bkey])
                    else:
                        new.input[bias_index] = quantized_consts[bkey]
                    bias_state = "int32"
            weights.append({"node": node.name, "op": node.op_type, "weight": w_name, "axis": axis,
                            "channels": int(w_scales.size), "bias": bias_state})
        for i, name in enumerate(new.input):
            if name in dq_of:
                new.input[i] = dq_of[name]
        nodes.append(new)
        for out in node.output:
            if out in activations:
                emit_qdq(out)
    used = {i for n in nodes for i in n.input}
    inits = [i for i in g.initializer if i.name in used] + [i for i in new_inits]
    graph = helper.make_graph(nodes, g.name, list(g.input), list(g.output), inits)
    model = helper.make_model(graph, opset_imports=list(float_model.opset_import), producer_name="opfuse-quantize")
    model.ir_version = float_model.ir_version
    onnx.checker.check_model(model)
    return model, weights, kept


# The entry point ----------------------------------------------------------------------------------

def _samples(graph: Graph, calibration, calibration_random) -> list[dict[str, np.ndarray]]:
    if (calibration is None) == (calibration_random is None):
        raise InputError("give calibration data (--calibration DATA.npz) or a number of random samples "
                         "(--calibration-random N), exactly one of them")
    if calibration_random is not None:
        return random_samples(graph, calibration_random)
    if isinstance(calibration, (str, bytes)) or hasattr(calibration, "__fspath__"):
        import os
        return load_samples(os.fsdecode(calibration), graph)
    if isinstance(calibration, Mapping):
        return split_samples(calibration, graph, "calibration data")
    if isinstance(calibration, Sequence):
        from opfuse.runtime.reference import check_inputs
        return [check_inputs(graph, feeds, cast=True) for feeds in calibration]
    raise InputError(f"calibration data must be an .npz path, a dict of sample stacks or a list of feeds, "
                     f"not {type(calibration).__name__}")


QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
                           "MatMulInteger", "DynamicQuantizeLinear"})


def _refuse_quantized(model) -> None:
    """A model that already holds quantized ops is refused (its QDQ pairs import as float ops, and
    quantizing those again would stack a second rounding on every tensor)."""
    import os

    from opfuse.api import ZOO_PREFIX, onnx_proto
    if isinstance(model, Graph) or (not isinstance(model, onnx.ModelProto)
                                    and (os.fspath(model).startswith(ZOO_PREFIX) or not os.path.exists(model))):
        return  # a Graph has no trace of ONNX's quantized ops; zoo models are float; load() names a missing file
    found = sorted({n.op_type for n in onnx_proto(model).graph.node} & QUANTIZED_OPS)
    if found:
        raise ModelError(f"the model is already quantized (it has {', '.join(found)} nodes)")


def _as_deployed(graph):
    """The QDQ graph with its integer ops recognized (the ``recognize_integer`` stage: what the fused build
    computes, within one step of the float QDQ graph), for the accuracy report."""
    from opfuse.rewrites import Provenance, RewriteContext, recognize_integer
    from opfuse.rules.options import FusionOptions
    recognize_integer(graph, RewriteContext(FusionOptions(), Provenance(graph)))
    return graph


def quantize(model, calibration=None, *, calibration_random: int | None = None, method: str = "minmax",
             activation_type: str = DEFAULT_ACTIVATION_TYPE, percentile: float = DEFAULT_PERCENTILE,
             input_shapes=None, report: bool = False, report_samples: int = DEFAULT_REPORT_SAMPLES,
             report_inputs=None, share_concat_scales: bool = True) -> QuantizeResult:
    """Quantize ``model`` (``zoo:NAME``, a path, a ModelProto or a Graph); see the module docstring.

    ``calibration``: an ``.npz`` path (arrays keyed by input name, ``S`` samples each), a dict of
    such stacks, or a list of feeds; or ``calibration_random=N`` seeded random samples.
    ``report=True`` adds the accuracy report (``opfuse.quantization.accuracy``) over
    ``report_samples`` random inputs and ``report_inputs`` (given as ``calibration`` is).
    ``share_concat_scales``: a Concat's inputs take its output's parameters (``share_concat_params``)."""
    from opfuse.compiler import CompileOptions, plan_model
    from opfuse.frontend.onnx import export_model
    from opfuse.runtime.reference import run
    if method not in METHODS:
        raise InputError(f"unknown calibration method '{method}'; choose one of {', '.join(METHODS)}")
    if activation_type not in ACTIVATION_TYPES:
        raise InputError(f"unknown activation type '{activation_type}'; choose one of {', '.join(ACTIVATION_TYPES)}")
    _refuse_quantized(model)
    comp = plan_model(model, CompileOptions(planner=FUSION_PLANNER, input_shapes=input_shapes))
    graph = comp.graph
    samples = _samples(graph, calibration, calibration_random)
    tensors, inherited, kept = select_tensors(graph, comp.plan)
    ranges = collect_ranges(lambda feeds: run(graph, feeds, keep=True), samples, tensors, method, percentile)
    dtype = ACTIVATION_TYPES[activation_type]
    params = {t: activation_params(ranges[t].lo, ranges[t].hi, dtype) for t in tensors}
    shared: dict[str, str] = {}
    apart: dict[str, str] = {}
    if share_concat_scales:
        params, shared, apart = share_concat_params(graph, params, inherited)
    qmodel, weights, bias_kept = build_qdq_model(export_model(graph), params, inherited)
    kept.update(bias_kept)
    helper.set_model_props(qmodel, {"opfuse.quantize.method": method,
                                    "opfuse.quantize.activation_type": activation_type,
                                    "opfuse.quantization.calibration_samples": str(len(samples))})
    result = QuantizeResult(qmodel, method, activation_type, len(samples), params, ranges, inherited, weights, kept,
                            graph, shared=shared, kept_apart=apart)
    if report:
        from opfuse.api import load
        from opfuse.quantization.accuracy import accuracy_report
        if isinstance(report_samples, bool) or not isinstance(report_samples, int) or report_samples < 0:
            raise InputError(f"the report needs a non-negative number of random inputs, got {report_samples!r}")
        given = _samples(comp.original, report_inputs, None) if report_inputs is not None else []
        if report_samples == 0 and not given:
            raise InputError("the accuracy report needs inputs: random ones (a positive count) or given ones")
        result.report = accuracy_report(comp.original, _as_deployed(load(qmodel)), result, count=report_samples,
                                        samples=given)
    return result
