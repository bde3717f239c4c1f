"""The inline evaluator: C code for "value ``v`` at index ``I``" inside a kernel's loop.

This is how fusion happens in the generated code. A value produced inside the group by
an elementwise, broadcast or data-movement op is never stored: asking for it at an index
asks for its operands at the index its op maps to (``rules.py`` holds one rule per op),
recursively, down to values in memory (group inputs, weights) or a *bound* value (the
anchor's result for the element being finished, e.g. a Conv accumulator). Results are
memoised per (value, index) inside a C scope, so a value used twice is computed once.
"""
from __future__ import annotations

from contextlib import contextmanager

from opfuse.codegen.ctype import c_type, literal
from opfuse.codegen.index import Index
from opfuse.codegen.kernel import KernelContext
from opfuse.ir.graph import Node, Value


class Evaluator:
    def __init__(self, kc: KernelContext, inline: set[int], loadable: set[int]):
        """``inline``: ids of nodes that may be computed in registers; ``loadable``: ids of
        values that may be read from memory (group inputs and values already stored)."""
        self.kc = kc
        self.w = kc.w
        self.inline = inline
        self.loadable = loadable
        self.static = kc.program.memory.static
        self._memo: list[dict] = [{}]
        self._bound: dict[int, tuple[tuple, str]] = {}
        # Inside an explicit-SIMD loop (its remainder, its hoisted operands): the scalar rules then use the forms
        # whose bits the vector forms keep lane by lane (Gelu's table polynomial, ``codegen/gelu.py``); elsewhere
        # the forms a C compiler's vectoriser takes (no table lookups, which it would run lane by lane).
        self.vector_twin = False

    # Scopes -------------------------------------------------------------------------------
    @contextmanager
    def scope(self):
        """Temporaries computed inside are forgotten at exit (their C scope closes)."""
        self._memo.append({})
        try:
            yield
        finally:
            self._memo.pop()

    @contextmanager
    def twin(self):
        """The scalar code written inside is an explicit-SIMD loop's remainder or hoisted operand: the same bits as
        the vector lanes (``vector_twin``)."""
        before, self.vector_twin = self.vector_twin, True
        try:
            yield
        finally:
            self.vector_twin = before

    def bind(self, v: Value, idx: Index, expr: str) -> None:
        """``v`` at ``idx`` is the C expression ``expr`` (an anchor's result)."""
        self._bound[id(v)] = (idx.key(), expr)

    def unbind(self, v: Value) -> None:
        self._bound.pop(id(v), None)

    def _lookup(self, key):
        for memo in reversed(self._memo):
            if key in memo:
                return memo[key]
        return None

    def remember(self, v: Value, idx: Index, name: str) -> None:
        self._memo[-1][(id(v), idx.key())] = name

    # Evaluation ---------------------------------------------------------------------------
    def ctype(self, v: Value) -> str:
        return c_type(v.dtype, v.name)

    def assign(self, v: Value, expr: str, *, prefix: str = "t") -> str:
        """Emit ``const T tN = expr;`` and return ``tN``."""
        name = self.kc.tmp(prefix)
        self.w.line(f"const {self.ctype(v)} {name} = {expr};")
        return name

    def load(self, v: Value, idx: Index) -> str:
        """Read ``v`` at ``idx`` from memory (its storage or the weights)."""
        return f"{self.kc.ptr(v)}[{idx.offset()}]"

    def at(self, v: Value, idx: Index) -> str:
        """A C expression (a temporary or a literal) for ``v`` at ``idx``."""
        key = (id(v), idx.key())
        hit = self._lookup(key)
        if hit is not None:
            return hit
        bound = self._bound.get(id(v))
        if bound is not None:
            if bound[0] != idx.key():
                raise self.kc.error(f"value '{v.name}' is read at another element than the one being "
                                    f"computed (an index map after the anchor); split the group there")
            return bound[1]
        if id(v) in self.static:
            arr = self.static[id(v)]
            if arr.size == 1:
                return literal(arr.reshape(-1)[0], v.dtype)
            name = self.assign(v, f"{self.kc.static_ptr(v)}[{idx.offset()}]")
        elif v.producer is not None and id(v.producer) in self.inline:
            from opfuse.codegen.rules import apply_rule
            name = apply_rule(self, v.producer, v.producer.outputs.index(v), idx)
        elif id(v) in self.loadable:
            name = self.assign(v, self.load(v, idx))
        else:
            where = f"produced by '{v.producer.name}' ({v.producer.op_type})" if v.producer else "a graph input"
            raise self.kc.error(f"value '{v.name}' ({where}) is needed inside the kernel but is neither "
                                f"computable inline nor stored")
        self.remember(v, idx, name)
        return name

    def operand(self, node: Node, i: int, idx: Index) -> str:
        """Input ``i`` of an elementwise/broadcast ``node`` for output element ``idx``."""
        v = node.input(i)
        return self.at(v, idx.broadcast_to(v.shape))
