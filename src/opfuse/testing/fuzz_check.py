"""Checking one fuzz case: the reference executor against the C backend, unfused and fused.

``check`` imports the ONNX model (the exact file a reproducer holds), runs the reference on the
imported graph, then compiles the model with ``opfuse.compile`` unfused and fused (the cost-model
planner or the rules' maximal plan) and runs each build. A case names its code-generation profile
(``CODEGEN_PROFILES``): the host's defaults, the same with the size thresholds that choose kernels
lowered (so that small graphs run the kernels large tensors get), the AVX2 kernels, or the plain C99
build. The verdict is

* ``ok``: every build agrees with the reference, or both raise ``InputError`` (a zero divisor,
  an index out of range); where the fused build runs a QDQ model's products on integer kernels
  (``rules/integer_ops``), it agrees with the reference of its own graph (that integer arithmetic, exactly as
  the other outputs are compared), and that with the reference of the model (within ``QUANTIZED_STEPS`` on the
  case's ``quantized`` outputs, or the steps the case gives a chain's end: stage ``fused rewrite`` where not);
* ``mismatch``: an output differs (integers and bools exactly, the 8-bit outputs of a quantized product
  within ``QUANTIZED_STEPS``; floats NaN where the reference is
  NaN and only there, infinities equal (or both at the edge of overflow, ``OVERFLOW_MARGIN``),
  finite values within ``RTOL``/``ATOL``), or one side
  raises ``InputError`` and the other computes;
* ``crash``: any other exception (a traceback in the importer, the reference, the planner, the
  code generator, the build), or the process dying (a trap: ``Worker``);
* ``unsupported``: the C backend refuses an op or element type with its one-line error (counted,
  not a failure).

``Worker`` runs checks in a child process, so a signal (SIGFPE, SIGSEGV) or a hang is reported
as a crash of that case instead of ending the fuzzer; the next case gets a fresh child.
"""
from __future__ import annotations

import io
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import numpy as np

RTOL, ATOL = 1e-4, 1e-5
# An 8-bit output of a quantization of a float product (a fuzz case's ``quantized`` outputs) agrees with the
# reference's within this many steps: where the product lies at a rounding tie, float32 sums in another order
# (the unfused C's, the Winograd transforms') or the integer kernels' exact accumulator with a 31-bit fixed-point
# multiplier (the fused build's, ``ops/quantized``) round it to the other side.
QUANTIZED_STEPS = 1
# Values within this factor of the type's largest finite value agree with an infinity of their
# sign: the rewrites reassociate (GELU recognition computes 0.5 * x * (1 + erf) where the graph
# had (x * (1 + erf)) * 0.5; affine folding multiplies scales together), so with huge inputs the
# fused build and the reference overflow at different steps: 3e38 against inf.
OVERFLOW_MARGIN = 256.0
CASE_TIMEOUT_S = 300.0
# Code generation a case is built with, over the host's options (``options_for_target("host")``). The
# kernels are chosen by size: streaming stores from 16 MiB outputs, Winograd from 8x8 outputs and 16
# channels, K blocks of 1024, several GEMM tiles from 32K floats, parallel loops from 32K operations,
# staged Sigmoid blocks of 512 floats, attention blocks of 64 keys; the fuzzer's graphs are small, so with
# the defaults they run the small-size paths only. ``thresholds`` lowers those limits (every such path
# taken on a few dozen elements, with many tiles, blocks and threads' shares); ``avx2`` the AVX2 kernels
# where the host has AVX-512 (what a machine without it runs); ``portable`` the plain C99 build
# (``simd="none"``, the Cortex-M7's C on the host); ``ubsan`` the thresholds' kernels built with UBSan
# (``SANITIZED_PROFILES``; ``toolchain.SANITIZE_FLAGS``): undefined behaviour in the C (a float converted to an
# integer type out of its range, a shift too far, a misaligned or null access) ends the case's process, a crash
# whose detail is UBSan's message, where it could otherwise give the reference's answer by the hardware's luck
# (where the compiler cannot sanitize, the profile builds without). All but ``default`` put guards after every
# scratch region and arena block (``CodegenOptions.scratch_guard_bytes``, ``arena_guard_bytes``): a kernel
# writing past one is a crash, which no output may show.
CODEGEN_PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "thresholds": dict(
        stream_store_min_bytes=0, stream_prefetch_floats=64, simd_stage_block=32, simd_unroll=2,
        winograd_min_channels=1, winograd_f2_min_channels=1, winograd_min_spatial=2, winograd_f4_min_spatial=4,
        winograd_small_spatial=1, winograd_small_min_channels=1, winograd_block_floats=1 << 12,
        winograd_prefetch_min_bytes=0, gemm_mc=24, gemm_nc=64, gemm_kc=16, gemm_tile_floats=1024,
        gemm_min_tiles=8, conv_direct_tile_floats=1024, windows_pack_min_channels=1,
        parallel_min_work=0, parallel_dynamic_min_work=0, parallel_min_outer=1, thread_gates=False,
        depthwise_chunk_planes=1, depthwise_min_chunks=1, depthwise_zmm_plane_min_vectors=1,
        attention_block=16, attention_one_pass_max_keys=16, attention_min_tiles=1, recurrent_block_steps=2,
        scratch_guard_bytes=64, arena_guard_bytes=64),
    "avx2": dict(vector_isa="avx2", scratch_guard_bytes=64, arena_guard_bytes=64),
    "portable": dict(simd="none", silu_direct=False, scratch_guard_bytes=64, arena_guard_bytes=64),
}
CODEGEN_PROFILES["ubsan"] = CODEGEN_PROFILES["thresholds"]
SANITIZED_PROFILES = frozenset({"ubsan"})
# Where the sanitizers write their reports in a checking child (log_path in ``UBSAN_OPTIONS`` and
# ``ASAN_OPTIONS``, a file per process id), and the line of each that names the error.
SANITIZER_LOGS = {"ubsan": "runtime error:", "asan": "ERROR: AddressSanitizer:"}


