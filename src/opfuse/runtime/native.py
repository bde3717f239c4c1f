"""The native runtime: compile a fused model to a shared library and run it from Python.

    model = build(graph, plan, threads=1)        # generate C, compile (cached), load
    outputs = model.run({"input": x})            # {output name: ndarray}
    model.report                                 # kernels, arena bytes, lower bound, ...
    model.export_c("out/")                       # model.c, model.h, weights.bin

Memory: the arena, the weights and the per-thread scratch are allocated once per ``CompiledModel``
(64-byte aligned NumPy buffers; from 1 MiB up on transparent huge pages where Linux offers them,
``HUGE_PAGE_MIN_BYTES``); graph inputs are passed by pointer (no copy when already
contiguous with the right dtype) and kernels write graph outputs straight into freshly
allocated output arrays. ``run`` holds a lock: one model object runs one call at a time.

Threads: ``threads`` (default: the cores available to the process, or ``OMP_NUM_THREADS``) is
passed to every parallel loop at run time; the loops run on the program's own thread pool, whose
workers spin 0.1 ms after a loop and then sleep (``opfuse.codegen.threadpool``,
``opfuse.runtime.threads``).
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import mmap
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from opfuse.codegen.ctype import c_type
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.program import ABI_VERSION, CProgram, generate
from opfuse.errors import OpfuseError, StorageError, UnsupportedDtypeError, UnsupportedOpError
from opfuse.files import atomic_write, storage_error
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.memory.plan import MemoryPlan
from opfuse.rewrites.context import RewriteContext
from opfuse.rewrites.edit import Provenance
from opfuse.rewrites.float32_compute import compute_in_float32, needs_float32
from opfuse.rules.options import FusionOptions
from opfuse.runtime.reference import check_inputs
from opfuse.runtime.threads import POOL_DESCRIPTION, default_threads
from opfuse.runtime.toolchain import LOAD_PREFIX, BuildResult, Toolchain, build_library

BUFFER_ALIGNMENT = 64
_GROUP_FIGURES = ("rule", "kernels_before", "kernels_after", "bytes_before", "bytes_after", "eta", "flops",
                  "predicted_latency_s", "measured_latency_s")  # carried into save_onnx's metadata


# The arena, the weights and the per-thread scratch from this size up lie on transparent huge pages
# where the kernel offers them (Linux, ``madvise`` or ``always`` in
# /sys/kernel/mm/transparent_hugepage/enabled): a 2 MiB page is physically contiguous, so a kernel's
# buffers fall in the caches' sets as their addresses say, the same in every process. On 4 KiB pages
# each build got other physical pages and other cache conflicts: in resnet18's per-group check
# (``measure.group_check``, 300 rounds, 1 thread) a fused group's time over its Conv moved by 11.6-14.0 us
# RMS (up to 40 us: the 14x14 Winograd layers, 1.2 MB of scratch) from one process to the next, beyond
# the rounds' own spread (2-4 us); on huge pages by 4.0-4.9 us RMS (three processes each way). Whole
# runs: no change beyond the noise (resnet18 fused and unfused, 1 thread, six interleaved A/Bs of
# 100-150 runs at load 20-24: -0.15 to +0.11 ms in 16-19 ms). A smaller buffer stays on ordinary
# pages: a huge page holds 2 MiB of memory however little of it is used.
HUGE_PAGE_BYTES = 2 << 20
HUGE_PAGE_MIN_BYTES = 1 << 20


def _aligned(nbytes: int) -> np.ndarray:
    """A zeroed uint8 buffer of ``nbytes`` whose data pointer is 64-byte aligned; from
    ``HUGE_PAGE_MIN_BYTES`` up, 2 MiB aligned and advised onto transparent huge pages
    (``_huge_page_buffer``) where the platform has them."""
    n = max(nbytes, 1)
    if n >= HUGE_PAGE_MIN_BYTES:
        huge = _huge_page_buffer(n)
        if huge is not None:
            return huge
    raw = np.zeros(n + BUFFER_ALIGNMENT, dtype=np.uint8)
    shift = (-raw.ctypes.data) % BUFFER_ALIGNMENT
    return raw[shift:shift + n]


def _huge_page_buffer(n: int) -> np.ndarray | None:
    """``n`` zeroed bytes at a 2 MiB boundary of an anonymous mapping advised ``MADV_HUGEPAGE`` (the
    mapping runs to the end of the buffer's last 2 MiB, so every page of it can be huge; pages never
    touched take no memory), or ``None`` where ``mmap`` cannot advise it (not Linux, or refused).
    The array keeps the mapping alive."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return None
    span = -(-n // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    try:
        mapping = mmap.mmap(-1, span + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mapping.madvise(advice)
    except (OSError, ValueError):
        return None
    raw = np.frombuffer(mapping, dtype=np.uint8)
    shift = (-raw.ctypes.data) % HUGE_PAGE_BYTES
    return raw[shift:shift + n]


_LOAD_COUNTER = itertools.count()


def _load_library(path: Path) -> ctypes.CDLL:
    """dlopen ``path`` under a name used once: the dynamic loader returns an already loaded
    library for a known name, which would hand back a stale copy after a cache entry was
    rebuilt in this process. The private copy is unlinked once mapped.

    A copy, never a hard link: a hard link shares the inode, so anything that later truncates
    or rewrites the cache entry in place (a repair of a corrupt entry, another process) would
    change the pages this process has mapped, and the next touch of them dies with SIGBUS."""
    name = f"{LOAD_PREFIX}{os.getpid()}-{next(_LOAD_COUNTER)}-{path.parent.name[:16]}.so"
    failure: OSError | None = None
    # Next to the cache entry; in the temporary folder when the cache is read-only (or full).
    for folder in (path.parent.parent, Path(tempfile.gettempdir())):
        alias = folder / name
        try:
            shutil.copyfile(path, alias)
            alias.chmod(0o600)
            return ctypes.CDLL(str(alias))
        except OSError as e:
            failure = failure or e
        finally:
            with contextlib.suppress(OSError):
                alias.unlink(missing_ok=True)
    assert failure is not None
    raise storage_error(failure, "load the compiled library", path)


def _address(a: np.ndarray) -> int:
    """The data pointer of the contiguous array ``a``. Through the buffer protocol where ``a`` is
    writable and not empty (0.3 us), ``a.ctypes.data`` otherwise (1-1.6 us: it builds an object).
    ml_dtypes' types (bfloat16, float8) cannot be exported as a buffer: they take the second way."""
    if a.flags.writeable and a.nbytes and a.dtype.isbuiltin == 1:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))  # type: ignore[arg-type]  # numpy stubs lack Buffer
    return a.ctypes.data


