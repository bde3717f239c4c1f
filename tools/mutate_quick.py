"""Run mutmut's mutants against plain test functions, without a pytest session per mutant (triage on a busy
machine).

``tools/mutate_narrow.py`` forks one pytest session per mutant, as mutmut does; on a loaded machine the session's
start and collection cost far more than the few fast tests a mutant needs (at load 10-14 with the job yielding
the cores, over 60 s of wall time a mutant). This tool imports the named test files once, records which test
functions reach which mutated function (one unmutated run, as ``--per-test`` does), then forks per mutant and
calls those test functions directly (in file order, stopping at the first that raises, like ``-x``). Only plain
test functions are run: ``pytest.mark.parametrize`` is expanded, a test that needs a fixture is skipped (listed
at the start) unless it is one of the file's own fixtures without parameters (made once per mutant, module
scope), ``--deselect TEXT`` skips the tests whose id holds TEXT; marks (``slow``) are not read. A mutant
is ``killed`` when a test raises (an assertion or any error), ``timeout`` past ``--cpu-limit`` CPU seconds (or
``--timeout`` wall seconds), ``not reached`` when no test calls its function, else ``survived``; a survivor here
should still be run with ``tools/mutate_narrow.py`` against a wider selection before it is called equivalent.

``mutants/`` must exist (``tools/mutate_narrow.py --generate FILE...``); mutmut must be importable (its
trampolines are in the mutated code). The named test files are copied into ``mutants/`` first.

    python tools/mutate_quick.py --tests tests/fusion/test_partition_details.py -- 'opfuse.rules.partition.*'
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import itertools
import json
import os
import resource
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutate_narrow import function_of, mutant_names, status_of  # noqa: E402


def _expand(fn) -> list[tuple[str, dict]]:
    """(id, kwargs) for each call of a test function (its parametrize marks expanded)."""
    calls: list[tuple[str, dict]] = [("", {})]
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        values = [v if len(names) > 1 else (v,) for v in mark.args[1]]
        calls = [(f"{cid}[{i}]" if not cid else f"{cid[:-1]}-{i}]", {**kw, **dict(zip(names, v, strict=True))})
                 for (cid, kw), (i, v) in itertools.product(calls, enumerate(values))]
    return calls


def collect(paths: list[str]) -> tuple[list[tuple[str, object, dict, dict]], list[str]]:
    """Import each test file; its test functions as (id, function, kwargs, fixtures used), and the ids skipped."""
    import inspect
    tests, skipped = [], []
    for path in paths:
        p = Path(path).resolve()
        for d in (p.parent, p.parent.parent):
            if str(d) not in sys.path:
                sys.path.insert(1, str(d))
        spec = importlib.util.spec_from_file_location(p.stem, p)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[p.stem] = mod
        spec.loader.exec_module(mod)
        fixtures = {}  # the module's own fixtures without parameters, by name
        for name, obj in vars(mod).items():
            marker = getattr(obj, "_fixture_function_marker", None)
            if marker is not None and not marker.params:
                inner = obj._get_wrapped_function()
                if not inspect.signature(inner).parameters:
                    fixtures[name] = inner
        for name, fn in vars(mod).items():
            if not name.startswith("test_") or not callable(fn) or getattr(fn, "__module__", None) != p.stem:
                continue
            for cid, kwargs in _expand(fn):
                params = set(inspect.signature(fn).parameters)
                tid = f"{path}::{name}{cid}"
                if params - set(kwargs) - set(fixtures):
                    skipped.append(tid)
                else:
                    uses = {k: fixtures[k] for k in params - set(kwargs)}
                    tests.append((tid, fn, kwargs, uses))
    return tests, skipped


def _call(fn, kwargs, uses, made: dict):
    """Call a test, making the module fixtures it names once per process (module scope)."""
    for k, f in uses.items():
        if k not in made:
            made[k] = f()
    return fn(**kwargs, **{k: made[k] for k in uses})


def _run_tests(tests) -> int:
    made: dict = {}
    for _, fn, kwargs, uses in tests:
        try:
            _call(fn, kwargs, uses, made)
        except BaseException:
            return 1
    return 0


def _fork(mutant: str, tests, cpu_limit: int = 0) -> int:
    pid = os.fork()
    if pid == 0:
        if cpu_limit:  # CPU seconds, not wall time: a starved job is not cut short, an endless loop is
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 1))
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.environ["MUTANT_UNDER_TEST"] = mutant
        os._exit(_run_tests(tests))
    return pid


def reach(tests) -> dict[str, list[str]]:
    """Which test ids reach which mutated function (one unmutated run in a fork)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        from mutmut.mutation import trampoline
        os.environ["MUTANT_UNDER_TEST"] = "stats"
        current = [""]
        hits: dict[str, set[str]] = {}
        trampoline.record_trampoline_hit = lambda name, caller=None: hits.setdefault(name, set()).add(current[0])
        made: dict = {}
        for tid, fn, kwargs, uses in tests:
            current[0] = tid
            try:
                _call(fn, kwargs, uses, made)
            except BaseException:
                pass
        with os.fdopen(w, "w") as f:
            json.dump({k: sorted(v) for k, v in hits.items()}, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data or "{}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tests", action="append", required=True, help="a test file (repeatable)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds (wall) per mutant")
    ap.add_argument("--cpu-limit", type=int, default=30, help="CPU seconds per mutant (then: timeout)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once")
    ap.add_argument("--deselect", action="append", default=[], help="skip the tests whose id has this (repeatable)")
    ap.add_argument("--resume", type=Path, help="skip the mutants this earlier output (``name status`` lines) has")
    ap.add_argument("patterns", nargs="+", help="mutant names or globs (fnmatch)")
    args = ap.parse_args(argv)
    root = Path("mutants").resolve()
    if not (root / "src").is_dir():
        print("mutate_quick: no mutants/ here: run `tools/mutate_narrow.py --generate FILE...` first")
        return 2
    for t in args.tests:
        (root / t).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(t, root / t)
    every = mutant_names(root)  # in the order of the patterns (the first to run first)
    names = list(dict.fromkeys(n for p in args.patterns for n in every if fnmatch.fnmatch(n, p)))
    if args.resume:
        done = {line.split()[0] for line in args.resume.read_text().splitlines() if line.startswith("opfuse.")}
        names = [n for n in names if n not in done]
    os.chdir(root)
    sys.path[:] = [str(root / "src")] + [p for p in sys.path if not p.rstrip("/").endswith("/src")]
    tests, skipped = collect(args.tests)
    tests = [t for t in tests if not any(d in t[0] for d in args.deselect)]
    for tid in skipped:
        print(f"# skipped (needs a fixture): {tid}")
    for which, want in (("", 0), ("fail", 1)):
        pid = _fork(which, tests)
        _, status = os.waitpid(pid, 0)
        if (os.waitstatus_to_exitcode(status) != 0) != bool(want):
            print(f"mutate_quick: the tests {'fail unmutated' if not which else 'miss a forced failure'}")
            return 2
    hits = reach(tests)
    order = {tid: i for i, (tid, *_) in enumerate(tests)}
    jobs = []
    results: dict[str, str] = {}
    for n in names:
        ids = set(hits.get(function_of(n), ()))
        if not ids:
            results[n] = "not reached"
            print(n, "not reached", flush=True)
        else:
            jobs.append((n, sorted((t for t in tests if t[0] in ids), key=lambda t: order[t[0]])))
    running: dict[int, tuple[str, float]] = {}
    while jobs or running:
        while jobs and len(running) < args.jobs:
            n, ts = jobs.pop(0)
            running[_fork(n, ts, args.cpu_limit)] = (n, time.monotonic())
        time.sleep(0.02)
        for pid, (n, start) in list(running.items()):
            finished, status = os.waitpid(pid, os.WNOHANG)
            if finished:
                cpu_out = os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL)
                results[n] = "timeout" if cpu_out else status_of(status)
            elif time.monotonic() - start > args.timeout:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                results[n] = "timeout"
            else:
                continue
            del running[pid]
            print(n, results[n], flush=True)
    counts = {s: sum(1 for v in results.values() if v == s) for s in sorted(set(results.values()))}
    print("mutate_quick:", len(results), "mutants", counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
