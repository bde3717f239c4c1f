"""The pattern language: the seed's ``Pattern ::= Op | Pattern -> Pattern | Pattern || Pattern | Pattern*``.

A pattern is a small expression built in Python; it describes a connected sub-DAG of the graph.

    Op("Conv")                              one node whose op type is Conv
    Op("Add", "Mul")                        alternation of op types
    Op(category=Category.ELEMWISE)          any op of a TVM category
    Op(tag="activation")                    any op carrying a registry tag
    Op("Add") | Op(tag="activation")        alternation (merged into one vertex when both are bare ops)
    Op("Conv").where(has_attr(group=1))     constraints on attributes, dtype, shape, constant inputs
    a >> b                                  sequence: a's output feeds some input of b ("->")
    a >> b.at(0)                            ... feeds input 0 of b
    Op("Div")(x, Const())                   call syntax: input 0 is ``x``, input 1 a constant
    par(a, b, c)                            parallel siblings ("||"); ``x >> par(...)`` shares input x
    p.plus(), p.star(), p.opt()             repetition as a chain p >> p >> ... (``p.repeat(lo, hi)``)
    many(p) >> Op("Concat")                 repetition in parallel: any number of p side by side
    p.named("conv")                         capture: the match exposes the node (value, node list)
    p.keep()                                p's output may also be read outside the match

**Semantics.** A pattern denotes a family of *templates*: DAGs of op vertices (node predicates)
and value variables, with edges ``src -> dst`` that say "an output of src is input ``slot`` of
dst" (``slot`` None means "some input"). An *embedding* maps op vertices injectively to nodes and
variables to values such that

1. every op vertex's predicate holds for its node;
2. every edge holds; for a node whose op is tagged ``commutative`` the explicit slots may be
   permuted (some injective re-assignment of the constrained slots works);
3. a variable used twice binds the same value ("x * Sigmoid(x)");
4. *only used by*: every output of a matched node that is not a sink of the template (and not
   marked ``keep``) is read only by matched nodes and is not a graph output. A value that
   escapes would have to be recomputed or kept, which the rule must allow explicitly.

A *match* is the node set of an embedding that no other embedding of the same pattern strictly
contains: repetition is maximal (the longest chain, the widest fan). The matcher
(``opfuse.patterns.matcher``) finds exactly these; tests compare it with a brute-force enumerator.

Identity matters: the same pattern object used twice in one expression is one vertex, as in
TVM's dataflow patterns, so ``x = Var(); Op("Mul")(x, Op("Sigmoid")(x))`` is SiLU.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.ops.registry import Category


class PatternError(OpfuseError):
    """A malformed pattern (bad repetition bounds, a sequence into a variable, ...)."""


# Predicates --------------------------------------------------------------------------------

NodeCheck = Callable[[object], bool]      # node -> bool
ValueCheck = Callable[[object], bool]     # value -> bool

_ids = itertools.count()


class Constraint:
    """A named predicate, so patterns print readably (``has_attr(axis=1)``)."""

    __slots__ = ("fn", "text")

    def __init__(self, fn: Callable[[object], bool], text: str):
        self.fn = fn
        self.text = text

    def __call__(self, x) -> bool:
        return bool(self.fn(x))

    def __repr__(self) -> str:
        return self.text


def _output(node):
    return node.outputs[0] if node.outputs else None


def _attrs_of(node) -> dict:
    """Attributes with the op's defaults filled in (unknown ops: as written)."""
    from opfuse.ops.registry import REGISTRY
    spec = REGISTRY.get(node.op_type)
    if spec is None:
        return node.attrs
    merged = dict(spec.attrs)
    merged.update(node.attrs)
    return merged


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def has_attr(**expected) -> Constraint:
    """Attribute ``name`` equals the value (defaults filled in); a callable value is a predicate."""
    def check(node):
        attrs = _attrs_of(node)
        for k, want in expected.items():
            if k not in attrs:
                return False
            if callable(want):
                if not want(attrs[k]):
                    return False
            elif not _same(attrs[k], want):
                return False
        return True
    return Constraint(check, "has_attr(" + ", ".join(f"{k}={v!r}" for k, v in expected.items()) + ")")


