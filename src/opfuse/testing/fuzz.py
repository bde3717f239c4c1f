"""opfuse's fuzzer: random valid models with hostile inputs, through the whole pipeline, against
the reference executor; every failure shrunk to a minimal reproducer.

    from opfuse.testing.fuzz import fuzz, replay
    report = fuzz(count=200, seed=0, out="opfuse-fuzz")   # FuzzReport: graphs, mismatches, crashes
    replay("opfuse-fuzz/mismatch-1")                        # the verdict on one reproducer again

    $ opfuse fuzz --count 200 --seed 0 --out opfuse-fuzz
    $ opfuse fuzz --replay opfuse-fuzz/mismatch-1

The cases are ``fuzz_cases.fuzz_cases`` (every op family and element type, fan-out, diamonds,
shared weights, long chains and siblings from the graph generator; NaN, infinities and extreme
values in the inputs). Each is exported to ONNX and checked by ``fuzz_check.check`` in a child
process (a trap or a hang is a crash, not the end of the run): the reference against
``opfuse.compile`` unfused and fused. Hypothesis is the engine that draws the cases; a mismatch
or crash is then cut down to a minimal graph while it fails the same way (``fuzz_reduce``), and
written to ``out/<status>-<n>/``: ``model.onnx``, ``inputs.npz``, ``case.json`` (the verdict, the
build options), ``README.txt`` with the command that reproduces it, and the case as found in
``original/``. The run then goes on with the next seed until ``count`` graphs were checked.

The builds go to a private cache folder removed at the end, and plan for the host with its
nominal constants whatever was calibrated, so a reproducer replays the same plan anywhere.
"""
from __future__ import annotations

import json
import queue
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Unsatisfiable

from opfuse.errors import InputError
from opfuse.ir.graph import Graph
from opfuse.testing.fuzz_cases import FuzzCase, fuzz_cases
from opfuse.testing.fuzz_check import (CASE_TIMEOUT_S, CODEGEN_PROFILES, Verdict, Worker, describe_error, pack_inputs,
                                       quantized_tolerance)
from opfuse.testing.fuzz_reduce import minimize
from opfuse.testing.random_graphs import DEFAULT_OPS, _check_ops

MAX_NODES = 24
REPLAY_COMMAND = "opfuse fuzz --replay {path}"


@dataclass
class Finding:
    verdict: Verdict
    description: str    # of the shrunk case
    path: Path | None   # its reproducer folder (None when not written)


@dataclass
class FuzzReport:
    graphs: int = 0
    mismatches: int = 0
    crashes: int = 0
    unsupported: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    unsupported_reasons: dict[str, int] = field(default_factory=dict)
    op_graphs: dict[str, int] = field(default_factory=dict)  # op type -> graphs checked that hold it
    extra_graphs: dict[str, int] = field(default_factory=dict)  # extra (``fuzz_cases.EXTRAS``) -> graphs given it

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and self.crashes == 0

    def summary(self) -> str:
        return (f"{self.graphs} graphs, {len(self.op_graphs)} op types, {self.mismatches} mismatches, "
                f"{self.crashes} crashes, {self.unsupported} unsupported, {self.seconds:.0f} s")


class _Failed(Exception):
    """A failing case: ends the Hypothesis round."""


class _OutOfTime(Exception):
    """The time budget is spent: ends the Hypothesis round, which would otherwise go on drawing every case it has
    left (up to ``count``), checking none."""


def _model_bytes(graph: Graph) -> bytes:
    from opfuse.frontend.onnx import export_model
    return export_model(graph).SerializeToString()


def _steps_text(quantized: dict[str, int]) -> str:
    return ", ".join(f"{name} ({steps} step{'s' if steps > 1 else ''})" for name, steps in quantized.items())


