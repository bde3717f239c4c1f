"""Explicit SIMD for dense float32 elementwise chains: AVX-512 and AVX2 intrinsics per op, streaming stores.

gcc vectorises a fused elementwise loop (``pointwise.py``), but not well: it if-converts each ternary of Relu,
Clip, HardSigmoid... into compare-and-mask sequences. The x86 max and min instructions *are* those ternaries:
``maxps(a, b)`` is ``a > b ? a : b`` and ``minps(a, b)`` ``a < b ? a : b``, NaN and -0 included (the second
operand when the compare is false), so ``x < lo ? lo : x`` (Relu, Clip's lower bound) is ``maxps(lo, x)`` and
``x > hi ? hi : x`` ``minps(hi, x)``, one instruction each. This emitter writes such a chain as intrinsics, op by
op, each the scalar rule's own operations in the same order (``rules.py``; exp-based ops through ``vecmath``'s
vector forms), so its results are the plain C path's bits lane by lane (a NaN result is NaN, its sign and payload
may differ: where two NaNs meet, x86 returns the first operand's, an order the C leaves to the compiler).
Measured (gcc 12, AVX-512, Zen 4; loop instructions per 16 floats by objdump, compute floor = the kernel over 16K
floats in cache, 1 thread, CPU time, per 16M floats): ``chain8_arith`` (Mul Add Relu Sub LeakyRelu Mul Clip
HardSwish) 26 -> 19 instructions, 4.7 -> 2.9 ms; ``chain8`` (its Sigmoid) 51 -> 36 instructions, 10.2 -> 7.8 ms.

Where: a pointwise stage of ops in ``VECTOR_OPS`` (float32 in and out) whose every operand varies along the whole
innermost loop of its loop nest (``loops.loop_groups``) or not at all (``refusal`` says why not, in the kernel's
notes, and the stage keeps gcc's loop). The outer loops stay scalar loops (split across threads); the innermost
one runs in whole vectors, operands that vary along it loaded there, the values constant along it (a
per-channel scale, a bias) computed by the scalar rules once per pass (``hoist``) and broadcast, its remainder as
the scalar loop body. The vector loop computes ``CodegenOptions.simd_unroll`` (4) vectors an iteration, the leftover
vectors one at a time: an exp-based op's chain is long (a Sigmoid's ~60 cycles from load to store) and four of them
in flight at once keep the vector units busy (chain8's compute floor 0.307 -> 0.241 ns per element with the new
exp_nonpos, Sigmoid alone 0.194 -> 0.129; one run each, load ~23). A dense chain is one loop over the whole
domain; with one Sigmoid (or Silu) whose input it computes, that loop runs in blocks of
``CodegenOptions.simd_stage_block`` floats, each in two passes through two L1 stack buffers (the Sigmoid's input and
its exp(-|x|), then its division and the rest: ``staged_node``), so the core's window holds many short chains
instead of a few ~90-cycle ones (chain8's compute floor 0.26 -> 0.22 ns per element). A build without the
intrinsics' target (``#else``), and the plain C99 build (``simd="none"``), run the scalar loop nest alone.

Streaming stores: a dense stage (one loop) storing one output of at least ``CodegenOptions.stream_store_min_bytes``
that no operand of the stage shares storage with stores it with non-temporal stores (``_mm512_stream_ps``): a regular
store first reads the line it writes (write-allocate), so a kernel writing a fresh output larger than the cache
moves three times its bytes where it could move two. The stores need the output's alignment: the elements before
the first aligned address run as scalar code, the vectors split into ``STREAM_CHUNKS`` contiguous chunks across
threads, each ending with ``_mm_sfence()`` on the thread that wrote it. Such a loop reads its inputs from memory
too: it prefetches each array it loads ``CodegenOptions.stream_prefetch_floats`` elements ahead, a line at a time
(``_prefetch_lines``; chain8 over 16M floats 0.85-0.98x of the time without).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from opfuse.codegen import vecmath
from opfuse.codegen.ctype import literal
from opfuse.codegen.erf import require_vector_erf
from opfuse.codegen.gelu import require_vector_gelu
from opfuse.codegen.index import Index
from opfuse.codegen.loops import emit_loop_nest, loop_groups
from opfuse.codegen.vecmath import AVX2_FLOAT, AVX512_FLOAT, VecIsa
from opfuse.ir.graph import Node, Value
from opfuse.ops.registry import get_spec

STREAM_CHUNKS = 64  # contiguous chunks of a streaming loop, shared by the threads (each one fenced)
F32 = np.dtype(np.float32)
VectorOp = Callable[["VecEval", Node], str]
VECTOR_OPS: dict[str, VectorOp] = {}


def _op(*names: str):
    def deco(fn: VectorOp) -> VectorOp:
        for n in names:
            VECTOR_OPS[n] = fn
        return fn
    return deco


def isas_for(options) -> tuple[VecIsa, ...]:
    """The ISAs the explicit-SIMD loops are written for, widest first (none for the plain C99 build)."""
    if options.simd == "none" or not options.simd_elementwise:
        return ()
    return {"avx512": (AVX512_FLOAT, AVX2_FLOAT), "avx2": (AVX2_FLOAT,)}.get(options.vector_isa, ())


class VecEval:
    """Vector C for values of a chain at the vector of the innermost loop starting at ``idx`` (the ``Evaluator``
    of ``codegen/evaluator.py`` for whole registers): an operand varying along that loop is loaded there
    (``idx`` broadcast to its shape), values constant along it are broadcast from ``invariant`` (``hoist``)."""

    def __init__(self, kc, isa: VecIsa, inline: set[int], loadable: set[int], idx: Index,
                 invariant: dict[int, str] | None = None):
        self.kc, self.isa, self.inline, self.loadable, self.idx = kc, isa, inline, loadable, idx
        self.static = kc.program.memory.static
        self.memo: dict[int, str] = dict(invariant or {})
        # id of a Sigmoid or Silu node -> its input and its exp (``staged_exp_argument``), computed by a staged
        # block's first pass
        self.staged: dict[int, tuple[str, str]] = {}

    def assign(self, expr: str) -> str:
        name = self.kc.tmp("v")
        self.kc.w.line(f"const {self.isa.vt} {name} = {expr};")
        return name

    def scalar(self, value: float) -> str:
        return self.isa.set1(literal(value, F32))

    def at(self, v: Value) -> str:
        hit = self.memo.get(id(v))
        if hit is not None:
            return hit
        p = self.isa.op
        off = self.idx.broadcast_to(v.shape).offset()
        if id(v) in self.static:
            arr = self.static[id(v)]
            name = (self.scalar(arr.reshape(-1)[0]) if arr.size == 1
                    else self.assign(p("loadu_ps", f"{self.kc.static_ptr(v)} + {off}")))
        elif v.producer is not None and id(v.producer) in self.inline:
            expr = VECTOR_OPS[v.producer.op_type](self, v.producer)
            name = expr if expr.isidentifier() else self.assign(expr)
        else:
            name = self.assign(p("loadu_ps", f"{self.kc.ptr(v)} + {off}"))
        self.memo[id(v)] = name
        return name

    def arg(self, node: Node, i: int) -> str:
        return self.at(node.input(i))


def _attrs(node: Node) -> dict:
    return get_spec(node.op_type, node).attrs_of(node)


def _binary(name: str, intrinsic: str) -> None:
    VECTOR_OPS[name] = lambda ve, n: ve.isa.op(intrinsic, ve.arg(n, 0), ve.arg(n, 1))


_binary("Add", "add_ps")
_binary("Sub", "sub_ps")
_binary("Mul", "mul_ps")
_binary("Div", "div_ps")


def _at_least(ve: VecEval, x: str, lo: str) -> str:
    """``x < lo ? lo : x`` (``rules._at_least``) = ``lo > x ? lo : x``: maxps(lo, x)."""
    return ve.assign(ve.isa.op("max_ps", lo, x))


def _at_most(ve: VecEval, x: str, hi: str) -> str:
    """``x > hi ? hi : x`` (``rules._at_most``) = ``hi < x ? hi : x``: minps(hi, x)."""
    return ve.assign(ve.isa.op("min_ps", hi, x))


def _hardsigmoid(ve: VecEval, x: str, alpha: float, beta: float) -> str:
    t = ve.assign(ve.isa.op("add_ps", ve.isa.op("mul_ps", ve.scalar(alpha), x), ve.scalar(beta)))
    return _at_most(ve, _at_least(ve, t, ve.isa.op("setzero_ps")), ve.scalar(1.0))


@_op("Relu")
def _relu(ve: VecEval, n: Node) -> str:
    return _at_least(ve, ve.arg(n, 0), ve.isa.op("setzero_ps"))


@_op("LeakyRelu")
def _leaky(ve: VecEval, n: Node) -> str:
    x = ve.arg(n, 0)
    slope = ve.isa.op("mul_ps", x, ve.scalar(_attrs(n)["alpha"]))
    return ve.isa.select(x, ve.isa.op("setzero_ps"), "_CMP_GE_OQ", x, slope)


@_op("PRelu")
def _prelu(ve: VecEval, n: Node) -> str:
    x, s = ve.arg(n, 0), ve.arg(n, 1)
    return ve.isa.select(x, ve.isa.op("setzero_ps"), "_CMP_LT_OQ", ve.isa.op("mul_ps", x, s), x)


@_op("HardSigmoid")
def _hsig(ve: VecEval, n: Node) -> str:
    a = _attrs(n)
    return _hardsigmoid(ve, ve.arg(n, 0), a["alpha"], a["beta"])


@_op("HardSwish")
def _hswish(ve: VecEval, n: Node) -> str:
    x = ve.arg(n, 0)
    return ve.isa.op("mul_ps", x, _hardsigmoid(ve, x, 1 / 6, 0.5))


@_op("Clip")
def _clip(ve: VecEval, n: Node) -> str:
    a = _attrs(n)
    y = ve.arg(n, 0)
    for i, attr, bound in ((1, "min", _at_least), (2, "max", _at_most)):
        v = n.inputs[i] if len(n.inputs) > i else None
        if v is not None:
            y = bound(ve, y, ve.at(v))
        elif a.get(attr) is not None:
            y = bound(ve, y, ve.scalar(a[attr]))
    return y


@_op("Max", "Min", "Sum")
def _fold(ve: VecEval, n: Node) -> str:
    acc = ve.arg(n, 0)
    for i in range(1, len(n.input_values())):
        b = ve.arg(n, i)
        if n.op_type == "Sum":
            acc = ve.assign(ve.isa.op("add_ps", acc, b))
        else:  # rules.nan_max / nan_min: a PRED b || a != a ? a : b
            acc = ve.assign(ve.isa.select_or_nan(acc, b, "_CMP_GT_OQ" if n.op_type == "Max" else "_CMP_LT_OQ", acc, b))
    return acc


@_op("Neg")
def _neg(ve: VecEval, n: Node) -> str:
    return ve.isa.bits(ve.arg(n, 0), "xor", vecmath.SIGN_BIT)


@_op("Abs")
def _abs(ve: VecEval, n: Node) -> str:
    return ve.isa.bits(ve.arg(n, 0), "and", vecmath.ABS_BITS)


@_op("Sqrt")
def _sqrt(ve: VecEval, n: Node) -> str:
    return ve.isa.op("sqrt_ps", ve.arg(n, 0))


@_op("Reciprocal")
def _reciprocal(ve: VecEval, n: Node) -> str:
    return ve.isa.op("div_ps", ve.scalar(1.0), ve.arg(n, 0))


@_op("Identity")
def _identity(ve: VecEval, n: Node) -> str:
    return ve.arg(n, 0)


@_op("Exp")
def _exp(ve: VecEval, n: Node) -> str:
    return f"{vecmath.require_vector(ve.kc.program, vecmath.EXP, ve.isa)}({ve.arg(n, 0)})"


def _sigmoid_of(ve: VecEval, n: Node, x: str) -> str:
    """sigmoid(x) of node ``n``'s input ``x``: in a staged block's second pass from the exp the first one stored."""
    staged = ve.staged.get(id(n))
    if staged is not None:
        return f"{vecmath.require_vector(ve.kc.program, vecmath.SIGMOID_TAIL, ve.isa)}({staged[0]}, {staged[1]})"
    return f"{vecmath.require_vector(ve.kc.program, vecmath.SIGMOID, ve.isa)}({x})"


@_op("Sigmoid")
def _sigmoid(ve: VecEval, n: Node) -> str:
    return _sigmoid_of(ve, n, ve.arg(n, 0))


def _vecmath_call(fn: str) -> VectorOp:
    """The op as a call of ``vecmath``'s vector form ``fn`` on its one operand."""
    def emit(ve: VecEval, n: Node) -> str:
        return f"{vecmath.require_vector(ve.kc.program, fn, ve.isa)}({ve.arg(n, 0)})"
    return emit