def _value_of(x):
    return _output(x) if hasattr(x, "op_type") else x


def has_dtype(*dtypes) -> Constraint:
    """The value (or a node's first output) has one of these dtypes."""
    want = {np.dtype(d) for d in dtypes}

    def check(x):
        v = _value_of(x)
        return v is not None and v.type is not None and v.type.dtype in want
    return Constraint(check, f"has_dtype({', '.join(sorted(d.name for d in want))})")


def has_shape(shape) -> Constraint:
    """The value (or a node's first output) has this shape (``None`` entries match any size)."""
    shape = tuple(shape)

    def check(x):
        v = _value_of(x)
        if v is None or v.type is None or len(v.type.shape) != len(shape):
            return False
        return all(w is None or w == d for w, d in zip(shape, v.type.shape, strict=True))
    return Constraint(check, f"has_shape({shape})")


def has_rank(*ranks: int) -> Constraint:
    def check(x):
        v = _value_of(x)
        return v is not None and v.type is not None and len(v.type.shape) in ranks
    return Constraint(check, f"has_rank({', '.join(map(str, ranks))})")


def const_inputs(*slots: int) -> Constraint:
    """The node's inputs at these slots are present compile-time constants."""
    def check(node):
        return all(s < len(node.inputs) and node.inputs[s] is not None and node.inputs[s].is_const
                   for s in slots)
    return Constraint(check, f"const_inputs({', '.join(map(str, slots))})")


def num_inputs(lo: int, hi: int | None = None) -> Constraint:
    """The node has between lo and hi present inputs."""
    hi = lo if hi is None else hi

    def check(node):
        return lo <= len(node.input_values()) <= hi
    return Constraint(check, f"num_inputs({lo}, {hi})")


def check(fn: Callable[[object], bool], text: str | None = None) -> Constraint:
    """Wrap any predicate (node -> bool or value -> bool) as a constraint."""
    return Constraint(fn, text or str(getattr(fn, "__name__", "check")))


# Patterns -----------------------------------------------------------------------------------

class Pattern:
    """Base class: the operators of the algebra."""

    capture: str | None = None

    def __rshift__(self, other: "Pattern") -> "Pattern":
        return Seq(self, _as_pattern(other))

    def __or__(self, other: "Pattern") -> "Pattern":
        other = _as_pattern(other)
        if isinstance(self, OpPattern) and isinstance(other, OpPattern) and self._bare() and other._bare():
            return OpPattern._merged(self, other)
        return Alt(self, other)

    # Repetition ---------------------------------------------------------------------------
    def repeat(self, lo: int, hi: int | None = None) -> "Pattern":
        """``lo``..``hi`` copies chained producer to consumer (``hi`` None: unbounded)."""
        return Repeat(self, lo, hi)

    def plus(self) -> "Pattern":
        return Repeat(self, 1, None)

    def star(self) -> "Pattern":
        return Repeat(self, 0, None)

    def opt(self) -> "Pattern":
        return Repeat(self, 0, 1)

    # Use ----------------------------------------------------------------------------------
    def used_by(self, other: "Pattern") -> "Pattern":
        """``self >> other`` where self's output may also be read outside the match."""
        return Seq(self.keep(), _as_pattern(other))

    def only_used_by(self, other: "Pattern") -> "Pattern":
        """``self >> other`` (the default): self's output is read by matched nodes only."""
        return Seq(self, _as_pattern(other))

    def keep(self) -> "Pattern":
        raise PatternError(f"keep() applies to an op pattern, not {self!r}")

    def named(self, name: str) -> "Pattern":
        clone = self._clone()
        clone.capture = name
        return clone

    def _clone(self) -> "Pattern":
        raise NotImplementedError

    def _label(self, text: str) -> str:
        return f"{text}:{self.capture}" if self.capture else text


