"""Finishing one anchor result: run the fused epilogue and store the group's outputs.

An anchor (Conv tile element, softmax row element, attention output...) hands over its
result ``r`` for output index ``I``. The epilogue nodes are then swept forward, in group
order:

* an elementwise/broadcast node whose anchor-dependent operands all sit at index ``J`` (of
  its own shape) is evaluated at ``J`` (other operands broadcast as usual);
* a bijective data-movement node (Reshape family, Transpose) just relabels the element:
  its output *is* its input, at the forward-mapped index (``Index.reshape_to`` works in
  both directions; ``transpose_to`` permutes). This is how "merge heads"
  (Transpose + Reshape) after attention stores straight to its final place.

Every stage output is then stored at the index the sweep reached it at. An epilogue op
that spreads one anchor element to several places (Expand, broadcast against a bigger
operand, Slice, ...) raises ``UnsupportedGroupError``.

``VectorEpilogue``: the same epilogue a whole vector of anchor results at a time, where the
anchor finishes its elements along a loop that is unit stride in every output (a GEMM tile's
row): the ops of ``simdchain.VECTOR_OPS`` (AVX-512 / AVX2 intrinsics, the scalar rules'
operations in the same order, so the same bits as this sweep), no relabelling op, every
operand varying along the loop with unit stride or not at all (those computed once per pass,
by the scalar rules, and broadcast).
"""
from __future__ import annotations

from opfuse.codegen import simdchain
from opfuse.codegen.index import Index, stride_along
from opfuse.codegen.loops import store
from opfuse.codegen.stages import RELABEL_OPS, Stage
from opfuse.codegen.vecmath import VecIsa
from opfuse.ir.graph import Node, Value
from opfuse.ops.registry import Category, get_spec


def _perm(node: Node) -> tuple[int, ...]:
    perm = get_spec(node.op_type, node).attrs_of(node)["perm"]
    rank = len(node.input(0).shape)
    return tuple(range(rank))[::-1] if perm is None else tuple(int(p) for p in perm)


def forward_index(node: Node, idx: Index) -> Index:
    """Index in ``node``'s output of the element at ``idx`` of its input 0."""
    out = node.outputs[0]
    if node.op_type == "Transpose":
        return idx.transpose_to(_perm(node), out.shape)
    return idx.reshape_to(out.shape)


def finish_element(kc, ev, stage: Stage, anchor_out: Value, idx: Index, expr: str) -> None:
    """Bind ``anchor_out[idx] = expr``, sweep the epilogue, store every stage output."""
    where: dict[int, Index] = {id(anchor_out): idx}
    ev.bind(anchor_out, idx, expr)
    bound = [anchor_out]
    for n in stage.epilogue:
        dep = [v for v in n.input_values() if id(v) in where]
        if not dep:
            continue  # computed on demand, if an output needs it
        out = n.outputs[0]
        if n.op_type in RELABEL_OPS or (n.op_type == "Dropout" and len(dep) == 1):
            j = forward_index(n, where[id(dep[0])]) if n.op_type != "Dropout" else where[id(dep[0])]
            ev.bind(out, j, ev.at(dep[0], where[id(dep[0])]))
            bound.append(out)
            where[id(out)] = j
            continue
        cat = get_spec(n.op_type, n).category
        keys = {where[id(v)].key() for v in dep}
        if (cat not in (Category.ELEMWISE, Category.BROADCAST) or n.op_type == "Expand"
                or any(v.shape != out.shape for v in dep) or len(keys) != 1):
            raise kc.error(f"epilogue node '{n.name}' ({n.op_type}) would spread one result of the "
                           f"anchor over several output elements; end the group before it")
        where[id(out)] = where[id(dep[0])]
    for v in stage.outputs:
        if id(v) not in where:
            raise kc.error(f"output '{v.name}' is not computed element by element from the anchor")
        store(kc, ev, v, where[id(v)])
    for v in bound:
        ev.unbind(v)


PROBE = "opfuse_lane0"  # the loop variable of the index ``VectorEpilogue.plan`` classifies the operands at


