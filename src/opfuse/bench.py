"""opfuse next to its peers on one model: the fused and the unfused C build, onnxruntime and
OpenVINO, timed in one process, with the machine's yardsticks and a cross-check of the outputs.

    from opfuse.bench import bench
    result = bench("zoo:resnet8", vs=("onnxruntime", "openvino"), threads=2, repeat=50)
    result["contenders"]["opfuse_fused"]["median_ms"], result["ratios"]["opfuse_fused"]

How it measures, so the numbers survive a shared machine:

* every contender runs the same seeded inputs, and the calls are interleaved, A B C B C A C A B ...
  (each round starts one contender later), after ``warmup`` untimed rounds, so a change of load hits
  all of them alike and each follows each of the others equally often: a model that ran right after
  OpenVINO in every round paid for the caches OpenVINO left (ds_cnn at 1 thread: opfuse fused 0.103
  ms after OpenVINO, 0.078 ms after opfuse unfused; unfused 0.092 and 0.084 after fused);
* every contender gets ``threads`` threads and none may busy-wait when idle: opfuse's pool workers
  spin 0.1 ms after a parallel loop, then sleep (``opfuse.runtime.threads``); onnxruntime runs with ``ORT_ENABLE_ALL``,
  ``intra_op_num_threads = threads`` and ``session.intra_op.allow_spinning = 0``, or its idle
  workers would steal the cores from the next contender; OpenVINO runs with the latency hint,
  one stream, ``INFERENCE_NUM_THREADS = threads``, no CPU pinning and float32 precision (on CPUs
  with bf16 it would otherwise compute in bf16);
* a contender's ``ratio`` is its median over the best peer's (the lowest median among the peers);
* the outputs of every pair of contenders are compared (max abs difference), so a fast wrong
  answer shows: a contender's ``max_abs_error`` is its difference to the contender it agrees with
  best (a wrong one stands out once two others agree), and ``outputs_agree`` holds when every
  pair is within ``AGREE_RTOL * max(1, max |output|)``;
* with ``groups``, the per-group check: the fused and the unfused build again, with kernel
  timers, run in turn; each fused group's median against the sum of its original ops' unfused
  kernel medians, and the groups where fusion measured slower named (``group_check``);
* the yardsticks (one-core NumPy sgemm, ``np.copyto`` bandwidth) are timed in the same run
  (``opfuse.yardsticks``: the sgemm with OpenBLAS choosing its kernels for this CPU, in a child
  process without the environment's ``OPENBLAS_CORETYPE`` and the like, and the figure they hold
  it to next to it), and ``other_processes_cores`` says how many cores' worth of
  CPU the rest of the machine took meanwhile (a shared machine's timings read against it).

A peer that is not installed is skipped and named in ``skipped``.
"""
from __future__ import annotations

import importlib.metadata
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.runtime.compare import integer_difference, integral

PEERS = ("onnxruntime", "openvino")
FUSED, UNFUSED = "opfuse_fused", "opfuse_unfused"
DEFAULT_REPEAT = 30
DEFAULT_WARMUP = 3
# Rounds of the per-group check (``groups``) when ``group_repeat`` is not given: at least this many, each one
# run of either build with kernel timers. A ~1 ms convolution's paired round-to-round difference between the
# builds spreads over +-50-100 us (interquartile, mobilenet_v1's pointwise convolutions at 1 thread), ten
# times the 5-15 us epilogue it stands next to, so its median needs more rounds than a whole-model median.
GROUP_CHECK_REPEAT = 100
AGREE_RTOL = 1e-3  # float32 contenders that reorder sums differ by ~1e-6 relative; a wrong answer by far more
INSTALL_HINT = "pip install 'opfuse[bench]'"

Outputs = dict[str, np.ndarray]


@dataclass
class Contender:
    """One way of running the model: ``run()`` returns its outputs by name."""

    name: str
    run: Callable[[], Outputs]
    info: dict = field(default_factory=dict)  # version and settings, reported as they are