def _as_pattern(x) -> Pattern:
    if isinstance(x, Pattern):
        return x
    if isinstance(x, str):
        return Op(x)
    raise PatternError(f"not a pattern: {x!r}")


class OpAlternative:
    """One way an op vertex may match: op types, categories, tags (each None = any), constraints."""

    __slots__ = ("op_types", "categories", "tags", "constraints")

    def __init__(self, op_types=None, categories=None, tags=None, constraints: tuple = ()):
        self.op_types = frozenset(op_types) if op_types else None
        self.categories = frozenset(categories) if categories else None
        self.tags = frozenset(tags) if tags else None
        self.constraints = tuple(constraints)

    def with_constraints(self, more: tuple) -> "OpAlternative":
        return OpAlternative(self.op_types, self.categories, self.tags, self.constraints + tuple(more))

    def admits_type(self, op_type: str, spec) -> bool:
        """Whether a node of this op type could match (constraints aside)."""
        if self.op_types is not None and op_type not in self.op_types:
            return False
        if self.categories is not None and (spec is None or spec.category not in self.categories):
            return False
        return self.tags is None or (spec is not None and bool(self.tags & spec.tags))

    def matches(self, node, spec) -> bool:
        if self.op_types is not None and node.op_type not in self.op_types:
            return False
        if self.categories is not None and (spec is None or spec.category not in self.categories):
            return False
        if self.tags is not None and (spec is None or not (self.tags & spec.tags)):
            return False
        return all(c(node) for c in self.constraints)

    def __repr__(self) -> str:
        parts = []
        if self.op_types:
            parts.append("|".join(sorted(self.op_types)))
        if self.categories:
            parts.append("category=" + "|".join(sorted(c.name for c in self.categories)))
        if self.tags:
            parts.append("tag=" + "|".join(sorted(self.tags)))
        text = ",".join(parts) or "*"
        if self.constraints:
            text += ".where(" + ", ".join(map(repr, self.constraints)) + ")"
        return text


class OpPattern(Pattern):
    """One node. Inputs given by call syntax are bound to slots 0, 1, ...; the rest are free."""

    def __init__(self, alternatives: tuple[OpAlternative, ...], inputs: tuple[Pattern | None, ...] = (),
                 keep: bool = False, capture: str | None = None, entry_slot: int | None = None):
        self.alternatives = alternatives
        self.inputs = inputs
        self.entry_slot = entry_slot
        self.kept = keep
        self.capture = capture
        self.uid = next(_ids)

    def _bare(self) -> bool:
        return not self.inputs and not self.kept and self.capture is None and self.entry_slot is None

    @staticmethod
    def _merged(a: "OpPattern", b: "OpPattern") -> "OpPattern":
        return OpPattern(a.alternatives + b.alternatives)

    def _clone(self) -> "OpPattern":
        return OpPattern(self.alternatives, self.inputs, self.kept, self.capture, self.entry_slot)

    def __call__(self, *inputs) -> "OpPattern":
        """Bind inputs to slots 0..k-1; ``None`` leaves a slot free."""
        clone = self._clone()
        clone.inputs = tuple(None if i is None else _as_pattern(i) for i in inputs)
        for i in clone.inputs:
            if isinstance(i, (Repeat, Many, Par)):
                raise PatternError(f"an input slot takes one op or variable, not {i!r}")
        return clone

    def where(self, *constraints: Constraint) -> "OpPattern":
        """Add constraints (to every alternative: ``(A | B).where(c)`` is ``A.where(c) | B.where(c)``)."""
        clone = self._clone()
        clone.alternatives = tuple(a.with_constraints(constraints) for a in self.alternatives)
        return clone

    def keep(self) -> "OpPattern":
        clone = self._clone()
        clone.kept = True
        return clone

    def at(self, slot: int) -> "OpPattern":
        """``a >> b.at(k)``: the value from ``a`` is input ``k`` of b (by default: any input)."""
        if slot < 0:
            raise PatternError(f"input slot must be >= 0, got {slot}")
        clone = self._clone()
        clone.entry_slot = slot
        return clone

    def matches_node(self, node, spec) -> bool:
        """The vertex predicate: some alternative holds (with its constraints)."""
        fast = self.__dict__.get("_types_only")
        if fast is None:
            # Only op types and no constraints anywhere: the predicate is a set lookup.
            fast = frozenset().union(*[a.op_types or () for a in self.alternatives]) \
                if all(a.op_types is not None and a.categories is None and a.tags is None and not a.constraints
                       for a in self.alternatives) else False
            self._types_only = fast
        if isinstance(fast, frozenset):
            return node.op_type in fast
        for a in self.alternatives:
            if a.matches(node, spec):
                return True
        return False

    def admits_type(self, op_type: str, spec) -> bool:
        return any(a.admits_type(op_type, spec) for a in self.alternatives)

    def __repr__(self) -> str:
        text = "|".join(map(repr, self.alternatives))
        if self.inputs:
            text += "(" + ", ".join("_" if i is None else repr(i) for i in self.inputs) + ")"
        if self.entry_slot is not None:
            text += f".at({self.entry_slot})"
        if self.kept:
            text += ".keep()"
        return self._label(text)


