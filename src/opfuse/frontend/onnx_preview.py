"""``FlexAttention`` (domain ``ai.onnx.preview``) rewritten into default-domain ops before import.

    Scores = (Q @ K^T) * scale          scale defaults to 1 / sqrt(head_size)
    Scores = score_mod(Scores)          optional subgraph, one rank-4 input and output
    Probs  = Softmax(Scores, axis=-1)   in float32 for non-double inputs (softmax_precision)
    Probs  = prob_mod(Probs)            optional subgraph
    Y      = Probs @ V                  query head h reads K/V head h // (Hq / Hkv)

The node becomes this chain (which the attention rule can fuse into one kernel), each
modifier's nodes inlined in place (its inner values renamed under the node's name, its
initializers made ``Constant`` nodes; names it reads from the outer graph stay as they are, so
they resolve there). When the head counts differ, or are not known from the model's declared
or inferred shapes, K and V are repeated over the query heads of their group (``Expand`` of
shapes read with ``Shape``, folded at import since shapes are static).

The rewrite is on the ModelProto, before the importer checks ops and domains, so nothing
else needs to know the preview domain. A model without
``FlexAttention`` is returned as it is.
"""
from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from opfuse.errors import ModelError

PREVIEW_DOMAIN = "ai.onnx.preview"


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: a for a in node.attribute}


class _Rewriter:
    def __init__(self, node: onnx.NodeProto, prefix: str, taken: set[str]):
        self.node, self.prefix, self.taken = node, prefix, taken
        self.nodes: list[onnx.NodeProto] = []

    def fresh(self, tag: str) -> str:
        base = f"{self.prefix}/{tag}"
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.fresh(op_type), **attrs))
        return out

    def ints(self, tag: str, values: list[int]) -> str:
        return self.op("Constant", [], self.fresh(tag), value=helper.make_tensor(tag, onnx.TensorProto.INT64,
                                                                                 [len(values)], values))

    def inline(self, graph: onnx.GraphProto, x: str, what: str) -> str:
        """``graph`` applied to ``x``: its nodes appended with renamed inner values; its output."""
        if len(graph.input) != 1 or len(graph.output) != 1:
            raise ModelError(f"FlexAttention node '{self.node.name}': {what} must have one input and one output, "
                             f"has {len(graph.input)} and {len(graph.output)}")
        renamed = {graph.input[0].name: x}
        for t in graph.initializer:
            renamed[t.name] = self.op("Constant", [], self.fresh(f"{what}_{t.name}"),
                                      value=numpy_helper.from_array(numpy_helper.to_array(t), t.name))
        for n in graph.node:
            for o in n.output:
                if o:
                    renamed[o] = self.fresh(f"{what}_{o}")
        for n in graph.node:
            inner = onnx.NodeProto()
            inner.CopyFrom(n)
            inner.name = self.fresh(f"{what}_{n.name or n.op_type}")
            inner.input[:] = [renamed.get(i, i) for i in n.input]
            inner.output[:] = [renamed.get(o, o) for o in n.output]
            self.nodes.append(inner)
        return renamed.get(graph.output[0].name, graph.output[0].name)

    def repeated(self, kv: str, q: str) -> str:
        """``kv`` (B, Hkv, S, D) with each head repeated for its group of query heads -> (B, Hq, S, D)."""
        sq, skv = self.op("Shape", [q]), self.op("Shape", [kv])
        hq = self.op("Slice", [sq, self.ints("one", [1]), self.ints("two", [2])])
        hkv = self.op("Slice", [skv, self.ints("one", [1]), self.ints("two", [2])])
        group = self.op("Div", [hq, hkv])
        head = self.op("Slice", [skv, self.ints("zero", [0]), self.ints("two", [2])])
        tail = self.op("Slice", [skv, self.ints("two", [2]), self.ints("four", [4])])
        batch = self.op("Slice", [skv, self.ints("zero", [0]), self.ints("one", [1])])
        expanded = self.op("Expand", [self.op("Unsqueeze", [kv, self.ints("axis", [2])]),
                                      self.op("Concat", [head, group, tail], axis=0)])
        return self.op("Reshape", [expanded, self.op("Concat", [batch, hq, tail], axis=0)])

    def expand(self, q_type: int, same_heads: bool) -> list[onnx.NodeProto]:
        n = self.node
        q, k, v = (list(n.input) + ["", "", ""])[:3]
        if not (q and k and v) or len(n.output) != 1:
            raise ModelError(f"FlexAttention node '{n.name}' needs inputs Q, K, V and one output")
        a = _attrs(n)
        score_mod, prob_mod = a.get("score_mod"), a.get("prob_mod")
        scale = {"scale": a["scale"].f} if "scale" in a else {}
        precision = int(a["softmax_precision"].i) if "softmax_precision" in a else None
        work = precision or (onnx.TensorProto.DOUBLE if q_type == onnx.TensorProto.DOUBLE else onnx.TensorProto.FLOAT)
        if not same_heads:
            k, v = self.repeated(k, q), self.repeated(v, q)
        scores = self.op("MatMul", [q, self.op("Transpose", [k], perm=[0, 1, 3, 2])])
        if q_type != work:
            scores = self.op("Cast", [scores], to=work)
        if scale:
            factor = self.op("Constant", [], self.fresh("scale"), value_float=scale["scale"])
        else:  # 1 / sqrt(head_size), from Q's last dim
            d = self.op("Cast", [self.op("Shape", [q], start=-1)], to=onnx.TensorProto.FLOAT)
            factor = self.op("Reciprocal", [self.op("Sqrt", [self.op("Squeeze", [d])])])
        scores = self.op("Mul", [scores, self.op("CastLike", [factor, scores])])
        if score_mod is not None:
            scores = self.inline(score_mod.g, scores, "score_mod")
        probs = self.op("Softmax", [scores], axis=-1)
        if prob_mod is not None:
            probs = self.inline(prob_mod.g, probs, "prob_mod")
        if q_type != work:
            probs = self.op("CastLike", [probs, q])
        self.op("MatMul", [probs, v], n.output[0])
        return self.nodes