for _name, _fn in (("Tanh", vecmath.TANH), ("Log", vecmath.LOG), ("Softplus", vecmath.SOFTPLUS)):
    _op(_name)(_vecmath_call(_fn))


@_op("Erf")
def _erf(ve: VecEval, n: Node) -> str:
    return f"{require_vector_erf(ve.kc.program, ve.isa)}({ve.arg(n, 0)})"


@_op("Gelu")
def _gelu(ve: VecEval, n: Node) -> str:
    """``rules._gelu``: with approximate="tanh" x sigmoid(2z), else x Phi(x) by ``gelu.py``'s polynomial."""
    x = ve.arg(n, 0)
    p = ve.isa.op
    if _attrs(n)["approximate"] != "tanh":
        return f"{require_vector_gelu(ve.kc.program, ve.isa)}({x})"
    x3 = ve.assign(p("mul_ps", p("mul_ps", x, x), x))
    z2 = p("mul_ps", ve.scalar(2 * math.sqrt(2 / math.pi)), p("add_ps", x, p("mul_ps", ve.scalar(0.044715), x3)))
    return p("mul_ps", x, f"{vecmath.require_vector(ve.kc.program, vecmath.SIGMOID, ve.isa)}({z2})")


@_op("Silu")
def _silu(ve: VecEval, n: Node) -> str:
    """``rules._silu``: ``x / (1 + exp(-x))`` with ``CodegenOptions.silu_direct``, else ``x * sigmoid(x)``."""
    x = ve.arg(n, 0)
    if not ve.kc.program.options.silu_direct:
        return ve.isa.op("mul_ps", x, _sigmoid_of(ve, n, x))
    staged = ve.staged.get(id(n))
    if staged is not None:
        return f"{vecmath.require_vector(ve.kc.program, vecmath.SILU_TAIL, ve.isa)}({staged[0]}, {staged[1]})"
    return f"{vecmath.require_vector(ve.kc.program, vecmath.SILU, ve.isa)}({x})"