class PeerUnavailable(Exception):
    """A peer that cannot run here (not installed); the reason is reported, the peer skipped."""


def parse_peers(vs: str | Iterable[str]) -> tuple[str, ...]:
    """Peers from ``"onnxruntime,openvino"`` or a sequence; ``""`` or ``"none"`` for none."""
    names = [n.strip() for n in (vs.split(",") if isinstance(vs, str) else vs)]
    names = [n for n in names if n and n != "none"]
    for n in names:
        if n not in PEERS:
            raise OpfuseError(f"unknown peer '{n}'; choose from {', '.join(PEERS)} (comma-separated)")
    return tuple(dict.fromkeys(names))


def _check_counts(threads: int, repeat: int, warmup: int) -> None:
    for name, value, least in (("threads", threads, 1), ("repeat", repeat, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or value < least:
            raise OpfuseError(f"{name} must be an integer >= {least}, got {value!r}")


# Contenders ------------------------------------------------------------------------------------

def _opfuse(name: str, graph, feeds: Outputs, *, fuse: bool, threads: int) -> Contender:
    from opfuse.compiler import compile as compile_model
    model = compile_model(graph, fuse=fuse, threads=threads)
    rep = model.report
    info = {"kernels": rep["kernels_after"], "threads": model.threads, "cache_hit": rep["cache_hit"],
            "build_seconds": rep["build_seconds"], "thread_pool": rep["thread_pool"]}
    return Contender(name, lambda: model.run(feeds), info)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _onnxruntime(proto: bytes, feeds: Outputs, threads: int) -> Contender:
    try:
        import onnxruntime as ort
    except ImportError:
        raise PeerUnavailable(f"onnxruntime is not installed ({INSTALL_HINT})") from None
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    sess = ort.InferenceSession(proto, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    info = {"version": _version("onnxruntime"), "threads": threads, "graph_optimization": "ORT_ENABLE_ALL",
            "allow_spinning": 0}
    return Contender("onnxruntime", lambda: dict(zip(names, sess.run(names, feeds), strict=True)), info)


def _openvino(proto: bytes, feeds: Outputs, threads: int) -> Contender:
    try:
        import openvino as ov
    except ImportError:
        raise PeerUnavailable(f"openvino is not installed ({INSTALL_HINT})") from None
    core = ov.Core()
    config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": threads,
              "ENABLE_CPU_PINNING": False, "INFERENCE_PRECISION_HINT": "f32"}
    compiled = core.compile_model(core.read_model(proto), "CPU", config)
    request = compiled.create_infer_request()
    names = [o.get_any_name() for o in compiled.outputs]

    def run() -> Outputs:
        result = request.infer(feeds)
        return {n: np.array(result[o]) for n, o in zip(names, compiled.outputs, strict=True)}
    info = {"version": _version("openvino"), "threads": threads,
            **{k: str(v) for k, v in config.items() if k != "INFERENCE_NUM_THREADS"}}
    return Contender("openvino", run, info)


PEER_BUILDERS: Mapping[str, Callable[[bytes, Outputs, int], Contender]] = {
    "onnxruntime": _onnxruntime, "openvino": _openvino}


# Timing and checking ---------------------------------------------------------------------------

def time_interleaved(contenders: list[Contender], repeat: int, warmup: int,
                     progress: Callable[[int, int], None] | None = None,
                     cpu: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Wall seconds of each contender's ``repeat`` timed calls, in rounds A B C, B C A, C A B, ...
    (round ``r`` starts at contender ``r mod n``, so each follows each other as often) after
    ``warmup`` untimed rounds; ``progress(round, rounds)`` after each round. ``cpu``, when given,
    receives each call's process CPU seconds (all threads) by name: on a loaded machine a
    one-thread contender's CPU time is what it cost, where its wall time includes the waits."""
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    if cpu is not None:
        cpu.update({c.name: [] for c in contenders})
    rounds = warmup + repeat
    for r in range(rounds):
        k = r % len(contenders) if contenders else 0
        for c in contenders[k:] + contenders[:k]:
            c0, t0 = time.process_time(), time.perf_counter()
            c.run()
            t1, c1 = time.perf_counter(), time.process_time()
            if r >= warmup:
                samples[c.name].append(t1 - t0)
                if cpu is not None:
                    cpu[c.name].append(c1 - c0)
        if progress is not None:
            progress(r + 1, rounds)
    return samples


class OtherLoad:
    """Cores' worth of CPU that other processes used while the block ran (``cores``), from
    ``/proc/stat`` minus this process's own CPU time: on a shared machine it says how much of the
    machine the contenders had. ``None`` where ``/proc/stat`` does not exist."""

    def __init__(self) -> None:
        self.cores: float | None = None
        self._start: tuple[tuple[int, int] | None, float] = (None, 0.0)

    @staticmethod
    def _busy_total() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # minus idle and iowait

    def __enter__(self) -> "OtherLoad":
        self._start = self._busy_total(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        end, start = self._busy_total(), self._start[0]
        if end is None or start is None or end[1] == start[1]:
            return
        hz = os.sysconf("SC_CLK_TCK")
        ncpu = os.cpu_count() or 1
        busy_s = (end[0] - start[0]) / hz
        wall_s = (end[1] - start[1]) / hz / ncpu
        self.cores = max(busy_s - (time.process_time() - self._start[1]), 0.0) / wall_s


def summarize(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1e3
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)), "min_ms": float(ms.min()),
            "runs": len(seconds)}


def max_abs_difference(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> tuple[float, float, bool]:
    """Max abs difference over the outputs both sides name, the largest |output| seen there, and whether every
    integer output is the same on both sides (``runtime.compare``: taken exactly, none allowed)."""
    err, scale, integers_equal = 0.0, 0.0, True
    for name in a.keys() & b.keys():
        x0, y0 = np.asarray(a[name]), np.asarray(b[name])
        if x0.shape != y0.shape:
            return float("inf"), scale, False
        if not x0.size:
            continue
        if integral(x0) and integral(y0):
            diff = integer_difference(x0, y0)[0]
            integers_equal &= diff == 0
            err = max(err, diff)
            continue
        x, y = x0.astype(np.float64), y0.astype(np.float64)
        err = max(err, float(np.max(np.abs(x - y))))
        scale = max(scale, float(np.max(np.abs(x))), float(np.max(np.abs(y))))
    return err, scale, integers_equal


def cross_check(outputs: Mapping[str, Outputs]) -> dict:
    """Every pair's max abs difference (``"a vs b"``); each contender's ``nearest``: its difference
    to the contender it agrees with best; and whether every pair agrees."""
    pairs: dict[str, float] = {}
    nearest = {name: float("inf") if len(outputs) > 1 else 0.0 for name in outputs}
    agree = True
    for (a, oa), (b, ob) in itertools.combinations(outputs.items(), 2):
        err, scale, integers_equal = max_abs_difference(oa, ob)
        pairs[f"{a} vs {b}"] = err
        nearest[a], nearest[b] = min(nearest[a], err), min(nearest[b], err)
        agree &= integers_equal and err <= AGREE_RTOL * max(1.0, scale)
    return {"pairs": pairs, "nearest": nearest, "outputs_agree": agree, "rtol": AGREE_RTOL}


# The benchmark ---------------------------------------------------------------------------------

def bench(model, vs: str | Iterable[str] = PEERS, threads: int | None = None, repeat: int = DEFAULT_REPEAT,
          warmup: int = DEFAULT_WARMUP, *, seed: int = 0, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
          yardsticks: bool = True, progress: Callable[[int, int], None] | None = None,
          inputs: Mapping[str, np.ndarray] | None = None, groups: bool = False,
          group_repeat: int | None = None) -> dict:
    """Time ``model`` (``zoo:NAME``, an ``.onnx`` path, a ModelProto) fused and unfused against the
    peers ``vs``, with ``threads`` each (default: the cores available). Returns a JSON-ready dict:
    ``contenders`` (name -> ``median_ms``, ``p90_ms``, ``min_ms``, ``runs``, ``cpu_median_ms``: the
    median process CPU time of a call, ``max_abs_error``, settings), ``best_peer``, ``ratios``
    (name -> median over the best peer's; empty without peers), ``errors`` (``cross_check``),
    ``skipped`` (peer -> why), ``yardsticks`` and the settings. ``inputs`` replaces the seeded
    random inputs (checked against the model's). ``groups``: also ``group_check``
    (``opfuse.measure.group_check``): every fused group's time next to its ops' unfused kernels,
    both built with kernel timers and run in turn, the groups that fusion made slower named, in
    ``group_repeat`` rounds (default: ``repeat``, at least ``GROUP_CHECK_REPEAT``).
    ``OpfuseError`` for an unknown model or peer and for counts below one."""
    from opfuse.api import load, onnx_proto
    from opfuse.yardsticks import yardsticks as time_yardsticks
    from opfuse.runtime.reference import check_inputs, random_inputs
    from opfuse.runtime.threads import default_threads
    peers = parse_peers(vs)
    threads = default_threads() if threads is None else threads
    _check_counts(threads, repeat, warmup)
    if group_repeat is not None and group_repeat < 1:
        raise OpfuseError(f"group repeat must be at least 1, got {group_repeat}")
    graph = load(model, input_shapes)
    feeds = check_inputs(graph, inputs) if inputs is not None else random_inputs(graph, seed)
    contenders = [_opfuse(FUSED, graph, feeds, fuse=True, threads=threads),
                  _opfuse(UNFUSED, graph, feeds, fuse=False, threads=threads)]
    skipped: dict[str, str] = {}
    if peers:
        proto = onnx_proto(model).SerializeToString()  # the peers get the model as given, not opfuse's import
        for peer in peers:
            try:
                contenders.append(PEER_BUILDERS[peer](proto, feeds, threads))
            except PeerUnavailable as e:
                skipped[peer] = str(e)
    ys = time_yardsticks() if yardsticks else None
    outputs = {c.name: c.run() for c in contenders}
    errors = cross_check(outputs)
    cpu: dict[str, list[float]] = {}
    with OtherLoad() as others:
        samples = time_interleaved(contenders, repeat, warmup, progress, cpu=cpu)
    rows = {c.name: {**summarize(samples[c.name]), "cpu_median_ms": float(np.median(cpu[c.name]) * 1e3),
                     "max_abs_error": errors["nearest"][c.name], **c.info} for c in contenders}
    present = [p for p in peers if p in rows]
    best = min(present, key=lambda p: rows[p]["median_ms"]) if present else None
    ratios = {n: r["median_ms"] / rows[best]["median_ms"] for n, r in rows.items()} if best else {}
    spec = os.fspath(model) if isinstance(model, (str, os.PathLike)) else graph.name
    checked = None
    if groups:
        from opfuse.measure import group_check
        rounds = max(repeat, GROUP_CHECK_REPEAT) if group_repeat is None else group_repeat
        checked = group_check(graph, threads=threads, repeat=rounds, seed=seed)
    return {"model": spec, "graph": graph.name, "threads": threads, "repeat": repeat, "warmup": warmup, "seed": seed,
            "cpus_available": cpus_available(), "other_processes_cores": others.cores,
            "order": [c.name for c in contenders], "contenders": rows, "best_peer": best, "ratios": ratios,
            "errors": errors, "skipped": skipped, "yardsticks": ys, "group_check": checked}


def cpus_available() -> int:
    """Cores this process may run on (what ``threads`` defaults to without ``OMP_NUM_THREADS``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


__all__ = ["bench", "parse_peers", "cross_check", "time_interleaved", "summarize", "Contender", "PEERS", "FUSED",
           "UNFUSED"]