def Op(*op_types: str, category: Category | Iterable[Category] | None = None,
       tag: str | Iterable[str] | None = None) -> OpPattern:
    """An op vertex: op types (alternation), or a category, or a tag (each an alternation too)."""
    cats = None
    if category is not None:
        cats = [category] if isinstance(category, Category) else list(category)
    tags = None
    if tag is not None:
        tags = [tag] if isinstance(tag, str) else list(tag)
    if not op_types and cats is None and tags is None:
        return OpPattern((OpAlternative(),))
    return OpPattern((OpAlternative(op_types or None, cats, tags),))


def AnyOp() -> OpPattern:
    return OpPattern((OpAlternative(),))


class Var(Pattern):
    """A value at the boundary of the match (a graph input, a constant, or an outside node's output).

    The same ``Var`` object used twice binds one value. ``Const()`` is a Var that must be a
    compile-time constant; ``Const(v)`` one whose every element is ``v`` (relative tolerance
    ``CONST_RTOL``).
    """

    def __init__(self, name: str | None = None, *, const: bool = False, value=None,
                 constraints: tuple[Constraint, ...] = ()):
        self.capture = name
        self.const = const or value is not None
        self.value = value
        self.constraints = tuple(constraints)
        self.uid = next(_ids)

    def _clone(self) -> "Var":
        v = Var(self.capture, const=self.const, value=self.value, constraints=self.constraints)
        return v

    def where(self, *constraints: Constraint) -> "Var":
        clone = self._clone()
        clone.constraints = self.constraints + tuple(constraints)
        return clone

    def matches_value(self, value) -> bool:
        if self.const:
            if value.const is None:
                return False
            if self.value is not None:
                data = value.const
                if data.size == 0 or not np.allclose(data.astype(np.float64), self.value, rtol=CONST_RTOL, atol=0.0):
                    return False
        return all(c(value) for c in self.constraints)

    def __repr__(self) -> str:
        if self.const:
            text = "Const()" if self.value is None else f"Const({self.value!r})"
        else:
            text = "Var()"
        if self.constraints:
            text += ".where(" + ", ".join(map(repr, self.constraints)) + ")"
        return self._label(text)


# Relative tolerance when a pattern asks for a specific constant (``Const(1.4142135)`` must
# accept sqrt(2) stored in float32).
CONST_RTOL = 1e-6


def Const(value=None, name: str | None = None) -> Var:
    return Var(name, const=True, value=value)


def Any(name: str | None = None) -> Var:
    return Var(name)


