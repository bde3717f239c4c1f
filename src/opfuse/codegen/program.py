"""The whole model as one C translation unit: helpers, one function per group, ``opfuse_run``.

``generate(graph, plan)`` is the code generator's entry point. It sees only the IR, the
fusion plan and the memory plan; it never reads a model file. The output is deterministic
byte for byte: every walk is over ordered containers and every identifier comes from
``names.c_ident``.

The ABI of the generated library (``ABI_VERSION``):

    int    opfuse_run(void* const* inputs, void* const* outputs, char* arena,
                      const char* weights, char* scratch, int threads);
    size_t opfuse_arena_bytes(void);     size_t opfuse_scratch_stride(void);
    size_t opfuse_weights_bytes(void);   int    opfuse_abi_version(void);

``opfuse_run`` returns 0, or the fault code ``k >= 1`` of the first run-time check that failed
(``CProgram.faults[k - 1]`` is its message, and ``model.h`` lists them): an integer division by
zero or a Gather index out of range. The outputs are then unspecified; nothing traps.

``inputs``/``outputs`` hold one pointer per graph input/output (contiguous, row-major, the
graph's dtypes); ``arena`` is ``opfuse_arena_bytes()`` bytes, 64-byte aligned; ``scratch``
is ``threads * opfuse_scratch_stride()`` bytes; ``weights`` is the blob (ignored when the
weights are embedded).

``CodegenOptions(platform="mcu")`` keeps the kernels and changes the program around them
(one ``opfuse_run`` with no weights, scratch or threads; see ``codegen/mcu.py``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from opfuse.codegen.prechecks import emit_prechecks
from opfuse.codegen.ctype import c_type
from opfuse.codegen.evaluator import Evaluator
from opfuse.codegen.kernel import KERNEL_ATTRIBUTE, KernelContext, ParallelLoop, UnsupportedGroupError
from opfuse.codegen.names import NameTable, c_ident
from opfuse.codegen.options import ONE_THREAD, PROFILE_CLOCKS, CodegenOptions
from opfuse.codegen.stages import analyse
from opfuse.codegen.threadpool import POOL_C
from opfuse.codegen.weights import PRODUCT_OPS, WeightsBlob, flush_subnormals
from opfuse.errors import InputError, OpfuseError, UnsupportedDtypeError
from opfuse.ir.dtypes import is_narrow_float
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.memory.patch import PATCHED_KIND
from opfuse.memory.plan import MemoryPlan, plan_memory
from opfuse.ops.registry import Category, get_spec
from opfuse.rewrites.float32_compute import needs_float32
from opfuse.targets import host_full_width_fma, host_simd_isa

if TYPE_CHECKING:
    from opfuse.codegen.mcu import McuSources

ABI_VERSION = 1
EMBEDDED_WEIGHTS = "opfuse_weights_data"

_PROFILE_PREAMBLE = "#include <time.h>\n"
# The POSIX calls of the pool (threads, clock_gettime) and of the profile clock, before any system header.
# The system headers a host program includes, first after its banner line: every one of them, so that the build
# may precompile exactly this block (``runtime.toolchain``: ``-include`` of its precompiled form, whose include
# guards then make the source's own lines no-ops; immintrin.h alone took 0.5 s of a 1 s compile). The
# sections that use intrinsics still include their header under their own guards. _POSIX_C_SOURCE comes before
# any header (clock_gettime, the pool's pthreads).
SYSTEM_HEADERS = """\
#if !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(OPFUSE_THREADS)
#include <pthread.h>
#include <sched.h>
#include <time.h>
#endif
"""
# The intrinsics' header, in the block of every build but the plain C99 one (simd="none": no intrinsics at all).
INTRINSICS_HEADERS = """\
#if defined(__AVX2__)
#include <immintrin.h>
#endif
"""


def system_headers(options: CodegenOptions) -> str:
    """The block of system headers a host program of ``options`` begins with (``SYSTEM_HEADERS``)."""
    return SYSTEM_HEADERS + ("" if options.simd == "none" else INTRINSICS_HEADERS)
# Per-kernel time on the ``profile_clock``, accumulated over calls (CodegenOptions(profile=True)).
_PROFILE_HELPERS = """\
static uint64_t opfuse_profile_ns[{n}];
static int opfuse_profile_group[{n}];
static uint64_t opfuse_now_ns(void) {{
  struct timespec ts;
  clock_gettime({clock}, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}}
int opfuse_profile(uint64_t* ns, int* group, int n) {{
  int k;
  for (k = 0; k < n && k < {n}; ++k) {{
    ns[k] = opfuse_profile_ns[k]; group[k] = opfuse_profile_group[k]; opfuse_profile_ns[k] = 0;
  }}
  return {n};
}}
"""

_PREAMBLE = """\
/* The index of the thread running this code (its scratch): a local of every kernel and parallel loop. */
#define OPFUSE_TID() opfuse_tid
#define OPFUSE_PRAGMA(x) _Pragma(#x)
"""
# No ``#pragma GCC optimize`` in the preamble. A ``no-thread-jumps`` pragma (it kept gcc from turning an
# elementwise chain's selects into compare-and-mask chains in loops gcc vectorises) made gcc 12's loop
# vectoriser miscompile a constant Pad (2x12x3 -> 3x15x7: 24 interior values read from the wrong addresses,
# at -O3 with AVX2 or AVX-512; found by ``opfuse fuzz``, tests/e2e/test_fuzz_findings.py). Dense chains
# run as intrinsics (``simdchain``) now; without the pragma the zoo models measured 0.97-1.01x the time
# with it (1 thread, thread CPU time, 30 interleaved calls).


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class KernelInfo:
    function: str | None      # None when the group needs no code (views, folded constants)
    group: str
    kind: str
    ops: list[str]
    scratch_bytes: int = 0
    scratch_offset: int | None = None  # mcu: where its scratch lies in the arena
    notes: tuple[str, ...] = ()        # algorithm choices (e.g. "Conv 'c': Winograd F(4x4,3x3) (...)")
    parallel: tuple[ParallelLoop, ...] = ()  # its loops split across threads (none: it runs on one)
    one_thread: str = ""  # why a kernel with a product keeps every loop on one thread (``_one_thread``)


@dataclass(frozen=True)
class Launch:
    """One kernel call in ``opfuse_run``: the function, its data arguments (C expressions
    over ``inputs``, ``outputs``, ``arena`` and ``weights``) and its group's index."""

    function: str
    args: list[str]
    group_index: int
    faults: bool = False  # the function returns a fault code (0: none)


@dataclass
class CProgram:
    """Everything needed to build and run the model: C source, weights, buffer sizes."""

    source: str
    weights: bytes
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    arena_bytes: int
    scratch_stride: int
    kernels: list[KernelInfo]
    memory: MemoryPlan
    options: CodegenOptions
    # Graph outputs no kernel writes (a graph input or a constant returned as is): name -> source.
    passthrough: dict[str, tuple[str, str | np.ndarray]] = field(default_factory=dict)
    mcu: "McuSources | None" = None  # the mcu platform's header and weights file
    faults: list[str] = field(default_factory=list)  # message of fault code k at index k - 1
    # The block of system headers the source begins with, after its banner line (``system_headers``): a build may
    # precompile it. Empty for the mcu platform's sources.
    prelude: str = ""
    # Whether an inference wakes sleeping workers (``ProgramBuilder._threads_line``); None: no loop splits.
    wakes_workers: bool | None = None
    # Subnormal values of the products' float32 constants stored as zeros (``CodegenOptions.flush_subnormal_weights``).
    subnormals_flushed: int = 0

    def fault_message(self, code: int) -> str:
        """The ``InputError`` message of a non-zero ``opfuse_run`` result."""
        if 1 <= code <= len(self.faults):
            return self.faults[code - 1]
        return f"opfuse_run returned {code}, which is no fault code of this model"

    def fault_error(self, code: int) -> OpfuseError:
        """The exception of a non-zero ``opfuse_run`` result: ``InputError`` for what the inputs did (a zero
        divisor, an index out of range), a plain ``OpfuseError`` for a guard that changed (a code generator's
        bug: ``CodegenOptions.scratch_guard_bytes``, ``arena_guard_bytes``)."""
        message = self.fault_message(code)
        return OpfuseError(message) if GUARD_FAULT in message else InputError(message)

    @property
    def num_functions(self) -> int:
        """The kernels that run code: one call each in ``opfuse_run`` (and one profile slot)."""
        return sum(1 for k in self.kernels if k.function)

    @property
    def c_functions(self) -> int:
        """The C functions those kernels call: kernels with the same code share one (``ProgramBuilder._register``)."""
        return len({k.function for k in self.kernels if k.function})

    def header(self) -> str:
        if self.mcu is not None:
            return self.mcu.header
        ins = "\n".join(f" *   inputs[{i}]  {c_ident(t.name, 'in')} {t.dtype.name}{list(t.shape)}"
                        for i, t in enumerate(self.inputs))
        outs = "\n".join(f" *   outputs[{i}] {c_ident(t.name, 'out')} {t.dtype.name}{list(t.shape)}"
                         for i, t in enumerate(self.outputs))
        codes = "".join(f"\n *   {k} {c_ident(m, 'fault')}" for k, m in enumerate(self.faults, 1))
        faults = f"\n * opfuse_run returns 0, or one of these fault codes:{codes}" if codes else ""
        build = ("\n * Build: cc -O3 -std=c99 -fPIC -shared -pthread -DOPFUSE_THREADS model.c (without OPFUSE_THREADS"
                 "\n * the parallel loops run on the calling thread; scratch holds threads * opfuse_scratch_stride()).")
        return (f"/* opfuse generated model interface (ABI {ABI_VERSION}).\n{ins}\n{outs}{faults}{build}\n */\n"
                "#include <stddef.h>\n"
                "int opfuse_run(void* const* inputs, void* const* outputs, char* arena, "
                "const char* weights, char* scratch, int threads);\n"
                "size_t opfuse_arena_bytes(void);\nsize_t opfuse_scratch_stride(void);\n"
                "size_t opfuse_weights_bytes(void);\nint opfuse_abi_version(void);\n")


# ``CodegenOptions.scratch_guard_bytes`` and ``arena_guard_bytes``: each kernel's guards (``{offset, bytes}`` pairs
# from a base: every thread's scratch, or the arena with one "thread") filled before its call and compared after it.
GUARD_FAULT = "stored outside its scratch regions or output tensors"
GUARD_C = """\
static void opfuse_guard_fill(char* scratch, int nt, const long* g, int n) {
  for (int t = 0; t < nt; ++t)
    for (int i = 0; i < n; ++i)
      memset(scratch + (size_t)t * OPFUSE_SCRATCH_STRIDE + g[2 * i], 0xA5, (size_t)g[2 * i + 1]);
}
static int opfuse_guard_changed(const char* scratch, int nt, const long* g, int n) {
  for (int t = 0; t < nt; ++t)
    for (int i = 0; i < n; ++i) {
      const unsigned char* p = (const unsigned char*)scratch + (size_t)t * OPFUSE_SCRATCH_STRIDE + g[2 * i];
      for (long b = 0; b < g[2 * i + 1]; ++b) if (p[b] != 0xA5) return 1;
    }
  return 0;
}
"""


class ProgramBuilder:
    def __init__(self, graph: Graph, plan: FusionPlan, memory: MemoryPlan, options: CodegenOptions):
        self.graph = graph
        self.plan = plan
        self.subnormals_flushed = 0
        if options.flush_subnormal_weights:
            memory = self._flush_product_constants(graph, memory)
        self.memory = memory
        self.options = options
        self.names = NameTable()
        self.weights = WeightsBlob()
        self.helpers: dict[str, str] = {}
        self.functions: list[str] = []
        self.calls: list[str] = []
        self.kernels: list[KernelInfo] = []
        self.launches: list[Launch] = []
        self.faults: list[str] = []
        self.scratch_stride = 0
        self.threaded_flops = self.threaded_bytes = 0  # the kernels with split loops: their FLOPs and bytes (_size)
        self.wakes_workers: bool | None = None  # (_threads_line)
        self.last_arena_guards: list[tuple[int, int]] = []  # the last kernel's (``_arena_guards``), for tests
        # A kernel's code with its names replaced by their roles (``KernelContext.code_key``) -> the function
        # generated for it first: layers with the same shapes and epilogue share one C function.
        self._codes: dict[str, str] = {}

    def _flush_product_constants(self, graph: Graph, memory: MemoryPlan) -> MemoryPlan:
        """``memory`` with the float32 constants a product reads (``weights.PRODUCT_OPS``) flushed of their subnormal
        values (``CodegenOptions.flush_subnormal_weights``), counted in ``subnormals_flushed``; every kernel, and
        every array derived from them (packed panels, Winograd's U), then reads the flushed ones."""
        static = dict(memory.static)
        outputs = {id(v) for v in graph.outputs}
        done: set[int] = set()
        for node in graph.nodes:
            if node.op_type not in PRODUCT_OPS:
                continue
            for v in node.inputs:
                if v is None or id(v) not in static or id(v) in done or id(v) in outputs:
                    continue
                done.add(id(v))
                static[id(v)], count = flush_subnormals(static[id(v)])
                self.subnormals_flushed += count
        return dataclasses.replace(memory, static=static) if self.subnormals_flushed else memory

    def fault_code(self, message: str) -> int:
        """The code (1, 2, ...) ``opfuse_run`` returns for the fault described by ``message``."""
        if message not in self.faults:
            self.faults.append(message)
        return self.faults.index(message) + 1

    def require_helper(self, name: str, text: str) -> str:
        """Declare the helper ``name`` (C ``text``) once; a second declaration must be the same text: a helper whose
        body depends on a kernel's constants carries them in its name (otherwise every kernel would call the first
        kernel's body: a silent wrong answer), so a different text under a taken name is a generator bug."""
        known = self.helpers.setdefault(name, text)
        if known != text:
            raise AssertionError(f"code generator bug: helper '{name}' declared twice with different bodies")
        return name

    # Kernels -----------------------------------------------------------------------------
    def kernel(self, index: int, group) -> None:
        from opfuse.codegen.lowering import lower_stage
        if group.kind == PATCHED_KIND:
            from opfuse.codegen.patch import emit_patched, patched_comment
            kc = emit_patched(self, index, group)
            self._register(kc, group, index, patched_comment(group))
            return
        analysis = analyse(group, self.graph, self.memory.static)
        kc = KernelContext(self, group, index)
        loadable = {id(v) for v in group.inputs()}
        options = self.options
        alone = self._one_thread(group)
        if alone is not None:  # every loop of this kernel on one thread: as if no loop were worth them
            self.options = options.with_(parallel_min_work=ONE_THREAD)
        try:
            emit_prechecks(kc, analysis.inline, analysis.live, loadable)
            for stage in analysis.stages:
                ev = Evaluator(kc, analysis.inline, loadable)
                lower_stage(kc, ev, stage, analysis)
                loadable |= {id(v) for v in stage.outputs}
        finally:
            self.options = options
        ops = "+".join(n.op_type for n in group.nodes)
        self._register(kc, group, index, f"group {c_ident(group.name, 'g')}: {group.kind} [{c_ident(ops, 'ops')}]",
                       one_thread=alone or "")

    def _size(self, group) -> tuple[int, int]:
        """The group's FLOPs (the registry's count over its ops) and the bytes of its boundary tensors."""
        flops = sum(get_spec(n.op_type, n).flops(n) for n in group.nodes)
        return flops, sum(v.nbytes for v in group.inputs()) + sum(v.nbytes for v in group.outputs(self.graph))

    def _one_thread(self, group) -> str | None:
        """Why a kernel with a product runs on one thread (``CodegenOptions.parallel_min_flops`` and
        ``parallel_min_bytes``); None where it may split its loops (or has no product: its loops decide)."""
        o = self.options
        if not o.thread_gates or o.parallel_min_work >= ONE_THREAD or alone_node(group) is None:
            return None
        flops, data = self._size(group)
        if flops >= o.parallel_min_flops or data >= o.parallel_min_bytes:
            return None
        return (f"one thread ({flops} FLOPs and {data} bytes of operands and results, below parallel_min_flops "
                f"{o.parallel_min_flops} and parallel_min_bytes {o.parallel_min_bytes})")

    def _register(self, kc: KernelContext, group, index: int, comment: str, one_thread: str = "") -> None:
        """Add the kernel ``kc`` generated for ``group`` (its function, launch and call)."""
        info = KernelInfo(None, group.name, group.kind, [n.op_type for n in group.nodes], kc.scratch_bytes,
                          notes=tuple(kc.notes), one_thread=one_thread)
        self.kernels.append(info)
        if not kc.w.lines:
            return
        self.scratch_stride = max(self.scratch_stride, kc.scratch_bytes)
        code = kc.function_code()
        name = self._codes.setdefault(kc.code_key(code), kc.name)
        if name == kc.name:
            self.functions.append(kc.comment_block(comment) + code)
        else:  # the same code as an earlier kernel: that function runs this group too
            self.functions.append(kc.comment_block(comment, f"runs as {name}: the same code"))
        info.function = name
        info.parallel = tuple(kc.loops)
        if kc.loops:
            flops, data = self._size(group)
            self.threaded_flops += flops
            self.threaded_bytes += data
        args = [self._arg(p) for p in kc.params.values()]
        self.launches.append(Launch(name, args, index, bool(kc.faults)))
        args = args + ["scratch", "nt"]
        call = f"{name}({', '.join(args)});"
        if kc.faults:
            call = f"{{ const int fault_ = {call[:-1]}; if (fault_) return fault_; }}"
        arena_guards = self.last_arena_guards = self._arena_guards(kc, index)
        if kc.scratch_guards or arena_guards:
            call = self._guarded_call(kc, group, call, arena_guards)
        if self.options.profile:
            slot = len(self.calls)
            call = (f"{{ const uint64_t t0_ = opfuse_now_ns(); {call} "
                    f"opfuse_profile_ns[{slot}] += opfuse_now_ns() - t0_; opfuse_profile_group[{slot}] = {index}; }}")
        self.calls.append(f"  {call}")

    def _arena_guards(self, kc: KernelContext, index: int) -> list[tuple[int, int]]:
        """``(offset, bytes)`` of the guard after each arena block the kernel writes, the block live at
        kernel ``index`` that holds the written pointer (``CodegenOptions.arena_guard_bytes``; none without)."""
        guard = self.memory.guard_bytes if self.options.arena_guard_bytes else 0
        if not guard:
            return []
        found: set[tuple[int, int]] = set()
        for p in kc.params.values():
            region, _, at = p.expr_key
            if region != "arena" or not p.writable:
                continue
            for off, size, start, end in self.memory.blocks.values():
                if off <= at < off + size and start <= index <= end:
                    found.add((off + size, guard))
        return sorted(found)

    def _guarded_call(self, kc: KernelContext, group, call: str, arena_guards: list[tuple[int, int]]) -> str:
        """``call`` between filling the kernel's guards with 0xA5 (its scratch guards in every thread's
        scratch, ``CodegenOptions.scratch_guard_bytes``; those after the arena blocks it writes,
        ``arena_guard_bytes``) and checking them: a changed byte returns a fault code."""
        self.require_helper("opfuse_scratch_guard", GUARD_C)
        code = self.fault_code(f"kernel '{kc.name}' (group '{group.name}') {GUARD_FAULT} "
                               f"(a guard changed)")
        fill, check = [], []
        for base, threads, guards, name in (("scratch", "nt", kc.scratch_guards, "guards_"),
                                            ("arena", "1", arena_guards, "aguards_")):
            if guards:
                n = len(guards)
                fill.append(f"static const long {name}[] = {{{', '.join(f'{o}, {b}' for o, b in guards)}}}; "
                            f"opfuse_guard_fill({base}, {threads}, {name}, {n});")
                check.append(f"opfuse_guard_changed({base}, {threads}, {name}, {n})")
        return f"{{ {' '.join(fill)} {call} if ({' || '.join(check)}) return {code}; }}"

    @staticmethod
    def _arg(p) -> str:
        region, index, offset = p.expr_key
        const = "" if p.writable else "const "
        if region == "arena":
            base = "arena"
        elif region == "input":
            base = f"((char*)inputs[{index}])"
        elif region == "output":
            base = f"((char*)outputs[{index}])"
        elif region == "weights":
            base = "weights"
            const = "const "
        else:
            raise AssertionError(region)
        return f"({const}{p.ctype}*)({base} + {offset})"

    # Assembly ----------------------------------------------------------------------------
    def finish(self) -> CProgram:
        if self.options.platform == "mcu":
            from opfuse.codegen.mcu import finish_mcu
            source, sources = finish_mcu(self, ABI_VERSION)
            return CProgram(source, self.weights.tobytes(), self.input_specs(), self.output_specs(),
                            sources.scratch.arena_bytes, 0, self.kernels, self.memory, self.options,
                            self.passthrough(), sources, faults=list(self.faults),
                            subnormals_flushed=self.subnormals_flushed)
        g = self.graph
        stride = -(-max(self.scratch_stride, 1) // 64) * 64
        parts = [f"/* Generated by opfuse (ABI {ABI_VERSION}): model {c_ident(g.name, 'm')}, "
                 f"{len(self.plan.groups)} groups, layout {self.options.layout}. Do not edit. */\n",
                 system_headers(self.options),
                 _PROFILE_PREAMBLE if self.options.profile else "",
                 _PREAMBLE,
                 POOL_C,
                 KERNEL_ATTRIBUTE,
                 f"#define OPFUSE_SCRATCH_STRIDE ((size_t){stride})\n"]
        if self.subnormals_flushed:
            parts.append(f"/* {self.subnormals_flushed} subnormal values of the products' float32 weights stored as "
                         f"zeros (CodegenOptions.flush_subnormal_weights) */\n")
        embed = self.options.weights == "embed"
        if embed:
            parts.append(self.weights.c_array(EMBEDDED_WEIGHTS))
        if self.options.profile:
            n = max(len(self.calls), 1)
            parts.append(_PROFILE_HELPERS.format(n=n, clock=PROFILE_CLOCKS[self.options.profile_clock]))
        parts.extend(self.helpers[k] for k in self.helpers)
        parts.extend(self.functions)
        run = ["int opfuse_run(void* const* inputs, void* const* outputs, char* arena, const char* weights, "
               "char* scratch, int threads) {",
               self._threads_line(),
               "  (void)inputs; (void)outputs; (void)arena; (void)scratch; (void)nt;"]
        run.append(f"  weights = (const char*){EMBEDDED_WEIGHTS};" if embed else "  (void)weights;")
        run.extend(self.calls)
        run.append("  return 0;\n}\n")
        parts.append("\n".join(run))
        parts.append(f"size_t opfuse_arena_bytes(void) {{ return (size_t){self.memory.arena_bytes}; }}\n"
                     f"size_t opfuse_scratch_stride(void) {{ return (size_t){stride}; }}\n"
                     f"size_t opfuse_weights_bytes(void) {{ return (size_t){self.weights.size}; }}\n"
                     f"int opfuse_abi_version(void) {{ return {ABI_VERSION}; }}\n")
        source = "\n".join(parts)
        return CProgram(source, self.weights.tobytes(), self.input_specs(), self.output_specs(),
                        self.memory.arena_bytes, stride, self.kernels, self.memory, self.options, self.passthrough(),
                        faults=list(self.faults), prelude=system_headers(self.options),
                        wakes_workers=self.wakes_workers, subnormals_flushed=self.subnormals_flushed)

    def _threads_line(self) -> str:
        """``opfuse_run``'s thread count: where some loop splits, ``opfuse_pool_begin`` (threadpool.py) with
        whether the split kernels are worth waking sleeping workers for (``CodegenOptions.pool_wake_min_flops``
        and ``pool_wake_min_bytes``)."""
        o = self.options
        if not any(k.parallel for k in self.kernels):
            return "  const int nt = threads > 0 ? threads : 1;"
        worth = self.wakes_workers = not o.thread_gates or self.threaded_flops >= o.pool_wake_min_flops or \
            self.threaded_bytes >= o.pool_wake_min_bytes
        return (f"  const int nt = opfuse_pool_begin(threads, {int(worth)});  /* split kernels: {self.threaded_flops} "
                f"FLOPs, {self.threaded_bytes} bytes */")

    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec(v.name, v.shape, v.dtype) for v in self.graph.inputs]

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec(v.name, v.shape, v.dtype) for v in self.graph.outputs]

    def passthrough(self) -> dict[str, tuple[str, str | np.ndarray]]:
        """Graph outputs no kernel writes: name -> ("static", data) or ("input", input name)."""
        out: dict[str, tuple[str, str | np.ndarray]] = {}
        for v in self.graph.outputs:
            if self.memory.is_static(v):
                out[v.name] = ("static", self.memory.static[id(v)])
            elif v.producer is None:
                out[v.name] = ("input", v.name)
        return out