def staged_exp_argument(ve: VecEval, n: Node, x: str) -> str:
    """What a staged block's first pass takes ``exp_nonpos`` of for node ``n`` (a ``STAGED_OPS`` op) with input
    ``x``: ``-max(x, -89)`` for a direct Silu (``vecmath.silu_exp_argument``), else ``-|x|``."""
    if n.op_type == "Silu" and ve.kc.program.options.silu_direct:
        return vecmath.silu_exp_argument(ve.isa, x)
    return ve.isa.bits(x, "or", vecmath.SIGN_BIT)


def staged_exp_helper(kc, n: Node) -> str:
    """The exp a staged block's first pass calls for node ``n``: silu's own (``vecmath.SILU_EXP``: its argument goes
    up to 89) for a direct Silu, else ``exp_nonpos``."""
    return vecmath.SILU_EXP if n.op_type == "Silu" and kc.program.options.silu_direct else vecmath.EXP_NONPOS


STAGED_OPS = ("Sigmoid", "Silu")  # whose exp a staged block computes in its first pass


def staged_node(outs: list[Value], inline: set[int]) -> Node | None:
    """The one Sigmoid or Silu of the chain storing ``outs`` whose input the chain computes (None with none or
    more, or one that reads its input from memory: one pass; a lone Sigmoid's chain is short enough as it is, and
    the buffers cost it 5-10%)."""
    found: dict[int, Node] = {}
    seen: set[int] = set()
    todo = list(outs)
    while todo:
        v = todo.pop()
        p = v.producer
        if id(v) in seen or p is None or id(p) not in inline:
            continue
        seen.add(id(v))
        if p.op_type in STAGED_OPS:
            found[id(p)] = p
        todo.extend(p.input_values())
    if len(found) != 1:
        return None
    node = next(iter(found.values()))
    producer = node.input(0).producer
    return node if producer is not None and id(producer) in inline else None