class _CallBinding:
    """What one call of ``opfuse_run`` needs, worked out once per model so that a call on a tiny
    model costs microseconds of Python, not tens: the inputs' names, shapes and dtypes to accept
    plain arrays by (``exact_inputs``), the outputs to allocate, the pointer tables the C entry
    reads (filled in place under the model's lock, ``point``), and how each graph output is
    taken from them (``results``)."""

    def __init__(self, graph: Graph, program: CProgram, arena: int, weights: int):
        self.input_names = tuple(v.name for v in graph.inputs)
        self._expected = tuple((v.name, v.shape, v.dtype) for v in graph.inputs)
        self.output_specs = tuple((tuple(spec.shape), spec.dtype) for spec in program.outputs)
        self._inputs = (ctypes.c_void_p * max(len(self.input_names), 1))()
        self._outputs = (ctypes.c_void_p * max(len(self.output_specs), 1))()
        self.input_table = ctypes.addressof(self._inputs)
        self.output_table = ctypes.addressof(self._outputs)
        self.arena, self.weights = arena, weights
        # Each graph output: ("slot", j) the kernels wrote outputs[j]; ("input", k) graph input k
        # returned as is; ("static", data) a constant. A value listed twice reads its first slot.
        index = {name: k for k, name in enumerate(self.input_names)}
        first: dict[int, int] = {}
        self._taken: list[tuple[str, str, object]] = []
        for j, v in enumerate(graph.outputs):
            if v.name in program.passthrough:
                kind, src = program.passthrough[v.name]
                if kind == "input":
                    assert isinstance(src, str)
                    self._taken.append((v.name, "input", index[src]))
                else:
                    self._taken.append((v.name, "static", np.array(src, dtype=v.dtype, copy=True)))
            else:
                self._taken.append((v.name, "slot", first.setdefault(id(v), j)))

    def exact_inputs(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray] | None:
        """The arrays of ``feeds`` in input order when each is a C-contiguous ``ndarray`` of exactly
        the model's shape and dtype and no other name is given (what needs neither conversion nor
        copy); ``None`` otherwise, and ``check_inputs`` then accepts, converts or says why not."""
        if not isinstance(feeds, Mapping) or len(feeds) != len(self._expected):
            return None
        arrays = []
        for name, shape, dtype in self._expected:
            a = feeds.get(name)
            if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype or not a.flags.c_contiguous:
                return None
            arrays.append(a)
        return arrays

    def point(self, ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
        """Fill the pointer tables with the arrays' addresses (hold the model's lock)."""
        for k, a in enumerate(ins):
            self._inputs[k] = _address(a)
        for j, a in enumerate(outs):
            self._outputs[j] = _address(a)

    def results(self, ins: list[np.ndarray], outs: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Graph output name -> array, after a call that wrote ``outs``."""
        result: dict[str, np.ndarray] = {}
        for name, kind, src in self._taken:
            if kind == "slot":
                assert isinstance(src, int)
                result[name] = outs[src]
            elif kind == "input":  # a copy: the caller's array stays the caller's
                assert isinstance(src, int)
                result[name] = np.array(ins[src], copy=True)
            else:
                result[name] = np.array(src, copy=True)
        return result


class CompiledModel:
    """A model compiled to native code; see the module docstring."""

    def __init__(self, graph: Graph, plan: FusionPlan, program: CProgram, toolchain: Toolchain,
                 build: BuildResult, threads: int | None = None):
        self.graph = graph
        self.plan = plan
        self.program = program
        self.toolchain = toolchain
        self.build_result = build
        self._lib = _load_library(build.library)
        self._run = self._lib.opfuse_run
        self._run.restype = ctypes.c_int
        # Every pointer as a plain address (the pointer tables too): ctypes converts ints fastest.
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_int]
        abi = self._lib.opfuse_abi_version()
        if abi != ABI_VERSION:
            raise OpfuseError(f"compiled model has ABI {abi}, this opfuse expects {ABI_VERSION}; clear the "
                              f"build cache")
        self._arena = _aligned(program.arena_bytes)
        self._weights = _aligned(len(program.weights))
        self._weights[:len(program.weights)] = np.frombuffer(program.weights, dtype=np.uint8)
        self._lock = threading.Lock()
        self.compile_report: dict = {}  # fusion report and planner results, filled by opfuse.compile
        self.compilation: object | None = None  # the opfuse.compiler.Compilation it was built from
        self._threads = 1
        self._scratch = _aligned(0)
        self._scratch_at = self._scratch.ctypes.data
        self._binding = _CallBinding(graph, program, self._arena.ctypes.data, self._weights.ctypes.data)
        self.threads = default_threads() if threads is None else threads

    # Threads -----------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return self._threads

    @threads.setter
    def threads(self, n: int) -> None:
        n = int(n)
        if n < 1:
            raise OpfuseError(f"threads must be >= 1, got {n}")
        with getattr(self, "_lock", threading.Lock()):
            self._threads = n
            # The scratch only grows: a fresh buffer's pages fault in on first touch, inside the next
            # run's kernels, and a benchmark that switches between 1 and 2 threads (bench_scaling.py)
            # paid ~300 faults per run, in the kernels whose threads first touch their scratch.
            need = max(self.program.scratch_stride * n, 1)
            if need > len(getattr(self, "_scratch", ())):
                self._scratch = _aligned(need)
                self._scratch_at = self._scratch.ctypes.data

    @property
    def memory(self) -> MemoryPlan:
        return self.program.memory

    # Running -----------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray], *, cast: bool = False) -> dict[str, np.ndarray]:
        """Run the model; ``InputError`` (naming the input) for missing/misshaped/mistyped inputs
        (``cast=True`` converts inputs of another dtype whose values fit), and (naming the node) for
        values the model cannot compute: an integer division by zero, a Gather index out of range."""
        b = self._binding
        ins = b.exact_inputs(feeds)
        if ins is None:  # not plain arrays of the model's shapes and dtypes: the full check says why
            checked = check_inputs(self.graph, feeds, cast=cast)
            ins = [np.ascontiguousarray(checked[name]) for name in b.input_names]
        outs = [np.empty(shape, dtype=dtype) for shape, dtype in b.output_specs]
        with self._lock:
            b.point(ins, outs)
            rc = self._run(b.input_table, b.output_table, b.arena, b.weights, self._scratch_at, self._threads)
        if rc != 0:
            raise self.program.fault_error(rc)
        return b.results(ins, outs)

    __call__ = run

    def run_guarded(self, feeds: Mapping[str, np.ndarray], *, cast: bool = False, guard_bytes: int = 256,
                    poison: int = 0xA5) -> dict[str, np.ndarray]:
        """``run`` for tests that also see stores out of bounds: each output, the arena and the scratch lie in
        the middle of fresh buffers filled with the byte ``poison`` and ``guard_bytes`` (rounded up to 64) wider
        on both sides; after the call a changed guard byte raises ``OpfuseError`` naming the buffer and how far
        past its end (or before its start) the first store fell. The outputs and the arena start poisoned too,
        so a value read before any kernel wrote it shows in the results. ``run`` does none of this: it costs
        nothing there."""
        b = self._binding
        ins = b.exact_inputs(feeds)
        if ins is None:
            checked = check_inputs(self.graph, feeds, cast=cast)
            ins = [np.ascontiguousarray(checked[name]) for name in b.input_names]
        g = -(-max(guard_bytes, 1) // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT
        buffers: list[tuple[str, np.ndarray, int]] = []

        def guarded(what: str, nbytes: int) -> np.ndarray:
            buf = _aligned(nbytes + 2 * g)
            buf[:] = poison
            buffers.append((what, buf, nbytes))
            return buf[g:g + nbytes]

        outs = []
        for (shape, dtype), v in zip(b.output_specs, self.program.outputs, strict=True):
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            outs.append(guarded(f"output {v.name!r}", nbytes).view(dtype).reshape(shape))
        arena = guarded("the arena", self.program.arena_bytes)
        with self._lock:
            scratch = guarded("the scratch", self.program.scratch_stride * self._threads)
            b.point(ins, outs)
            rc = self._run(b.input_table, b.output_table, arena.ctypes.data, b.weights, scratch.ctypes.data,
                           self._threads)
        if rc != 0:
            raise self.program.fault_error(rc)
        for what, buf, nbytes in buffers:
            before = np.flatnonzero(buf[:g] != poison)
            after = np.flatnonzero(buf[g + nbytes:] != poison)
            if before.size or after.size:
                where = f"{g - int(before[0])} bytes before its start" if before.size else \
                    f"{int(after[0])} bytes past its end"
                raise OpfuseError(f"a kernel stored out of the bounds of {what} ({nbytes} bytes): {where}")
        return b.results(ins, outs)

    def prepared(self, feeds: Mapping[str, np.ndarray]) -> tuple[Callable[[], None], dict[str, np.ndarray]]:
        """``(call, outputs)``: ``call()`` runs the model on ``feeds`` into ``outputs``, arrays
        allocated and touched once here. For benchmarks: ``run`` allocates fresh outputs, and the
        kernel that first writes a large one pays its page faults inside its time."""
        b = self._binding
        checked = check_inputs(self.graph, feeds)
        ins = [np.ascontiguousarray(checked[name]) for name in b.input_names]
        outs = [np.zeros(shape, dtype=dtype) for shape, dtype in b.output_specs]

        def call() -> None:  # the closure keeps ins and outs alive as long as the pointers to them
            with self._lock:
                b.point(ins, outs)
                rc = self._run(b.input_table, b.output_table, b.arena, b.weights, self._scratch_at, self._threads)
            if rc != 0:
                raise self.program.fault_error(rc)
        call()
        named = {v.name: outs[j] for j, v in enumerate(self.graph.outputs) if j < len(outs)}
        return call, named

    def profile(self, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[dict]:
        """Mean time per kernel over ``repeat`` runs (needs ``CodegenOptions(profile=True)``; wall or
        calling thread's CPU time as its ``profile_clock`` says),
        slowest first: ``[{"group", "kind", "ops", "ms"}]``."""
        self.take_profile()  # reset
        for _ in range(repeat):
            self.run(feeds)
        rows = self.take_profile()
        for r in rows:
            r["ms"] /= repeat
        return rows

    def take_profile(self) -> list[dict]:
        """The kernel timers' totals since the last call, which resets them (needs
        ``CodegenOptions(profile=True)``), slowest first: ``[{"group", "kind", "ops", "ms"}]``. For
        benchmarks that time their own calls (``prepared``)."""
        if not self.program.options.profile:
            raise OpfuseError("this model was built without profiling: pass CodegenOptions(profile=True)")
        n = self.program.num_functions
        ns = (ctypes.c_uint64 * max(n, 1))()
        grp = (ctypes.c_int * max(n, 1))()
        self._lib.opfuse_profile(ns, grp, n)
        rows = []
        for k in range(n):
            info = self.program.kernels[grp[k]]
            rows.append({"group": info.group, "kind": info.kind, "ops": info.ops, "ms": ns[k] / 1e6})
        return sorted(rows, key=lambda r: -r["ms"])

    # Reporting ---------------------------------------------------------------------------
    @property
    def report(self) -> dict:
        p = self.program
        rep = dict(self.compile_report)
        rep.update({
            "backend": "c",
            "kernels": len(self.plan.groups),
            "functions": p.num_functions,
            "c_functions": p.c_functions,
            "c_kernels": [{"name": k.group, "kind": k.kind, "ops": k.ops, "function": k.function,
                        "scratch_bytes": k.scratch_bytes, "notes": list(k.notes),
                        "split_loops": len(k.parallel), "one_thread": k.one_thread} for k in p.kernels],
            "threads": self._threads,
            "weights_bytes": len(p.weights),
            "subnormal_weights_flushed": p.subnormals_flushed,
            "scratch_bytes_per_thread": p.scratch_stride,
            "source_bytes": len(p.source),
            "compiler": self.toolchain.identity,
            "flags": list(self.toolchain.flags),
            "thread_pool": POOL_DESCRIPTION if self.toolchain.threads else None,
            # None: no loop splits; False: an inference finding the workers asleep runs on one thread
            # (CodegenOptions.pool_wake_min_flops); True: it wakes them
            "wakes_workers": p.wakes_workers,
            "build_seconds": round(self.build_result.seconds, 3),
            "cache_hit": self.build_result.cache_hit,
            "library": str(self.build_result.library),
        })
        rep.update(p.memory.report())
        return rep

    def save_onnx(self, path: str | Path) -> None:
        """The fused model as ONNX, each fusion group a local function named after its rule and
        ops, with the compile report's figures (``opfuse.frontend.onnx_fused``)."""
        from opfuse.frontend.onnx_fused import save_fused_model
        figures = {g["name"]: {k: v for k, v in g.items() if k in _GROUP_FIGURES and v is not None}
                   for g in self.compile_report.get("groups", [])}
        save_fused_model(self.graph, self.plan, path, group_meta=figures)

    def export_c(self, directory: str | Path) -> list[Path]:
        """Write ``model.c``, ``model.h``, ``weights.bin`` (blob mode) and ``report.json``."""
        d = Path(directory)
        if d.exists() and not d.is_dir():
            raise StorageError(f"cannot write C into '{d}': it exists and is not a folder")
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise storage_error(e, "create the folder", d) from None
        rep = {k: v for k, v in self.report.items() if k not in ("library",)}
        contents: dict[str, str | bytes] = {"model.c": self.program.source, "model.h": self.program.header()}
        if self.program.options.weights == "blob":
            contents["weights.bin"] = self.program.weights
        contents["report.json"] = json.dumps(rep, indent=1, sort_keys=True)
        for name, data in contents.items():
            atomic_write(d / name, data)  # a full disk leaves no truncated file
        return [d / name for name in contents]


NativeModule = CompiledModel


def _check_dtypes(graph: Graph) -> None:
    """Every tensor has a C element type; else one line naming the type and the first such value."""
    for v in graph.values.values():
        if v.type is None:
            continue
        try:
            c_type(v.dtype)
        except UnsupportedOpError:
            raise UnsupportedDtypeError(v.dtype.name, v.name, "C", "run it with the reference backend "
                                        "(--backend reference)") from None


def build(graph: Graph, plan: FusionPlan | None = None, *, threads: int | None = None, cache_dir=None,
          options: CodegenOptions | None = None, memory: MemoryPlan | None = None,
          fast_math: bool = False, native: bool = True, sanitize: bool = False) -> CompiledModel:
    """Generate C for ``graph`` under ``plan`` (one kernel per node when ``None``), compile it
    with the system compiler (``ToolchainError`` when there is none), and load it.

    ``threads`` defaults to ``default_threads()``; ``cache_dir`` to ``$OPFUSE_CACHE_DIR`` or
    ``~/.cache/opfuse``; ``sanitize`` builds with UBSan (``toolchain.SANITIZE_FLAGS``: undefined
    behaviour ends the process with its message)."""
    _check_dtypes(graph)
    tc = Toolchain.detect(native=native, fast_math=fast_math, sanitize=sanitize)
    if plan is None and any(needs_float32(n) for n in graph.nodes):
        graph = graph.copy()  # 16-bit float ops compute in float32 between Casts (as fuse(enable=False) does)
        compute_in_float32(graph, RewriteContext(FusionOptions(), Provenance(graph)))
    plan = plan if plan is not None else FusionPlan.unfused(graph)
    program = generate(graph, plan, memory=memory, options=options)
    result = build_library(program.source, tc, cache_dir, prelude=program.prelude)
    return CompiledModel(graph, plan, program, tc, result, threads=threads)