def alone_node(group):
    """The group's first product (a Conv, MatMul, Gemm or attention: registry category
    ``OUT_ELEMWISE_FUSABLE``); None if it has none. Only a kernel with one is kept on one thread by its group's
    size (``ProgramBuilder._one_thread``: the FLOPs of all its ops); the others are left to their loops' gates."""
    return next((n for n in group.nodes if get_spec(n.op_type, n).category == Category.OUT_ELEMWISE_FUSABLE), None)


def generate(graph: Graph, plan: FusionPlan | None = None, *, memory: MemoryPlan | None = None,
             options: CodegenOptions | None = None) -> CProgram:
    """C source and weights for ``graph`` partitioned by ``plan`` (unfused when ``None``)."""
    plan = plan if plan is not None else FusionPlan.unfused(graph)
    if plan.graph is not graph:
        raise ValueError("the fusion plan belongs to another graph")
    plan.verify()
    for v in list(graph.inputs) + list(graph.outputs):
        c_type(v.dtype, v.name)  # unsupported dtypes fail here, naming the tensor
    for node in graph.nodes:  # 16-bit floats are storage only: rewrites.float32_compute widens their ops
        if needs_float32(node):
            v = next(v for v in (*node.inputs, *node.outputs) if v is not None and is_narrow_float(v.dtype))
            raise UnsupportedDtypeError(v.dtype.name, v.name, "C", f"node '{node.name}' ({node.op_type}) computes "
                                        f"in it; the C backend computes {v.dtype.name} ops in float32 after the "
                                        f"float32_compute rewrite, which did not apply to this op")
    options = options or CodegenOptions()
    if options.arena_guard_bytes and (memory is None or memory.guard_bytes != options.arena_guard_bytes):
        memory = plan_memory(plan, guard_bytes=options.arena_guard_bytes)  # the same plan, guards after its blocks
    memory = memory if memory is not None else plan_memory(plan)
    host_isa = host_simd_isa() if options.vector_isa == "host" and options.platform == "host" else "avx2"
    full_width = host_full_width_fma() if options.platform == "host" else False
    builder = ProgramBuilder(graph, plan, memory, options.resolved(host_isa, full_width))
    for t, group in enumerate(plan.groups):
        builder.kernel(t, group)
    return builder.finish()


__all__ = ["generate", "CProgram", "KernelInfo", "Launch", "TensorSpec", "UnsupportedGroupError", "ABI_VERSION"]