def _varies(v: Value, shape, inner: tuple[int, int]) -> bool | None:
    """Whether ``v`` (broadcast to ``shape``) varies along the axes ``inner`` of the innermost loop: True along
    all of them, False along none, None partly (the loop groups keep that from happening)."""
    rank = len(shape)
    full = (1,) * (rank - len(v.shape)) + tuple(v.shape)
    axes = [full[d] != 1 for d in range(*inner) if shape[d] != 1]
    return True if all(axes) else (False if not any(axes) else None)


# A value the chain reads from memory (or a bound one, an anchor's result), classified along the vector loop:
# True: it varies along it (loaded a vector at a time); False: it is constant along it (computed once per pass,
# ``hoist``); a string: why the chain cannot run in vectors.
Leaf = Callable[[Value], "bool | str"]


def chain_invariants(kc, outs: list[Value], inline: set[int], leaf: Leaf) -> list[Value]:
    """The values the chain storing ``outs`` reads that are constant along its vector loop (and not scalar
    constants), each computed once per pass of it (``hoist``), outermost first: those of them a varying value or
    an output reads. ``leaf`` classifies the values it reads from memory (``chain_refusal`` accepted them)."""
    static = kc.program.memory.static
    memo: dict[int, bool] = {}

    def constant(v: Value) -> bool:
        if id(v) not in memo:
            p = v.producer
            if id(v) in static and static[id(v)].size == 1:
                memo[id(v)] = True
            elif p is not None and id(p) in inline and id(v) not in static:
                memo[id(v)] = all(constant(u) for u in p.input_values())
            else:
                memo[id(v)] = leaf(v) is False
        return memo[id(v)]
    return [v for v in chain_stops(kc, outs, inline, constant) if constant(v)]