def _tensor_types(model: onnx.ModelProto, names: list[str]) -> list[onnx.TypeProto.Tensor | None]:
    """The declared (else ONNX-inferred) tensor types of ``names``; ``None`` where unknown."""
    def find(g: onnx.GraphProto) -> dict:
        found = {vi.name: vi.type.tensor_type for vi in list(g.input) + list(g.value_info)}
        for t in g.initializer:
            found[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims)).tensor_type
        return found
    known = find(model.graph)
    if any(n not in known for n in names):
        try:
            known = find(onnx.shape_inference.infer_shapes(model).graph) | known
        except Exception:  # an invalid model: the importer reports it
            pass
    return [known.get(n) for n in names]


def _heads(t: onnx.TypeProto.Tensor | None) -> int | None:
    dims = list(t.shape.dim) if t is not None and t.HasField("shape") else []
    return int(dims[1].dim_value) if len(dims) == 4 and dims[1].HasField("dim_value") else None


def expand_preview_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every top-level ``FlexAttention`` node rewritten (a copy; the same model when none)."""
    g = model.graph
    if not any(n.domain == PREVIEW_DOMAIN and n.op_type == "FlexAttention" for n in g.node):
        return model
    taken = {n.name for n in g.node} | {o for n in g.node for o in n.output} | {i.name for i in g.input} \
        | {t.name for t in g.initializer}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for i, n in enumerate(g.node):
        if n.domain == PREVIEW_DOMAIN and n.op_type == "FlexAttention":
            q, k = _tensor_types(model, list(n.input[:2]) + [""] * (2 - len(n.input[:2])))
            hq, hk = _heads(q), _heads(k)
            rewriter = _Rewriter(n, n.name or f"flexattention_{i}", taken)
            out.graph.node.extend(rewriter.expand(q.elem_type if q is not None else 0, hq is not None and hq == hk))
        else:
            out.graph.node.append(n)
    return out