class Seq(Pattern):
    """``a >> b``: every tail (output vertex) of a feeds some free input of every head of b."""

    def __init__(self, first: Pattern, second: Pattern, capture: str | None = None):
        if isinstance(second, Var):
            raise PatternError(f"a sequence cannot flow into a variable: {first!r} >> {second!r}")
        self.first = first
        self.second = second
        self.capture = capture

    def _clone(self) -> "Seq":
        return Seq(self.first, self.second, self.capture)

    def __repr__(self) -> str:
        return self._label(f"({self.first!r} >> {self.second!r})")


class Par(Pattern):
    """``par(a, b, c)``: side by side. Heads and tails are the branches' heads and tails."""

    def __init__(self, branches: tuple[Pattern, ...], capture: str | None = None):
        if len(branches) < 2:
            raise PatternError("par() needs at least two branches")
        self.branches = branches
        self.capture = capture

    def _clone(self) -> "Par":
        return Par(self.branches, self.capture)

    def __repr__(self) -> str:
        return self._label("par(" + ", ".join(map(repr, self.branches)) + ")")


def par(*branches) -> Par:
    return Par(tuple(_as_pattern(b) for b in branches))


class Alt(Pattern):
    """``a | b`` for compound patterns: either one."""

    def __init__(self, first: Pattern, second: Pattern, capture: str | None = None):
        self.first = first
        self.second = second
        self.capture = capture

    def options(self) -> list[Pattern]:
        out = []
        for p in (self.first, self.second):
            if isinstance(p, Alt) and p.capture is None:
                out.extend(p.options())
            else:
                out.append(p)
        return out

    def _clone(self) -> "Alt":
        return Alt(self.first, self.second, self.capture)

    def __repr__(self) -> str:
        return self._label("(" + " | ".join(map(repr, self.options())) + ")")


class Repeat(Pattern):
    """``lo``..``hi`` copies of ``body`` chained: copy i's output feeds copy i+1's free input."""

    def __init__(self, body: Pattern, lo: int, hi: int | None, capture: str | None = None):
        if lo < 0 or (hi is not None and (hi < lo or hi < 1)):
            raise PatternError(f"bad repetition bounds {lo}..{hi}")
        if isinstance(body, Var):
            raise PatternError("a variable cannot repeat")
        self.body = body
        self.lo = lo
        self.hi = hi
        self.capture = capture

    def _clone(self) -> "Repeat":
        return Repeat(self.body, self.lo, self.hi, self.capture)

    def __repr__(self) -> str:
        if (self.lo, self.hi) == (1, None):
            suffix = "+"
        elif (self.lo, self.hi) == (0, None):
            suffix = "*"
        elif (self.lo, self.hi) == (0, 1):
            suffix = "?"
        else:
            suffix = "{%d,%s}" % (self.lo, "" if self.hi is None else self.hi)
        return self._label(f"({self.body!r}){suffix}")


class Many(Pattern):
    """``many(p)``: ``lo``..``hi`` copies of ``p`` side by side (``Conv* -> Concat``)."""

    def __init__(self, body: Pattern, lo: int = 1, hi: int | None = None, capture: str | None = None):
        if lo < 1 or (hi is not None and hi < lo):
            raise PatternError(f"many() needs 1 <= lo <= hi, got {lo}..{hi}")
        if isinstance(body, Var):
            raise PatternError("a variable cannot repeat")
        self.body = body
        self.lo = lo
        self.hi = hi
        self.capture = capture

    def _clone(self) -> "Many":
        return Many(self.body, self.lo, self.hi, self.capture)

    def __repr__(self) -> str:
        return self._label(f"many({self.body!r}, {self.lo}, {self.hi})")


def many(body, lo: int = 1, hi: int | None = None) -> Many:
    return Many(_as_pattern(body), lo, hi)


__all__ = ["Pattern", "PatternError", "Op", "AnyOp", "OpPattern", "OpAlternative", "Var", "Const", "Any",
           "Seq", "Par", "Alt", "Repeat", "Many", "par", "many", "Constraint", "has_attr", "has_dtype",
           "has_shape", "has_rank", "const_inputs", "num_inputs", "check", "CONST_RTOL"]