def chain_stops(kc, outs: list[Value], inline: set[int], stop: Callable[[Value], bool]) -> list[Value]:
    """The values where a walk from ``outs`` through the nodes computed inline stops, each once, in the walk's
    order: those ``stop`` accepts and those the chain reads from memory (a value no inline node computes, or a
    stored constant), scalar constants left out."""
    static = kc.program.memory.static
    found: list[Value] = []
    seen: set[int] = set()
    todo = list(outs)
    while todo:
        v = todo.pop()
        if id(v) in seen or (id(v) in static and static[id(v)].size == 1):
            continue
        seen.add(id(v))
        if stop(v) or v.producer is None or id(v.producer) not in inline or id(v) in static:
            found.append(v)
        else:
            todo.extend(v.producer.input_values())
    return found


def chain_refusal(kc, outs: list[Value], inline: set[int], leaf: Leaf) -> str | None:
    """Why the values ``outs`` are no float32 chain of ``VECTOR_OPS`` (computed from the ``inline`` nodes) over
    values that ``leaf`` accepts (None: they are)."""
    static = kc.program.memory.static
    seen: set[int] = set()
    todo = list(outs)
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v.dtype != F32:
            return f"value '{v.name}' is {v.dtype}, not float32"
        p = v.producer
        if id(v) in static and static[id(v)].size == 1:
            continue
        if p is not None and id(p) in inline and id(v) not in static:
            if p.op_type not in VECTOR_OPS:
                return f"op {p.op_type} has no vector form"
            if p.op_type == "Clip" and any(u is not None and not (id(u) in static and static[id(u)].size == 1)
                                           for u in p.inputs[1:]):
                return "Clip's bounds are not constants"
            todo.extend(p.input_values())
            continue
        kind = leaf(v)
        if isinstance(kind, str):
            return kind
    return None


def _loop_leaf(kc, loadable: set[int], shape, inner: tuple[int, int]) -> Leaf:
    """``Leaf`` of a loop nest over ``shape`` whose innermost loop runs over the axes ``inner``: a value read
    varies along the whole loop or not at all (``_varies``), and is stored or a weight."""
    static = kc.program.memory.static

    def leaf(v: Value) -> bool | str:
        varies = _varies(v, shape, inner)
        if varies is None:
            return f"operand '{v.name}' is broadcast along part of the innermost loop"
        if id(v) not in static and id(v) not in loadable:
            return f"value '{v.name}' is neither stored nor computable here"
        return varies
    return leaf


def invariants(kc, outs: list[Value], inline: set[int], shape, inner: tuple[int, int]) -> list[Value]:
    """``chain_invariants`` of the loop nest over ``shape`` (its innermost loop over the axes ``inner``)."""
    return chain_invariants(kc, outs, inline, lambda v: _varies(v, shape, inner) is not False)


def refusal(kc, outs: list[Value], inline: set[int], loadable: set[int], shape, inner: tuple[int, int]) -> str | None:
    """Why the stage storing ``outs`` over ``shape`` (its innermost loop over the axes ``inner``) is no float32
    chain of ``VECTOR_OPS`` whose operands each vary along that whole loop or not at all (None: it is)."""
    if any(v.dtype != F32 or v.size != math.prod(shape) for v in outs):
        return "an output is not float32 over the whole domain"
    return chain_refusal(kc, outs, inline, _loop_leaf(kc, loadable, shape, inner))