def sanitizer_available() -> bool:
    """Whether this machine's C compiler builds with UBSan (``toolchain.supports_sanitizer``)."""
    from opfuse.runtime.toolchain import ToolchainError, find_compiler, supports_sanitizer
    try:
        return supports_sanitizer(find_compiler())
    except ToolchainError:
        return False


def codegen_options(profile: str):
    """The ``CodegenOptions`` of a profile of ``CODEGEN_PROFILES`` (None: the host's defaults)."""
    from opfuse.codegen.options import options_for_target
    from opfuse.errors import InputError
    if profile not in CODEGEN_PROFILES:
        raise InputError(f"codegen profile '{profile}': expected one of {', '.join(CODEGEN_PROFILES)}")
    fields = CODEGEN_PROFILES[profile]
    return options_for_target("host").with_(**fields) if fields else None


@dataclass(frozen=True)
class Verdict:
    status: str      # ok | mismatch | crash | unsupported
    stage: str = ""  # import | reference | unfused compile | unfused run | fused compile | fused run | process
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "crash")

    def line(self) -> str:
        return self.status if self.status == "ok" else f"{self.status} in {self.stage}: {self.detail}"

    def to_json(self) -> dict:
        return asdict(self)


def describe_error(e: BaseException) -> str:
    """The exception's type and message, and where it was raised (the innermost frame in opfuse)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "opfuse" in f.filename]
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{type(e).__name__}: {str(e)[:500]}{where}"


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def compare(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray],
            quantized: Mapping[str, int] | Collection[str] = ()) -> str | None:
    """The first difference between C's outputs and the reference's, or ``None``; the 8-bit outputs named in
    ``quantized`` may differ by its number of steps (a collection of names: ``QUANTIZED_STEPS`` each)."""
    steps = quantized_tolerance(quantized)
    if list(got) != list(want):
        return f"outputs {list(got)}, the reference has {list(want)}"
    for name, w in want.items():
        g = np.asarray(got[name])
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output '{name}' is {g.dtype}{list(g.shape)}, the reference's {w.dtype}{list(w.shape)}"
        if name in steps and w.dtype in (np.dtype(np.int8), np.dtype(np.uint8)):
            bad = np.abs(g.astype(np.int16) - w.astype(np.int16)) > steps[name]
        elif w.dtype.kind != "f":
            bad = g != w
        else:
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            edge = float(np.finfo(w.dtype).max) / OVERFLOW_MARGIN
            with np.errstate(invalid="ignore"):  # an infinity equals only itself ...
                close = np.isfinite(w64) & (np.abs(g64 - w64) <= ATOL + RTOL * np.abs(w64))
                # ... or a value of its sign at the edge of overflow (see OVERFLOW_MARGIN)
                close |= (np.abs(g64) >= edge) & (np.abs(w64) >= edge) & (np.sign(g64) == np.sign(w64))
            nan = np.isnan(w64)
            bad = (nan != np.isnan(g64)) | (~nan & ~(close | (g64 == w64)))
        if bad.any():
            at = _first(bad)
            return (f"output '{name}'{list(at)}: C {g[at]!r}, reference {w[at]!r} "
                    f"({int(bad.sum())} of {bad.size} elements differ)")
    return None


def quantized_tolerance(quantized: Mapping[str, int] | Collection[str]) -> dict[str, int]:
    """Steps per quantized output: a mapping as it is, a collection of names ``QUANTIZED_STEPS`` each (a
    reproducer's case.json written before chains of products)."""
    if isinstance(quantized, Mapping):
        return {str(k): int(v) for k, v in quantized.items()}
    return {str(name): QUANTIZED_STEPS for name in quantized}


def check(model: bytes, feeds: Mapping[str, np.ndarray], planner: str = "auto", threads: int = 1,
          codegen: str = "default", quantized: Mapping[str, int] | Collection[str] = ()) -> Verdict:
    """The verdict on one model and its inputs (see the module docstring), in this process, its builds with
    the code-generation profile ``codegen``; ``quantized``: 8-bit outputs compared within their steps
    (``compare``)."""
    import onnx

    import opfuse
    from opfuse.compiler import CompileOptions, build_native, plan_model
    from opfuse.codegen import UnsupportedGroupError
    from opfuse.errors import InputError, UnsupportedOpError
    from opfuse.runtime import reference

    warnings.simplefilter("ignore")  # NumPy's overflow and invalid-value warnings are expected here
    sanitize = codegen in SANITIZED_PROFILES and sanitizer_available()
    proto = onnx.load_from_string(model)
    try:
        graph = opfuse.load(proto)
    except Exception as e:  # noqa: BLE001  # any failure is the verdict
        return Verdict("crash", "import", describe_error(e))
    try:
        with np.errstate(all="ignore"):
            want, ref_error = reference.run(graph, feeds), None
    except InputError as e:
        want, ref_error = {}, str(e)
    except Exception as e:  # noqa: BLE001
        return Verdict("crash", "reference", describe_error(e))
    for variant, options in (("unfused", {"fuse": False}), ("fused", {"fuse": True, "planner": planner})):
        try:
            if codegen == "default":
                built = opfuse.compile(proto, threads=threads, **options)
            else:
                built = build_native(plan_model(proto, CompileOptions(**options)), threads=threads,
                                     codegen_options=codegen_options(codegen), sanitize=sanitize)
        except UnsupportedOpError as e:
            if isinstance(e, UnsupportedGroupError):  # the planner chose a group codegen cannot build
                return Verdict("crash", f"{variant} compile", describe_error(e))
            return Verdict("unsupported", f"{variant} compile", str(e))
        except Exception as e:  # noqa: BLE001
            return Verdict("crash", f"{variant} compile", describe_error(e))
        try:
            got = built.run(feeds)
        except InputError as e:
            if ref_error is None:
                return Verdict("mismatch", f"{variant} run", f"C raised InputError ({e}); the reference computed "
                                                             f"the outputs")
            continue
        except Exception as e:  # noqa: BLE001
            return Verdict("crash", f"{variant} run", describe_error(e))
        if ref_error is not None:
            return Verdict("mismatch", f"{variant} run", f"the reference raised InputError ({ref_error}); C "
                                                         f"computed the outputs")
        own = _integer_arithmetic(built.compilation, feeds) if variant == "fused" else None
        if isinstance(own, Verdict):
            return own
        if own is not None:  # the C against its own graph exactly, that graph against the float model's
            diff = compare(got, own)
            if diff is not None:
                return Verdict("mismatch", "fused run", f"{diff}, against the reference of the fused build's "
                                                        f"integer graph")
            diff = compare(own, want, quantized)
            if diff is not None:
                return Verdict("mismatch", "fused rewrite", f"{diff}: the integer graph's reference against the "
                                                            f"float model's")
            continue
        diff = compare(got, want, quantized)
        if diff is not None:
            return Verdict("mismatch", f"{variant} run", diff)
    return Verdict("ok")


def _integer_arithmetic(compilation, feeds: Mapping[str, np.ndarray]) -> "dict[str, np.ndarray] | Verdict | None":
    """Where the fused build's graph has integer rewrites of a QDQ model's products (``recognize_integer``), the
    reference's outputs of that graph: the arithmetic the C must give exactly (the float model's within one
    step, ``QUANTIZED_STEPS``); None where it has none (a crash verdict where the reference fails on it)."""
    from opfuse.runtime import reference
    if compilation is None or not compilation.integer_rewrites():
        return None
    try:
        with np.errstate(all="ignore"):
            return reference.run(compilation.graph, feeds)
    except Exception as e:  # noqa: BLE001
        return Verdict("crash", "fused reference", describe_error(e))


# The child process ------------------------------------------------------------------------------

def _serve(conn, cache_dir: str | None) -> None:
    """The worker's loop: receive (model, feeds, planner, threads, codegen, quantized), send back the verdict. Ctrl-C is
    the fuzzer's to handle (it stops this process): here it would only print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cache_dir:
        os.environ["OPFUSE_CACHE_DIR"] = cache_dir
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        model, npz, planner, threads, codegen, quantized = job
        with np.load(io.BytesIO(npz)) as data:
            feeds = {k: data[k] for k in data.files}
        try:
            verdict = check(model, feeds, planner, threads, codegen, quantized)
        except Exception as e:  # noqa: BLE001  # a bug in check itself must not hang the parent
            verdict = Verdict("crash", "check", describe_error(e))
        conn.send(verdict)


def pack_inputs(feeds: Mapping[str, np.ndarray]) -> bytes:
    """The inputs as the bytes of an .npz file (what the reproducer holds)."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in feeds.items()})  # type: ignore[arg-type]
    return buf.getvalue()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Worker:
    """Checks cases in a child process (``spawn``ed: no state shared with the fuzzer's process).

    A child that dies is a ``crash`` verdict naming the signal (or exit status); one that takes
    longer than ``timeout`` seconds is killed and is a ``crash`` too. Either way the next case
    starts a new child. ``cache_dir`` is the children's build cache; ``serve`` the child's loop
    (a module-level function, for tests)."""

    def __init__(self, cache_dir: str | None = None, timeout: float = CASE_TIMEOUT_S,
                 serve: Callable[[Any, str | None], None] | None = None):
        self.cache_dir = cache_dir
        self.timeout = timeout
        self.serve = serve or _serve
        self._proc: Any = None  # a multiprocessing Process of the spawn context
        self._conn: Any = None  # its end of the Pipe
        self._logs: str | None = None  # the children's sanitizer reports (``_start``)

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=self.serve, args=(child, self.cache_dir), daemon=True)
        if self._logs is None:
            self._logs = tempfile.mkdtemp(prefix="opfuse-fuzz-sanitizers-")
        # The child's environment is this one's at its start: a sanitized build (the ubsan profile; every build
        # with $CC and LD_PRELOAD set for AddressSanitizer, ``make fuzz-sanitized``) reports into files here,
        # after the options already set (ASan's detect_leaks=0).
        saved = {}
        for name in SANITIZER_LOGS:
            var = f"{name.upper()}_OPTIONS"
            saved[var] = os.environ.get(var)
            own = f"log_path={os.path.join(self._logs, name)}:print_stacktrace=0"
            os.environ[var] = f"{saved[var]}:{own}" if saved[var] else own
        try:
            self._proc.start()
        finally:
            for var, value in saved.items():
                if value is None:
                    del os.environ[var]
                else:
                    os.environ[var] = value
        child.close()
        self._conn = parent

    def _sanitizer_report(self, pid: int | None) -> str:
        """The first line naming an error in a sanitizer's report of the child ``pid`` (UBSan's "runtime error"
        with its source file named without the build folder, AddressSanitizer's "ERROR"), or ""."""
        if self._logs is None or pid is None:
            return ""
        for name, mark in SANITIZER_LOGS.items():
            try:
                text = Path(self._logs, f"{name}.{pid}").read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if mark not in line:
                    continue
                if name == "ubsan":
                    where, _, what = line.partition(" runtime error:")
                    return f"UBSan: {os.path.basename(where.strip())} runtime error:{what}"
                # "SUMMARY: AddressSanitizer: heap-buffer-overflow (/.../libmodel.so+0x1c3e) in k2_relu_0"
                summary = re.search(r"SUMMARY: (AddressSanitizer: \S+)(?: \(\S*\))?( in \S+)?", text)
                if summary:
                    return summary.group(1) + (summary.group(2) or "")
                return line[line.index(mark) + len("ERROR: "):].split(" on address")[0]
        return ""

    def check(self, model: bytes, npz: bytes, planner: str = "auto", threads: int = 1,
              codegen: str = "default", quantized: Mapping[str, int] | Collection[str] = ()) -> Verdict:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        assert self._conn is not None and self._proc is not None
        try:
            self._conn.send((model, npz, planner, threads, codegen, quantized_tolerance(quantized)))
            if self._conn.poll(self.timeout):
                return self._conn.recv()
            self._stop(kill=True)
            return Verdict("crash", "process", f"no verdict after {self.timeout:.0f} s (killed)")
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._proc.join(10)
            code, pid = self._proc.exitcode, self._proc.pid
            self._stop(kill=True)
            how = _signal_name(code) if code is not None and code < 0 else f"exit status {code}"
            report = self._sanitizer_report(pid)
            return Verdict("crash", "process", f"the process running the case died: {how}"
                                               + (f" ({report})" if report else ""))

    def _stop(self, kill: bool = False) -> None:
        if self._proc is not None:
            if kill:
                self._proc.kill()
            elif self._conn is not None:
                try:
                    self._conn.send(None)
                except (BrokenPipeError, OSError):
                    self._proc.kill()
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        self._stop()
        if self._logs is not None:
            shutil.rmtree(self._logs, ignore_errors=True)
            self._logs = None

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self._stop(kill=exc_type is not None)  # interrupted or failing: no wait for the case in flight
        self.close()