def write_reproducer(case: FuzzCase, verdict: Verdict, folder: Path) -> Path:
    """``model.onnx``, ``inputs.npz``, ``case.json`` and ``README.txt`` of a failing case."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(_model_bytes(case.graph))
    (folder / "inputs.npz").write_bytes(pack_inputs(case.feeds))
    info = {"verdict": verdict.to_json(), "case": case.describe(), "planner": case.planner, "threads": case.threads,
            "codegen": case.codegen, "quantized": dict(case.quantized)}
    (folder / "case.json").write_text(json.dumps(info, indent=1) + "\n")
    (folder / "README.txt").write_text(
        f"opfuse fuzz found: {verdict.line()}\ncase: {case.describe()}\n\nreproduce:\n  "
        f"{REPLAY_COMMAND.format(path=folder)}\n\nor by hand: opfuse run {folder / 'model.onnx'} --backend c "
        f"--inputs {folder / 'inputs.npz'} --compare reference{' --no-fuse' if 'unfused' in verdict.stage else ''}\n"
        + (f"  (that runs the default code generation; the case was built with the profile '{case.codegen}', "
           f"opfuse.testing.fuzz_check.CODEGEN_PROFILES: {CODEGEN_PROFILES[case.codegen]})\n"
           if case.codegen != "default" else "")
        + (f"  (outputs {_steps_text(case.quantized)} are 8-bit quantizations of a float product: that many steps "
           f"from the reference is agreement, which --compare does not know)\n" if case.quantized else ""))
    return folder


def fuzz(count: int = 100, seed: int = 0, ops: Iterable[str] | None = None, out: str | Path | None = None, *,
         max_nodes: int = MAX_NODES, shrink: bool = True, time_budget: float | None = None,
         timeout: float = CASE_TIMEOUT_S, progress: Callable[[str], None] | None = None, jobs: int = 1) -> FuzzReport:
    """Check ``count`` random cases (see the module docstring); write each failure's shrunk case
    under ``out`` (nothing is written when it is ``None``). ``ops`` limits the ops of the graphs
    (default: every standard op the generator knows). ``time_budget`` (seconds) stops early.
    ``jobs`` > 1: that many processes, each its share of ``count`` from its own seed (``job_seeds``),
    reproducers under ``out/job-<j>/``; the same seed and jobs, the same graphs."""
    if count < 0:
        raise InputError(f"count must be >= 0, got {count}")
    if jobs < 1:
        raise InputError(f"jobs must be >= 1, got {jobs}")
    ops = _check_ops(DEFAULT_OPS if ops is None else ops)
    if jobs > 1:
        return _fuzz_jobs(count, seed, ops, out, jobs, dict(max_nodes=max_nodes, shrink=shrink,
                                                             time_budget=time_budget, timeout=timeout), progress)
    say = progress or (lambda line: None)
    report = FuzzReport()
    started = time.monotonic()
    cache = tempfile.mkdtemp(prefix="opfuse-fuzz-cache-")
    try:
        with Worker(cache, timeout) as worker:
            round_seed = seed
            while report.graphs < count and not _out_of_time(started, time_budget):
                _one_round(worker, round_seed, count, ops, max_nodes, shrink, time_budget, started, out, report, say)
                round_seed += 1
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    report.seconds = time.monotonic() - started
    return report


# Job j of a parallel run starts from seed + j * JOB_SEED_STRIDE: a job moves to the next seed only
# after a failure, so the jobs' seeds never meet.
JOB_SEED_STRIDE = 1_000_003


def job_seeds(seed: int, count: int, jobs: int) -> list[tuple[int, int]]:
    """(first seed, graphs) of each job of a parallel run: ``count`` split as evenly as it goes."""
    return [(seed + j * JOB_SEED_STRIDE, count // jobs + (1 if j < count % jobs else 0)) for j in range(jobs)]


def _fuzz_job(j: int, seed: int, count: int, ops: frozenset[str], out: str | None, options: dict,
              lines) -> None:
    """One job of a parallel run, in its own process: its report (or the error that stopped it) and its
    progress lines go back through the queue ``lines``. Ctrl-C is the parent's (it terminates the jobs); a
    termination unwinds the job, so its checking child is stopped and its cache removed."""
    import signal
    import sys
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        report = fuzz(count, seed, ops, out, progress=lambda line: lines.put((j, "line", line)), **options)
    except Exception as e:  # noqa: BLE001  # the parent raises it
        lines.put((j, "error", str(e) if isinstance(e, InputError) else describe_error(e)))
    else:
        lines.put((j, "report", report))


def _fuzz_jobs(count: int, seed: int, ops: frozenset[str], out, jobs: int, options: dict,
               progress: Callable[[str], None] | None) -> FuzzReport:
    import multiprocessing
    say = progress or (lambda line: None)
    ctx = multiprocessing.get_context("spawn")
    lines = ctx.Queue()
    started = time.monotonic()
    procs = []
    for j, (job_seed, job_count) in enumerate(job_seeds(seed, count, jobs)):
        job_out = str(Path(out) / f"job-{j}") if out is not None else None
        # not daemonic: each job starts its own checking child (``Worker``)
        p = ctx.Process(target=_fuzz_job, args=(j, job_seed, job_count, ops, job_out, options, lines))
        p.start()
        procs.append(p)
    report, errors, done = FuzzReport(), [], 0
    try:
        while done < jobs:
            try:
                j, kind, item = lines.get(timeout=1.0)
            except queue.Empty:  # check that no job died without a word
                dead = [(j, p.exitcode) for j, p in enumerate(procs) if p.exitcode not in (0, None)]
                if dead and lines.empty():
                    raise InputError(f"fuzz job(s) died (job, exit code): {dead}") from None
                continue
            if kind == "line":
                say(f"[job {j}] {item}")
            elif kind == "error":
                errors.append(f"job {j}: {item}")
                done += 1
            else:
                _merge(report, item)
                done += 1
    except BaseException:  # Ctrl-C or an error: the jobs stop now
        for p in procs:
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:  # the same for every job (an op set no graph can be drawn from): said once
        said = {e.split(": ", 1)[1] for e in errors}
        raise InputError(said.pop() if len(said) == 1 else "; ".join(errors))
    report.seconds = time.monotonic() - started
    return report


def _merge(into: FuzzReport, part: FuzzReport) -> None:
    into.graphs += part.graphs
    into.mismatches += part.mismatches
    into.crashes += part.crashes
    into.unsupported += part.unsupported
    into.findings += part.findings
    for mine, theirs in ((into.unsupported_reasons, part.unsupported_reasons), (into.op_graphs, part.op_graphs),
                         (into.extra_graphs, part.extra_graphs)):
        for k, n in theirs.items():
            mine[k] = mine.get(k, 0) + n


def _undrawable(ops: frozenset[str]) -> str:
    """The one line for an op set no graph can be drawn from (an op whose inputs must be kept in its domain by
    another op, Tan by Tanh, allowed alone), with the set that draws them (``focused_ops``)."""
    from opfuse.testing.random_graphs import focused_ops
    wider = sorted(set().union(*(focused_ops(op) for op in ops)) | ops)
    return (f"no graph can be drawn from ops {sorted(ops)} alone (some need others to feed them inputs in "
            f"their domain); try --ops {' '.join(wider)}")


def _out_of_time(started: float, budget: float | None) -> bool:
    return budget is not None and time.monotonic() - started > budget


def _one_round(worker: Worker, round_seed: int, count: int, ops, max_nodes: int, shrink: bool,
               time_budget: float | None, started: float, out, report: FuzzReport, say) -> None:
    """Hypothesis from ``round_seed`` until ``count`` graphs in all or the first failure (then shrunk)."""
    failing: list[tuple[FuzzCase, Verdict]] = []

    def check(case: FuzzCase) -> None:
        if report.graphs >= count:
            return
        if _out_of_time(started, time_budget):
            raise _OutOfTime
        report.graphs += 1
        for op in {n.op_type for n in case.graph.nodes}:
            report.op_graphs[op] = report.op_graphs.get(op, 0) + 1
        for extra in case.extras:
            report.extra_graphs[extra] = report.extra_graphs.get(extra, 0) + 1
        try:
            model = _model_bytes(case.graph)
        except Exception as e:  # noqa: BLE001  # the ONNX exporter failing on a valid graph is a finding
            verdict = Verdict("crash", "export", describe_error(e))
        else:
            verdict = worker.check(model, pack_inputs(case.feeds), case.planner, case.threads, case.codegen,
                                   case.quantized)
        if verdict.status == "unsupported":
            report.unsupported += 1
            reason = verdict.detail.split(":")[0][:120]
            report.unsupported_reasons[reason] = report.unsupported_reasons.get(reason, 0) + 1
        if verdict.failed:
            failing.append((case, verdict))
            raise _Failed(verdict.line())

    run = hypothesis_seed(round_seed)(settings(
        max_examples=max(count - report.graphs, 1), database=None, deadline=None, derandomize=False,
        phases=(Phase.generate,), verbosity=Verbosity.quiet, print_blob=False, report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck))(given(fuzz_cases(ops, max_nodes))(check)))
    try:
        run()
    except (_Failed, _OutOfTime):
        pass
    except Unsatisfiable:
        raise InputError(_undrawable(ops)) from None
    if not failing:
        return
    case, verdict = failing[0]
    say(f"found a {verdict.status} in graph {report.graphs}: {verdict.line()[:300]}")
    if verdict.status == "mismatch":
        report.mismatches += 1
    else:
        report.crashes += 1
    found = case
    if shrink:
        say(f"shrinking it ({len(case.graph.nodes)} nodes) ...")
        graph, feeds, verdict = minimize(case.graph, case.feeds, verdict, lambda g, f: worker.check(
            _model_bytes(g), pack_inputs(f), case.planner, case.threads, case.codegen, case.quantized))
        main = graph.outputs[0].dtype.name if graph.outputs else case.dtype  # the shrunk graph's, as fuzz_cases
        kept = {v.name for v in graph.outputs}
        case = FuzzCase(graph, feeds, main, case.inputs, case.planner, case.threads, codegen=case.codegen,
                        quantized={n: k for n, k in case.quantized.items() if n in kept})
    path = None
    if out is not None:
        path = write_reproducer(case, verdict, Path(out) / f"{verdict.status}-{report.mismatches + report.crashes}")
        if found is not case:
            write_reproducer(found, failing[0][1], path / "original")
    report.findings.append(Finding(verdict, case.describe(), path))
    say(f"shrunk to {case.describe()}: {verdict.line()[:300]}" + (f"; written to {path}" if path else ""))


def replay(folder: str | Path, timeout: float = CASE_TIMEOUT_S) -> Verdict:
    """The verdict on a reproducer folder written by ``fuzz`` (``model.onnx``, ``inputs.npz``, ``case.json``)."""
    d = Path(folder)
    if d.is_file():
        d = d.parent
    try:
        model = (d / "model.onnx").read_bytes()
        npz = (d / "inputs.npz").read_bytes()
        info = json.loads((d / "case.json").read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"'{folder}' is not a fuzz reproducer folder (model.onnx, inputs.npz, case.json): "
                         f"{e.strerror if isinstance(e, OSError) else e}") from None
    codegen = str(info.get("codegen", "default"))
    if codegen not in CODEGEN_PROFILES:
        raise InputError(f"'{folder}': codegen profile '{codegen}' in case.json is none of "
                         f"{', '.join(CODEGEN_PROFILES)}")
    cache = tempfile.mkdtemp(prefix="opfuse-fuzz-cache-")
    try:
        with Worker(cache, timeout) as worker:
            return worker.check(model, npz, info.get("planner", "auto"), int(info.get("threads", 1)), codegen,
                                quantized_tolerance(info.get("quantized", ())))
    finally:
        shutil.rmtree(cache, ignore_errors=True)


__all__ = ["fuzz", "replay", "write_reproducer", "FuzzReport", "Finding", "Verdict", "FuzzCase", "fuzz_cases"]