def emit(kc, ev, stage_node: Node, outs: list[Value], inline: set[int], loadable: set[int], shape, cost: int,
         body: Callable[[Index], None], mergeable) -> bool:
    """The stage as explicit-SIMD loops behind ``#if`` on each ISA of ``isas_for``, the scalar loop nest under
    ``#else``; False (only a note written, with ``refusal``'s reason) where the stage is no such chain, and
    where the build has no such ISA (nothing written)."""
    isas = isas_for(kc.program.options)
    if not isas:
        return False
    groups = loop_groups(shape, mergeable)
    inner = groups[-1]
    reason = ("the innermost loop is shorter than a vector" if math.prod(shape[inner[0]:inner[1]]) < isas[-1].lanes
              else refusal(kc, outs, inline, loadable, shape, inner))
    if reason is not None:
        kc.note(lambda name: f"{name}: elementwise loop left to the C compiler's vectoriser ({reason})", stage_node)
        return False
    stream = len(groups) == 1 and _streams(kc, outs, inline)
    vecmath.require_immintrin(kc.program)
    kc.note(lambda name: f"{name}: elementwise loop in {' / '.join(i.name for i in isas)} intrinsics"
            + (f", non-temporal stores ({outs[0].nbytes >> 20} MiB output)" if stream else ""), stage_node)
    hoisted = invariants(kc, outs, inline, shape, inner)
    for k, isa in enumerate(isas):
        kc.w.line(f"#{'if' if k == 0 else 'elif'} {isa.guard}")
        with kc.w.block(""), ev.scope(), ev.twin():
            _emit_isa(kc, ev, isa, outs, inline, loadable, shape, groups, hoisted, cost, body, stream)
    kc.w.line("#else")
    emit_loop_nest(kc, ev, shape, body, mergeable=mergeable, cost_per_element=cost)
    kc.w.line("#endif")
    return True


def store_vector(kc, isa: VecIsa, inline: set[int], loadable: set[int], idx: Index, outs: list[Value],
                 known: dict[int, str], stream: bool = False) -> None:
    """Compute the vector of each of ``outs`` at ``idx`` (``VecEval``; ``known``: vectors already computed, by
    value id) and store it there (``stream``: with a non-temporal store)."""
    _store(VecEval(kc, isa, inline, loadable, idx, known), outs, stream)


def _store(ve: VecEval, outs: list[Value], stream: bool) -> None:
    """Store each of ``outs``'s vectors at ``ve``'s index (``stream``: with a non-temporal store)."""
    op = "stream_ps" if stream else "storeu_ps"
    for v in outs:
        ve.kc.w.line(f"{ve.isa.op(op, f'{ve.kc.ptr(v, write=True)} + {ve.idx.offset()}', ve.at(v))};")


def hoist(kc, ev, isa: VecIsa, values: list[Value], idx: Index) -> dict[int, str]:
    """``values`` (constant along the innermost loop) at ``idx``, computed by the scalar rules (the C loop's bits)
    and broadcast to every lane, before the loop: id -> vector name."""
    names = {}
    for v in values:
        names[id(v)] = kc.tmp("u")
        kc.w.line(f"const {isa.vt} {names[id(v)]} = {isa.set1(ev.at(v, idx.broadcast_to(v.shape)))};")
    return names


def _streams(kc, outs: list[Value], inline: set[int]) -> bool:
    """Store with non-temporal stores: one output, at least ``stream_store_min_bytes``, in storage that no
    value the stage reads shares (not in place)."""
    if len(outs) != 1 or outs[0].nbytes < kc.program.options.stream_store_min_bytes:
        return False
    mem = kc.program.memory
    out = mem.location(outs[0])
    seen: set[int] = set()
    todo = [outs[0]]
    while todo:
        v = todo.pop()
        if id(v) in seen or id(v) in mem.static:
            continue
        seen.add(id(v))
        if v.producer is not None and id(v.producer) in inline:
            todo.extend(v.producer.input_values())
        else:
            loc = mem.location(v)
            if (loc.region, loc.index) == (out.region, out.index) and loc.offset < out.offset + outs[0].nbytes \
                    and out.offset < loc.offset + v.nbytes:
                return False
    return True


def _dense_leaves(kc, outs: list[Value], inline: set[int], shape, inner: tuple[int, int]) -> list[Value]:
    """The values the chain storing ``outs`` loads from memory a vector at a time (varying along its vector loop),
    in the order a walk from the outputs meets them."""
    return [v for v in chain_stops(kc, outs, inline, lambda v: False) if _varies(v, shape, inner) is True]


def _prefetch_lines(kc, leaves: list[Value], idx: Index, floats: int) -> None:
    """Prefetch (into L1) the 64-byte lines of each of ``leaves`` that the ``floats`` elements from ``idx`` on will
    read ``CodegenOptions.stream_prefetch_floats`` elements later; the address is computed as an integer, so it may
    run past the array's end (a prefetch never faults)."""
    ahead = kc.program.options.stream_prefetch_floats
    for v in leaves:
        at = f"(uintptr_t)({kc.ptr(v)} + {idx.broadcast_to(v.shape).offset()})"
        for k in range(0, floats, 16):
            kc.w.line(f"_mm_prefetch((const char*)({at} + {(ahead + k) * 4}u), _MM_HINT_T0);")


