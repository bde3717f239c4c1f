"""``KernelContext``: one C function being generated for one fusion group.

It hands out the function's parameters (one pointer per distinct storage location the
kernel touches, so an in-place input/output pair shares one pointer and ``restrict``
stays truthful), local temporaries, per-thread scratch space, compile-time constants and
run-time fault flags, and writes the function body through a ``CWriter``.

Faults: a check that can fail at run time (an integer division by zero, a Gather index out
of range; ``checks.py``) ORs its condition into a flag, one ``int`` per node, and computes on
with a safe value, so nothing traps or reads out of bounds. Flags are OR-reductions of every
parallel loop (a plain shared store would lose updates), and a kernel with flags returns the
fault code of the first node (in node order) whose flag is set, 0 otherwise; ``opfuse_run``
returns that code at once (``program.py``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from collections.abc import Callable, Sequence

import numpy as np

from opfuse.codegen.ctype import c_type
from opfuse.codegen.names import c_ident
from opfuse.codegen.outline import DYNAMIC_CLAUSE, STATIC_CLAUSE, Outliner, strip
from opfuse.codegen.writer import CWriter
from opfuse.errors import UnsupportedOpError
from opfuse.ir.graph import Value
from opfuse.ir.plan import FusionGroup

SCRATCH_ALIGN = 64  # bytes between scratch regions of one kernel (cache-line aligned tiles)
# A loop marked ``contiguous`` (``KernelContext.parallel_for``) keeps static blocks where they give every thread
# count of ``CodegenOptions.balance_threads`` at least this efficiency (speed-up / threads).
STATIC_MIN_EFFICIENCY = 0.95
# A kernel whose loops gcc may vectorise 512 bits wide (``KernelContext.vector_512``): the macro before its
# functions' storage class, and its definition (GCC only; where the compiler's target has AVX-512F).
VECTOR_512 = "OPFUSE_VECTOR_512"
VECTOR_512_C = f"""\
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#define {VECTOR_512} __attribute__((target("prefer-vector-width=512")))
#else
#define {VECTOR_512}
#endif
"""
_LOOP_HEAD = re.compile(r"\s*for \(long (\w+) = 0; \1 < (\d+); \+\+\1\)")
# Every kernel is a function of its own (``OPFUSE_KERNEL``), never inlined into ``opfuse_run``. Inlined,
# each kernel's ``restrict`` parameters still describe only its own body, but gcc 12.2 at -O3 let the
# basic-block (SLP) vectoriser of ``opfuse_run`` move one kernel's loads of an arena buffer above the
# previous kernel's stores into that same buffer: a Split of a Split of a LayerNorm read the Resize values
# the buffer held before (tests/e2e/repro/nested_split_of_a_layernorm; right at -O2, with
# -fno-tree-slp-vectorize, without ``restrict``, or with kernels out of line). A call per kernel costs
# nothing next to a kernel, and the micro-kernels learned the same of inlining (``microkernel.NOINLINE``).
KERNEL_ATTRIBUTE = """\
#if defined(__GNUC__)
#define OPFUSE_KERNEL __attribute__((noinline))
#else
#define OPFUSE_KERNEL
#endif
"""


@dataclass(frozen=True)
class ParallelLoop:
    """A loop of a kernel split across threads: its iterations (all collapsed loops'), the work it
    was priced at (``parallel_for``), its schedule (OpenMP's names), and each iteration's relative cost where
    the generator knows they differ (``costs``; empty: equal). ``speedup(n)``: what the split allows
    on ``n`` free cores, from the code alone (no memory bandwidth, no fork/join cost)."""

    iterations: int
    work: int
    schedule: str
    costs: tuple[float, ...] = ()

    def speedup(self, threads: int) -> float:
        costs = list(self.costs) or [1.0] * self.iterations
        if not costs or threads <= 1:
            return 1.0
        if self.schedule == "static":  # contiguous near-equal chunks
            size = -(-len(costs) // threads)
            span = max(sum(costs[i:i + size]) for i in range(0, len(costs), size))
        else:  # in order, each to the first thread that is free
            free = [0.0] * threads
            for c in costs:
                free[free.index(min(free))] += c
            span = max(free)
        return sum(costs) / span if span else 1.0


class UnsupportedGroupError(UnsupportedOpError):
    """A fusion group the C backend cannot compile (names the group and why)."""

    def __init__(self, group: FusionGroup, detail: str):
        super().__init__(f"fusion group of kind '{group.kind}'", group.name, detail=detail)
        self.group = group


@dataclass
class Param:
    name: str
    ctype: str
    writable: bool
    expr_key: tuple  # what the run function passes: ("arena"|"input"|"output"|"weights", index, offset)


class KernelContext:
    def __init__(self, program, group: FusionGroup, index: int):
        self.program = program
        self.group = group
        self.index = index
        self.name = program.names.fresh(group.name, f"k{index}")
        self.w = CWriter(indent=1)
        self.params: dict[tuple, Param] = {}
        self._tmp = 0
        self.scratch_bytes = 0
        self.scratch_guards: list[tuple[int, int]] = []  # (offset, bytes) with ``CodegenOptions.scratch_guard_bytes``
        self.uses_threads = False
        self.vector_512 = False  # the kernel's functions carry ``VECTOR_512`` (``wide_vectors``)
        # (pragma's line, work, collapse, costs, static where its blocks are balanced)
        self._parallel: list[tuple[int, int, int, tuple[float, ...], bool]] = []
        self.loops: list[ParallelLoop] = []  # the parallel loops written (``_schedules``)
        # (id(node), message) -> (node position, flag, fault code)
        self.faults: dict[tuple[int, str], tuple[int, str, int]] = {}
        self.checked: set[int] = set()  # ids of nodes whose operands were checked before the loops
        self.notes: list[str] = []  # algorithm choices (Winograd or direct ...), for the report
        self._comment_notes: list[str] = []  # the same, in the C comment (names as C identifiers)
        self.loop_ranges: dict[str, tuple[int, int]] = {}  # loop variable -> [lo, hi) of a split loop being written

    def note(self, describe: Callable[[str], str], node) -> None:
        """Record a choice this kernel made for ``node``: ``describe(name)`` with the node's own name
        in ``KernelInfo.notes`` (the report), with its C identifier in the kernel's comment (a
        model's names never reach the C text as they are)."""
        self.notes.append(describe(node.name))
        self._comment_notes.append(describe(c_ident(node.name, "node")).replace("*/", "* /"))

    # Names --------------------------------------------------------------------------------
    def tmp(self, prefix: str = "t") -> str:
        self._tmp += 1
        return f"{prefix}{self._tmp}"

    def error(self, detail: str) -> UnsupportedGroupError:
        return UnsupportedGroupError(self.group, detail)

    # Parameters ---------------------------------------------------------------------------
    def _param(self, key: tuple, ctype: str, hint: str, writable: bool) -> str:
        full = key + (ctype,)
        p = self.params.get(full)
        if p is None:
            p = Param(f"p{len(self.params)}_{c_ident(hint, 'v')[2:]}".rstrip("_"), ctype, writable, key)
            self.params[full] = p
        p.writable |= writable
        return p.name

    def ptr(self, v: Value, *, write: bool = False) -> str:
        """Pointer parameter to the storage of ``v`` (typed by its dtype)."""
        mem = self.program.memory
        if mem.is_static(v):
            return self.static_ptr(v)
        loc = mem.location(v)
        return self._param(loc.key(), c_type(v.dtype, v.name), v.name, write)

    def static_ptr(self, v: Value) -> str:
        arr = self.program.memory.static[id(v)]
        return self.const_array(("value", v.name), arr, v.name, v.dtype)

    def const_array(self, key: tuple, array: np.ndarray, hint: str, dtype=None) -> str:
        """Pointer parameter to a read-only array placed in the weights blob under ``key``."""
        dt = np.dtype(dtype if dtype is not None else array.dtype)
        offset = self.program.weights.add(key, np.ascontiguousarray(np.asarray(array, dtype=dt)))
        return self._param(("weights", 0, offset), c_type(dt, hint), hint, False)

    # Scratch ------------------------------------------------------------------------------
    def scratch(self, nbytes: int) -> int:
        """Reserve ``nbytes`` of this thread's scratch; returns the byte offset in it. With
        ``CodegenOptions.scratch_guard_bytes``, a guard follows the region from its exact end (one precedes
        the first region), recorded in ``scratch_guards`` for ``opfuse_run`` to fill and check."""
        guard = self.program.options.scratch_guard_bytes
        if guard and not self.scratch_guards:
            self.scratch_guards.append((self.scratch_bytes, guard))
            self.scratch_bytes += guard
        off = self.scratch_bytes
        self.scratch_bytes += -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
        if guard:
            self.scratch_guards.append((off + nbytes, self.scratch_bytes + guard - (off + nbytes)))
            self.scratch_bytes += guard
        return off

    def scratch_ptr(self, ctype: str, offset: int) -> str:
        """C expression: this thread's scratch at ``offset`` as ``ctype*`` (inside a parallel region)."""
        return f"(({ctype}*)(scratch + (size_t)OPFUSE_TID() * OPFUSE_SCRATCH_STRIDE + {offset}))"

    # Faults -------------------------------------------------------------------------------
    def fault(self, node, message: str) -> str:
        """The flag of ``node``'s run-time check of what ``message`` says (an ``int``, 0 until ``flag |=
        condition``); ``message`` is the ``InputError`` the runtime raises for its code. A node may have
        several (RoiAlign: a batch index out of range, a box not finite, a grid too large)."""
        key = (id(node), message)
        hit = self.faults.get(key)
        if hit is None:
            position = next((i for i, n in enumerate(self.group.nodes) if n is node), len(self.group.nodes))
            hit = (position, f"fault{len(self.faults)}", self.program.fault_code(message))
            self.faults[key] = hit
        return hit[1]

    def wide_vectors(self) -> None:
        """Let gcc vectorise this kernel's loops (the kernel's function and its parallel loops') 512 bits wide:
        ``VECTOR_512`` before their storage class, defined once in the program (``VECTOR_512_C``)."""
        self.vector_512 = True
        self.program.require_helper(VECTOR_512, VECTOR_512_C)

    # Parallel loops -----------------------------------------------------------------------
    def parallel_for(self, work: int, collapse: int = 1, costs: Sequence[float] = (), contiguous: bool = False) -> None:
        """Mark the next loop to split across threads, if ``work`` (elementary operations) is worth them: a
        pragma in OpenMP's syntax that ``outline.py`` turns into a function on the program's thread pool
        (the microcontroller drops it). Its schedule is chosen once the loop is written (``_schedules``).
        ``costs``: each iteration's relative cost, where they differ (``ParallelLoop``). ``contiguous``: consecutive
        iterations write consecutive runs of the output (a GEMM's tiles along the positions or the channels of
        an NCHW tensor), so that static blocks keep each thread's part of the tensor in one place (``_schedules``)."""
        if work < self.program.options.parallel_min_work:
            return
        self.uses_threads = True
        col = f" collapse({collapse})" if collapse > 1 else ""
        self._parallel.append((len(self.w.lines), work, collapse, tuple(costs), contiguous))
        self.w.line(f"OPFUSE_PRAGMA(omp parallel for num_threads(nt) {STATIC_CLAUSE}{col} if(nt > 1))")

    def _schedules(self) -> None:
        """One iteration at a time (``schedule(dynamic, 1)``) for a loop of ``n`` iterations each worth
        at least ``parallel_dynamic_min_work`` (see ``CodegenOptions``), unless it is ``contiguous`` and its
        static blocks are balanced (``parallel_static_contiguous``, ``_balanced``); static chunks otherwise."""
        lines = self.w.lines
        o = self.program.options
        for at, work, collapse, costs, contiguous in self._parallel:
            head = _LOOP_HEAD.match(lines[at + 1]) if at + 1 < len(lines) else None
            if collapse == 1 and head and work // int(head.group(2)) >= o.parallel_dynamic_min_work \
                    and not (contiguous and o.parallel_static_contiguous and self._balanced(int(head.group(2)), costs)):
                lines[at] = lines[at].replace(STATIC_CLAUSE, DYNAMIC_CLAUSE)
            heads = [_LOOP_HEAD.match(ln) for ln in lines[at + 1:at + 1 + collapse]]
            iterations = math.prod(int(h.group(2)) for h in heads if h) if all(heads) else len(costs)
            schedule = "dynamic" if DYNAMIC_CLAUSE in lines[at] else "static"
            self.loops.append(ParallelLoop(iterations, work, schedule, costs))
        self._parallel.clear()

    def _balanced(self, iterations: int, costs: Sequence[float]) -> bool:
        """Whether static blocks of the loop keep every thread count of ``balance_threads`` at least
        ``STATIC_MIN_EFFICIENCY`` busy (speed-up / threads, ``ParallelLoop.speedup``)."""
        loop = ParallelLoop(iterations, 0, "static", tuple(costs))
        return all(loop.speedup(t) / t >= STATIC_MIN_EFFICIENCY for t in self.program.options.balance_threads if t > 1)

    # Assembly -----------------------------------------------------------------------------
    def signature(self) -> str:
        args = []
        for p in self.params.values():
            const = "" if p.writable else "const "
            args.append(f"{const}{p.ctype}* restrict {p.name}")
        args += ["char* restrict scratch", "int nt"]
        result = "int" if self.faults else "void"
        return f"OPFUSE_KERNEL {self._attributes()}static {result} {self.name}({', '.join(args)})"

    def _attributes(self) -> str:
        """What the kernel's functions carry before their storage class (``wide_vectors``)."""
        return f"{VECTOR_512} " if self.vector_512 else ""

    def _fault_flags(self) -> tuple[str, str]:
        """(declarations, returns) of the fault flags (the parallel loops reduce them: ``outline.py``)."""
        flags = sorted(self.faults.values())
        if not flags:
            return "", ""
        decl = "".join(f"  int {f} = 0;\n" for _, f, _ in flags)
        returns = "".join(f"  if ({f}) return {code};\n" for _, f, code in flags) + "  return 0;\n"
        return decl, returns

    def function_text(self, comment: str) -> str:
        """The kernel's C: on the host its parallel loops' functions first (``outline.py``), then the kernel."""
        return self.comment_block(comment) + self.function_code()

    def comment_block(self, comment: str, *more: str) -> str:
        """The comment above the kernel: ``comment``, the kernel's notes and the lines ``more``."""
        return f"/* {comment}" + "".join(f"\n * {n}" for n in (*self._comment_notes, *more)) + " */\n"

    def function_code(self) -> str:
        """The kernel's C without its comment (``function_text``). Call it once: it fixes the loops' schedules."""
        self._schedules()
        decl, returns = self._fault_flags()
        helpers = ""
        if self.program.options.platform == "mcu":
            lines = strip(self.w.lines)
            unused = "  (void)scratch; (void)nt;\n"
        else:
            params = [(f"{'' if p.writable else 'const '}{p.ctype}* restrict", p.name) for p in self.params.values()]
            outliner = Outliner(self.name, params + [("char* restrict", "scratch"), ("int", "nt")],
                                [f for _, f, _ in sorted(self.faults.values())], self._attributes())
            lines = outliner.run(self.w.lines)
            helpers = "".join(outliner.functions)
            unused = "  (void)scratch; (void)nt;\n  const int opfuse_tid = 0; (void)opfuse_tid;\n"
        body = "\n".join(lines) + "\n"
        return f"{helpers}{self.signature()} {{\n{unused}{decl}{body}{returns}}}\n"

    def code_key(self, code: str) -> str:
        """``code`` (``function_code``) with the kernel's name and its parameters' names replaced by their
        roles: two kernels with one key compute the same function of their arguments, so one C function
        serves both (``ProgramBuilder._register``)."""
        roles = {self.name: "KERNEL_"} | {p.name: f"PARAM{i}_" for i, p in enumerate(self.params.values())}
        # The kernel's name also begins its parallel loops' functions and contexts (``{name}_par0_ctx``).
        pattern = "|".join(rf"\b{re.escape(n)}\b" for n in roles) + rf"|\b{re.escape(self.name)}(?=_par\d)"
        return re.sub(pattern, lambda m: roles[m.group(0)], code)