class VectorEpilogue:
    """``stage``'s epilogue on vectors of anchor results: ``idx(var)`` is the index of ``anchor_out`` whose
    element the C variable ``var`` selects, each vector's lanes at ``var``, ``var + 1``, ...; build with ``plan``."""

    def __init__(self, kc, ev, stage: Stage, anchor_out: Value, leaf: simdchain.Leaf, varying: frozenset[int]):
        self.kc, self.ev, self.stage, self.anchor_out = kc, ev, stage, anchor_out
        self.hoisted = simdchain.chain_invariants(kc, stage.outputs, ev.inline, leaf)
        # operands other than the anchor's results that vary along the loop (loaded per vector), by value id
        self.varying = varying

    @classmethod
    def plan(cls, kc, ev, stage: Stage, anchor_out: Value, idx) -> "VectorEpilogue | str":
        """The vector form of ``stage``'s epilogue, or why there is none (``simdchain.chain_refusal``'s reasons,
        or an output or operand that is not unit stride along the loop)."""
        probe = idx(PROBE)
        outs = stage.outputs
        if anchor_out.dtype != simdchain.F32 or any(v.dtype != simdchain.F32 or v.shape != anchor_out.shape
                                                    for v in outs):
            return "an output is not float32 of the anchor's shape"
        if stride_along(probe.offset(), PROBE) != 1:
            return "the output is not unit stride along the loop"
        static, loadable = kc.program.memory.static, ev.loadable
        varying: set[int] = set()

        def leaf(v: Value) -> bool | str:
            if v is anchor_out:
                return True
            if id(v) not in static and id(v) not in loadable:
                return f"value '{v.name}' is neither stored nor computable here"
            stride = stride_along(probe.broadcast_to(v.shape).offset(), PROBE)
            if stride == 1:
                varying.add(id(v))
            return f"operand '{v.name}' is not unit stride along the loop" if stride is None else stride == 1
        reason = simdchain.chain_refusal(kc, outs, ev.inline, leaf)
        return reason if reason is not None else cls(kc, ev, stage, anchor_out, leaf, frozenset(varying))

    def hoist(self, isa: VecIsa, idx: Index) -> dict[int, str]:
        """The operands constant along the loop, computed at ``idx`` by the scalar rules and broadcast."""
        return simdchain.hoist(self.kc, self.ev, isa, self.hoisted, idx)

    def row(self, isa: VecIsa, t: str, lo: str, hi: str, src: str, position, index, bias: str | None,
            element, names: str = "jn", overlap_tail: bool = False) -> None:
        """A row of anchor results ``src[t]`` for the C variable ``t`` (declared here) from ``lo`` to ``hi``,
        element ``t`` finishing the output element ``index(position(t))`` (``position``: C of the output coordinate
        along the row): ``CodegenOptions.simd_unroll`` vectors an iteration, then single vectors, then the scalar
        ``element(t)``s. ``bias``: a scalar C expression the anchor adds to each result first (None: none). The
        operands constant along the row are computed once, at ``position(lo)``, by the scalar rules, and broadcast;
        each lane gets the scalar path's operations in its order. ``names``: the temporaries' prefixes (offset,
        coordinate). ``overlap_tail``: where the row has a whole vector, its last elements are the vector that ends
        at ``hi`` (recomputing a few: the same values, so the same stores) instead of the scalar loop; only where
        the epilogue loads nothing along the row but the anchor's results (``varying`` empty: no operand an
        output's store may have overwritten in place)."""
        with self.ev.twin():
            self._row(isa, t, lo, hi, src, position, index, bias, element, names,
                      overlap_tail and not self.varying)

    def _row(self, isa: VecIsa, t: str, lo: str, hi: str, src: str, position, index, bias: str | None,
             element, names: str, overlap_tail: bool) -> None:
        kc, w = self.kc, self.kc.w
        lanes, unroll = isa.lanes, kc.program.options.simd_unroll
        w.line(f"long {t} = {lo};")
        invariant = self.hoist(isa, index(position(lo)))
        bvec = None
        if bias is not None:
            bvec = kc.tmp("u")
            w.line(f"const {isa.vt} {bvec} = {isa.set1(bias)};")

        def vector(tk: str) -> None:
            pos = position(tk)
            if not pos.isidentifier():
                v = kc.tmp(names[1])
                w.line(f"const long {v} = {pos};")
                pos = v
            acc = isa.op("loadu_ps", f"{src} + {tk}")
            self.store(isa, index(pos), isa.op("add_ps", acc, bvec) if bvec is not None else acc, invariant)

        def vectors(count: int) -> None:
            for k in range(count):
                tk = t
                if k:
                    tk = kc.tmp(names[0])
                    w.line(f"const long {tk} = {t} + {k * lanes};")
                with self.ev.scope():
                    vector(tk)
        if unroll > 1:
            with w.block(f"for (; {t} + {unroll * lanes} <= {hi}; {t} += {unroll * lanes})"):
                vectors(unroll)
        with w.block(f"for (; {t} + {lanes} <= {hi}; {t} += {lanes})"):
            vectors(1)
        if overlap_tail:
            with w.block(f"if ({t} < {hi} && {hi} - {lo} >= {lanes})"):
                w.line(f"{t} = {hi} - {lanes};")
                vectors(1)
                w.line(f"{t} = {hi};")
        with w.block(f"for (; {t} < {hi}; ++{t})"), self.ev.scope():
            element(t)

    def store(self, isa: VecIsa, idx: Index, result: str, invariant: dict[int, str]) -> None:
        """Finish the vector of anchor results ``result`` (lanes from ``idx`` on) and store every output."""
        if not result.isidentifier():
            name = self.kc.tmp("v")
            self.kc.w.line(f"const {isa.vt} {name} = {result};")
            result = name
        known = {**invariant, id(self.anchor_out): result}
        simdchain.store_vector(self.kc, isa, self.ev.inline, self.ev.loadable, idx, self.stage.outputs, known)