def _parallel(kc, work: int, collapse: int = 1) -> None:
    """The parallel-loop marker of ``KernelContext.parallel_for`` (static chunks), not recorded as another loop of the
    kernel: the scalar loop nest under ``#else`` records the split (``KernelInfo.parallel``)."""
    if work >= kc.program.options.parallel_min_work:
        kc.uses_threads = True
        col = f" collapse({collapse})" if collapse > 1 else ""
        kc.w.line(f"OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static){col} if(nt > 1))")


def _emit_isa(kc, ev, isa: VecIsa, outs, inline, loadable, shape, groups, hoisted, cost, body, stream: bool) -> None:
    """One ISA's loops: the outer loop groups as scalar loops, the innermost one in vectors (streaming: in
    fenced chunks after a scalar peel to the output's alignment) and its remainder as the scalar body."""
    w = kc.w
    lanes, total = isa.lanes, math.prod(shape)
    outer = [(a, b, kc.tmp("o")) for a, b in groups[:-1]]
    a_in, b_in = groups[-1]
    extent = math.prod(shape[a_in:b_in])

    def at(i: str) -> Index:
        return Index.loops(shape, [*outer, (a_in, b_in, i)])

    def scalar(lo: str, hi: str) -> None:
        i = kc.tmp("i")
        with w.block(f"for (long {i} = {lo}; {i} < {hi}; ++{i})"), ev.scope():
            body(at(i))

    def vector(i: str, invariant: dict[int, str]) -> None:
        store_vector(kc, isa, inline, loadable, at(i), outs, invariant, stream)

    for depth, (a, b, var) in enumerate(outer):
        n = math.prod(shape[a:b])
        if depth == 0:
            _parallel(kc, total * cost, 2 if len(outer) > 1 and n < kc.program.options.parallel_min_outer else 1)
        w.line(f"for (long {var} = 0; {var} < {n}; ++{var}) {{")
        w.level += 1
    def vectors(i: str, count: int, invariant: dict[int, str]) -> None:
        """``count`` vectors from element ``i`` on, one after the other (the core overlaps their chains)."""
        vector(i, invariant)
        for k in range(1, count):
            ik = kc.tmp("i")
            w.line(f"const long {ik} = {i} + {k * lanes};")
            vector(ik, invariant)

    unroll = kc.program.options.simd_unroll
    staged = staged_node(outs, inline) if not outer else None
    block = kc.program.options.simd_stage_block if staged is not None else 0
    leaves = (_dense_leaves(kc, outs, inline, shape, groups[-1])
              if stream and kc.program.options.stream_prefetch_floats else [])

    def prefetch(i: str, floats: int) -> None:
        """The streaming loop's prefetches for the ``floats`` elements from ``i`` on."""
        _prefetch_lines(kc, leaves, at(i), floats)

    def staged_block(i0: str, invariant: dict[int, str]) -> None:
        """``block`` elements from ``i0`` on in two passes through two stack buffers: the staged Sigmoid's input
        and its exp(-|x|) for every vector of the block, then its division and the rest of the chain."""
        assert staged is not None
        bx, be = kc.tmp("sx"), kc.tmp("se")
        w.line(f"float {bx}[{block}] __attribute__((aligned(64))), {be}[{block}] __attribute__((aligned(64)));")
        step = lanes * unroll if block % (lanes * unroll) == 0 else lanes
        exp = vecmath.require_vector(kc.program, staged_exp_helper(kc, staged), isa)
        for second in (False, True):
            j = kc.tmp("j")
            with w.block(f"for (long {j} = 0; {j} < {block}; {j} += {step})"):
                if leaves and not second:
                    ij = kc.tmp("i")
                    w.line(f"const long {ij} = {i0} + {j};")
                    prefetch(ij, step)
                for k in range(step // lanes):
                    jk = j
                    if k:
                        jk = kc.tmp("j")
                        w.line(f"const long {jk} = {j} + {k * lanes};")
                    i = kc.tmp("i")
                    w.line(f"const long {i} = {i0} + {jk};")
                    ve = VecEval(kc, isa, inline, loadable, at(i), invariant)
                    if not second:
                        x = ve.at(staged.input(0))
                        e = ve.assign(f"{exp}({staged_exp_argument(ve, staged, x)})")  # exp(-|x|) or silu's
                        w.line(f"{isa.op('store_ps', f'{bx} + {jk}', x)}; {isa.op('store_ps', f'{be} + {jk}', e)};")
                        continue
                    x = ve.assign(isa.op("load_ps", f"{bx} + {jk}"))
                    ve.memo[id(staged.input(0))] = x
                    ve.staged[id(staged)] = (x, ve.assign(isa.op("load_ps", f"{be} + {jk}")))
                    _store(ve, outs, stream)

    with ev.scope():
        invariant = hoist(kc, ev, isa, hoisted, at("0"))
        if not stream:
            nb = extent // block if block else 0
            if nb:
                b = kc.tmp("k")
                _parallel(kc, total * cost)
                with w.block(f"for (long {b} = 0; {b} < {nb}; ++{b})"):
                    staged_block(f"{b} * {block}", invariant)
            first = nb * block // lanes
            nv = extent // lanes
            nu = first + (nv - first) // unroll * unroll
            if not outer and not nb:
                _parallel(kc, total * cost)
            if nu > first:
                vi, i = kc.tmp("b"), kc.tmp("i")
                with w.block(f"for (long {vi} = {first}; {vi} < {nu}; {vi} += {unroll})"):
                    w.line(f"const long {i} = {vi} * {lanes};")
                    vectors(i, unroll, invariant)
            if nu < nv:
                vi, i = kc.tmp("b"), kc.tmp("i")
                with w.block(f"for (long {vi} = {nu}; {vi} < {nv}; ++{vi})"):
                    w.line(f"const long {i} = {vi} * {lanes};")
                    vector(i, invariant)
            if nv * lanes < extent:
                scalar(str(nv * lanes), str(extent))
        else:
            _stream_loops(kc, isa, outs, total, scalar, lambda i, count: vectors(i, count, invariant), cost, unroll,
                          (block, lambda i0: staged_block(i0, invariant)) if block else None,
                          prefetch if leaves else None)
    for _ in outer:
        w.level -= 1
        w.line("}")


def _stream_loops(kc, isa: VecIsa, outs, total: int, scalar, vectors, cost: int, unroll: int,
                  staged: tuple[int, Callable[[str], None]] | None = None,
                  prefetch: Callable[[str, int], None] | None = None) -> None:
    """One dense loop over ``total`` elements with streaming stores: a scalar peel to the output's alignment,
    the vectors in ``STREAM_CHUNKS`` chunks each fenced by the thread that wrote it (``staged``: (block, emit) its
    whole blocks first; ``unroll`` vectors an iteration, each iteration first calling ``prefetch`` (i, its
    elements), the chunk's leftover vectors one at a time), the scalar remainder."""
    w, lanes = kc.w, isa.lanes
    out = kc.ptr(outs[0], write=True)
    head, nv, c, i, end = kc.tmp("h"), kc.tmp("n"), kc.tmp("c"), kc.tmp("i"), kc.tmp("e")
    align = lanes * 4
    w.line(f"const long {head}0 = (long)(((uintptr_t)0 - (uintptr_t){out}) & {align - 1}u) / 4;  "
           f"/* floats before the first {align}-byte aligned one */")
    w.line(f"const long {head} = {head}0 < {total} ? {head}0 : {total};")
    scalar("0", head)
    w.line(f"const long {nv} = ({total} - {head}) / {lanes};")
    _parallel(kc, total * cost)
    with w.block(f"for (long {c} = 0; {c} < {STREAM_CHUNKS}; ++{c})"):
        w.line(f"const long {end} = {head} + {nv} * ({c} + 1) / {STREAM_CHUNKS} * {lanes};")
        w.line(f"long {i} = {head} + {nv} * {c} / {STREAM_CHUNKS} * {lanes};")
        if staged is not None:
            with w.block(f"for (; {i} + {staged[0]} <= {end}; {i} += {staged[0]})"):
                staged[1](i)
        if unroll > 1:
            with w.block(f"for (; {i} + {unroll * lanes} <= {end}; {i} += {unroll * lanes})"):
                if prefetch is not None:
                    prefetch(i, unroll * lanes)
                vectors(i, unroll)
        with w.block(f"for (; {i} < {end}; {i} += {lanes})"):
            vectors(i, 1)
        w.line("_mm_sfence();  /* this thread's non-temporal stores, before the kernel returns */")
    scalar(f"{head} + {nv} * {lanes}", str(total))
