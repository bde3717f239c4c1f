"""Run mutmut's mutants against plain test functions, without a pytest session per mutant (triage on a busy
machine).

``tools/mutate_narrow.py`` forks one pytest session per mutant, as mutmut does; on a loaded machine the session's
start and collection cost far more than the few fast tests a mutant needs (at load 10-14 with the job yielding the
cores, over 60 s of wall time a mutant). This tool imports the named test files once, records which test functions
reach which mutated function (one unmutated run, as ``--per-test`` does), then forks per mutant and calls those test
functions directly (the cheapest first, by CPU time in the unmutated run, stopping at the first that raises, like
``-x``; ``--max-tests N`` keeps the N cheapest, for triage). Only plain test functions are run:
``pytest.mark.parametrize`` is expanded (``pytest.param`` marks read); fixtures without parameters defined in the
test file or a ``conftest.py`` above it are made as pytest would (function scope per test, wider scopes once per
mutant process, generator fixtures included), with ``tmp_path``, ``tmp_path_factory``, ``monkeypatch`` and
``worker_id`` built in; a test needing another fixture (``request``, ``capsys``, a parametrized fixture) is skipped,
listed at the start. Tests marked ``--exclude-mark`` (``slow`` by default), ``skip``, ``xfail`` or a true ``skipif``
are not run; ``pytest.skip()`` inside a test is a pass, as in pytest. ``--deselect TEXT`` skips the tests whose id
holds TEXT, ``--select TEXT`` keeps only those. A mutant is ``killed`` when a test raises (an assertion or any
error), ``timeout`` past ``--cpu-limit`` CPU seconds (or ``--timeout`` wall seconds), ``not reached`` when no test
calls its function (or only while its module is imported, before the forks: run those with
``tools/mutate_narrow.py --fresh``), else ``survived``; a survivor here should still be run with
``tools/mutate_narrow.py`` against a wider selection before it is called equivalent.

Generated C is compiled through opfuse's own build cache, which is content-addressed (the key hashes the C text,
the compiler's identity and the flags: ``runtime/toolchain.build_key``). Every process of a run, and every run,
shares one cache (``--build-cache``, default ``.opfuse-cache/mutation`` in the repository; the ``cache_dir``
fixture and ``$OPFUSE_CACHE_DIR`` point there), so the unmutated tests compile their C once, and a mutant
compiles only the programs whose C it changed. Each process records the build keys its tests asked for: a
survivor whose every key is one the unmutated tests built is printed ``survived (C unchanged)`` (the mutation
did not change any C these tests compiled; often equivalent for them: a branch or tuning constant these shapes
do not reach), else ``survived (C changed)``. The unmutated run is made twice, and the second must compile
nothing (the C of these tests is deterministic and the cache works), or the run stops. C compiled outside the
cache (a test calling the compiler itself) is not seen.

``mutants/`` must exist (``tools/mutate_narrow.py --generate FILE...``); mutmut must be importable (its
trampolines are in the mutated code). The named test files are copied into ``mutants/`` first.

    python tools/mutate_quick.py --tests tests/fusion/test_partition_details.py -- 'opfuse.rules.partition.*'
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib.util
import itertools
import inspect
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutate_narrow import function_of, mutant_names, status_of  # noqa: E402


BUILTIN = ("tmp_path", "tmp_path_factory", "monkeypatch", "worker_id", "cache_dir")
SKIP_MARKS = ("skip", "xfail")


@dataclass(frozen=True)
class Fixture:
    key: str  # where it is defined and its name: one value per process for the wider scopes
    func: Callable[..., Any] | None  # None: built in
    scope: str
    args: tuple[str, ...]
    autouse: bool = False


@dataclass(frozen=True)
class Test:
    id: str
    fn: Callable[..., Any]
    kwargs: dict
    fixtures: dict[str, Fixture]  # every fixture it needs, its autouse ones included, by name
    autouse: tuple[str, ...]


def _marks_skip(marks, exclude: tuple[str, ...]) -> bool:
    """Whether these marks keep a test from running (an excluded mark, skip, xfail, a true skipif)."""
    for m in marks:
        if m.name in exclude or m.name in SKIP_MARKS:
            return True
        cond = m.args[0] if m.args else m.kwargs.get("condition", False)
        if m.name == "skipif" and not isinstance(cond, str) and bool(cond):
            return True
    return False


def _expand(fn) -> list[tuple[str, dict, list]]:
    """(id, kwargs, marks) for each call of a test function (its parametrize marks expanded)."""
    calls: list[tuple[str, dict, list]] = [("", {}, [])]
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        values = []
        for v in mark.args[1]:
            marks = list(getattr(v, "marks", ()))
            v = v.values if hasattr(v, "values") and hasattr(v, "marks") else (v if len(names) > 1 else (v,))
            values.append((v, marks))
        calls = [(f"{cid}[{i}]" if not cid else f"{cid[:-1]}-{i}]", {**kw, **dict(zip(names, v, strict=True))},
                  ms + marks)
                 for (cid, kw, ms), (i, (v, marks)) in itertools.product(calls, enumerate(values))]
    return calls


def _fixture_defs(mod) -> dict[str, Fixture | None]:
    """A module's fixtures by name; None for one this tool cannot make (parametrized)."""
    out: dict[str, Fixture | None] = {}
    for attr, obj in vars(mod).items():
        marker = getattr(obj, "_fixture_function_marker", None)
        if marker is None:
            continue
        name = marker.name or attr
        if marker.params:
            out[name] = None
            continue
        inner = obj._get_wrapped_function()
        scope = marker.scope if isinstance(marker.scope, str) else "function"
        out[name] = Fixture(f"{getattr(mod, '__file__', attr)}::{name}", inner, scope,
                            tuple(inspect.signature(inner).parameters), bool(marker.autouse))
    return out


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _conftests(p: Path, top: Path, loaded: dict[Path, dict]) -> list[dict[str, Fixture | None]]:
    """The fixtures of the conftest.py files from ``p``'s folder up to ``top``, nearest first."""
    layers = []
    d = p.parent
    while True:
        c = d / "conftest.py"
        if c.is_file():
            if c not in loaded:
                loaded[c] = _fixture_defs(_import(c, f"conftest_{len(loaded)}"))
            layers.append(loaded[c])
        if d == top or d == d.parent:
            return layers
        d = d.parent


def _resolve(names, layers) -> dict[str, Fixture] | None:
    """Every fixture ``names`` need, by name (their own arguments' too); None when one cannot be made."""
    out: dict[str, Fixture] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        if name in BUILTIN:
            out[name] = Fixture(name, None, "session" if name in ("tmp_path_factory", "worker_id", "cache_dir")
                                else "function", ())
            continue
        found = next((layer[name] for layer in layers if name in layer), None)
        if found is None:
            return None
        out[name] = found
        todo.extend(found.args)
    return out


def collect(paths: list[str], exclude: tuple[str, ...] = ("slow",)) -> tuple[list[Test], list[str]]:
    """Import each test file; its test functions as ``Test``s, and the ids skipped (with why)."""
    tests: list[Test] = []
    skipped: list[str] = []
    loaded: dict[Path, dict] = {}
    for path in paths:
        p = Path(path).resolve()
        for d in (p.parent, p.parent.parent):
            if str(d) not in sys.path:
                sys.path.insert(1, str(d))
        mod = _import(p, p.stem)
        top = next((d for d in p.parents if d.name == "tests"), p.parent)
        layers = [_fixture_defs(mod), *_conftests(p, top, loaded)]
        autouse = sorted({n for layer in layers for n, f in layer.items() if f is not None and f.autouse})
        module_marks = getattr(mod, "pytestmark", [])
        module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
        for name, fn in vars(mod).items():
            if not name.startswith("test_") or not callable(fn) or getattr(fn, "__module__", None) != p.stem:
                continue
            for cid, kwargs, marks in _expand(fn):
                tid = f"{path}::{name}{cid}"
                if _marks_skip([*module_marks, *getattr(fn, "pytestmark", []), *marks], exclude):
                    skipped.append(f"{tid} (marked)")
                    continue
                needed = [*(set(inspect.signature(fn).parameters) - set(kwargs)), *autouse]
                fixtures = _resolve(needed, layers)
                if fixtures is None:
                    skipped.append(f"{tid} (needs a fixture)")
                else:
                    tests.append(Test(tid, fn, kwargs, fixtures, tuple(autouse)))
    return tests, skipped


class _TmpFactory:
    """``tmp_path_factory``'s two methods, under one folder per process."""

    def __init__(self, base: Path):
        self._base = base
        self._n = itertools.count()

    def getbasetemp(self) -> Path:
        return self._base

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        p = self._base / (f"{basename}{next(self._n)}" if numbered else basename)
        p.mkdir(parents=True)
        return p


class _Session:
    """One process's fixture values (the wider scopes) and its temporary folder."""

    def __init__(self, cache: Path):
        self.cache = cache
        self.base = Path(tempfile.mkdtemp(prefix="mutate-quick-"))
        self.factory = _TmpFactory(self.base)
        self.made: dict[str, Any] = {}

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def _builtin(self, name: str, finalizers: list) -> Any:
        if name == "tmp_path":
            return self.factory.mktemp("tmp")
        if name == "monkeypatch":
            import pytest
            mp = pytest.MonkeyPatch()
            finalizers.append(mp.undo)
            return mp
        return {"tmp_path_factory": self.factory, "worker_id": "master", "cache_dir": self.cache}[name]

    def value(self, name: str, test: Test, here: dict, finalizers: list) -> Any:
        if name in here:
            return here[name]
        fx = test.fixtures[name]
        if fx.scope != "function" and fx.key in self.made:
            v = self.made[fx.key]
        elif fx.func is None:
            v = self._builtin(name, finalizers)
        else:
            r = fx.func(**{a: self.value(a, test, here, finalizers) for a in fx.args})
            if inspect.isgenerator(r):
                v = next(r)
                if fx.scope == "function":
                    finalizers.append(lambda r=r: next(r, None))
            else:
                v = r
        if fx.scope != "function":
            self.made[fx.key] = v
        here[name] = v
        return v

    def call(self, test: Test) -> None:
        """Run one test as pytest would (its fixtures first, function-scoped ones torn down after);
        ``pytest.skip()`` inside it is a pass."""
        import pytest
        here: dict[str, Any] = {}
        finalizers: list = []
        try:
            for name in test.autouse:
                self.value(name, test, here, finalizers)
            args = {k: self.value(k, test, here, finalizers) for k in inspect.signature(test.fn).parameters
                    if k not in test.kwargs}
            test.fn(**test.kwargs, **args)
        except pytest.skip.Exception:
            pass
        finally:
            for f in reversed(finalizers):
                f()


class BuildLog:
    """The build keys a process asks opfuse's build cache for, and how many of them it compiled."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.compiled = 0
        self.failure: str | None = None  # the test that failed (killing the mutant) and its exception, one line

    def install(self) -> None:
        from opfuse.runtime import toolchain
        build_key, build_entry = toolchain.build_key, toolchain._build_entry

        def key(*a, **kw):
            k = build_key(*a, **kw)
            self.keys.append(k)
            return k

        def entry(*a, **kw):
            self.compiled += 1
            return build_entry(*a, **kw)

        toolchain.build_key = key  # type: ignore[assignment]
        toolchain._build_entry = entry  # type: ignore[assignment]

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({"keys": sorted(set(self.keys)), "compiled": self.compiled,
                                    "failure": self.failure}))


def _run_tests(tests: list[Test], cache: Path, log_to: Path | None = None) -> int:
    session = _Session(cache)
    log = BuildLog()
    log.install()
    code = 0
    try:
        for t in tests:
            try:
                session.call(t)
            except BaseException as e:
                code = 1
                # which test killed the mutant, and how: a kill that is not a real failure (an import error, a
                # fixture's) shows in the log
                last = (str(e).strip().splitlines() or [""])[0][:160]
                log.failure = f"{t.id}: {type(e).__name__}{': ' + last if last else ''}"
                break
    finally:
        if log_to is not None:
            log.dump(log_to)
        session.close()
    return code


def _fork(mutant: str, tests: list[Test], cache: Path, cpu_limit: int = 0, log_to: Path | None = None) -> int:
    pid = os.fork()
    if pid == 0:
        if cpu_limit:  # CPU seconds, not wall time: a starved job is not cut short, an endless loop is
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 1))
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.environ["MUTANT_UNDER_TEST"] = mutant
        code = 1
        try:
            code = _run_tests(tests, cache, log_to)
        finally:
            os._exit(code)
    return pid


def reach(tests: list[Test], cache: Path, fresh: bool = False
          ) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, float], int]:
    """Which test ids reach which mutated function, the build keys and CPU seconds of each test, and how many
    programs were compiled (one unmutated run in a fork). ``fresh``: every fixture of a wider scope is made
    again for each test, so that the work a module fixture does once (a model built when it is made, or on
    its first use through a getter) counts for every test that uses it, not only the first; else a mutant of
    a function only that work reaches runs against the first test alone."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        from mutmut.mutation import trampoline
        os.environ["MUTANT_UNDER_TEST"] = "stats"
        current = [""]
        hits: dict[str, set[str]] = {}
        trampoline.record_trampoline_hit = lambda name, caller=None: hits.setdefault(name, set()).add(current[0])
        session = _Session(cache)
        log = BuildLog()
        log.install()
        keys: dict[str, list[str]] = {}
        cost: dict[str, float] = {}
        for t in tests:
            current[0] = t.id
            if fresh:
                session.made.clear()
            before, t0 = len(log.keys), time.process_time()
            try:
                session.call(t)
            except BaseException:
                pass
            keys[t.id] = sorted(set(log.keys[before:]))
            cost[t.id] = time.process_time() - t0
        session.close()
        with os.fdopen(w, "w") as f:
            json.dump({"hits": {k: sorted(v) for k, v in hits.items()}, "keys": keys, "cost": cost,
                       "compiled": log.compiled}, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    return data.get("hits", {}), data.get("keys", {}), data.get("cost", {}), data.get("compiled", -1)


def classify(status: str, log: dict | None, baseline: set[str]) -> str:
    """A survivor's kind: whether every program its tests built is one the unmutated tests built (``baseline``:
    the programs the same tests built unmutated); plain ``survived`` where neither built any."""
    if status != "survived" or log is None or not (baseline or log["keys"]):
        return status
    return "survived (C unchanged)" if set(log["keys"]) <= baseline else "survived (C changed)"


def preimport(root: Path) -> None:
    """Import the mutated modules here, once, so that no forked process compiles them: a mutated file holds
    every mutant's copy of its functions (gemm.py's 930 lines become 13 MB, half a minute of CPU to compile),
    and a module a test imports lazily would otherwise be compiled again in every fork. Compiled code is also
    cached outside the tree (``sys.pycache_prefix``) even where ``PYTHONDONTWRITEBYTECODE`` is set."""
    import importlib
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(Path(tempfile.gettempdir()) / "mutate-quick-pycache")
    for meta in sorted((root / "src").rglob("*.py.meta")):
        rel = meta.relative_to(root / "src")
        importlib.import_module(".".join((*rel.parts[:-1], rel.name.removesuffix(".py.meta"))))


def in_sample(name: str, fraction: float, seed: str) -> bool:
    """Whether mutant ``name`` is in the ``fraction`` sample drawn with ``seed``: a hash of the two, so the
    draw does not depend on which other mutants exist or on their order, and every function keeps about
    ``fraction`` of its mutants."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2.0**64


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tests", action="append", required=True, help="a test file (repeatable)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds (wall) per mutant")
    ap.add_argument("--cpu-limit", type=int, default=30, help="CPU seconds per mutant (then: timeout)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once")
    ap.add_argument("--deselect", action="append", default=[], help="skip the tests whose id has this (repeatable)")
    ap.add_argument("--select", action="append", default=[], help="keep only the tests whose id has one of these")
    ap.add_argument("--exclude-mark", action="append", default=None, help="skip tests with this mark (default: slow)")
    ap.add_argument("--build-cache", type=Path, default=Path(".opfuse-cache/mutation"),
                    help="the build cache shared by every mutant (content-addressed: unchanged C is not compiled)")
    ap.add_argument("--max-tests", type=int, default=0,
                    help="run each mutant against at most the N cheapest tests reaching it (triage; 0: all)")
    ap.add_argument("--resume", type=Path, help="skip the mutants this earlier output (``name status`` lines) has")
    ap.add_argument("--sample", type=float, default=1.0,
                    help="run only this fraction of the matching mutants, drawn by a hash of each name (0 < F <= 1)")
    ap.add_argument("--sample-seed", default="0", help="the draw's seed: the same seed and names, the same sample")
    ap.add_argument("--fresh-fixtures", action="store_true",
                    help="in the run that finds which tests reach which function, make every module- or "
                         "session-scoped fixture again per test (a fixture building a model once would "
                         "otherwise count for the first test using it only)")
    ap.add_argument("patterns", nargs="+", help="mutant names or globs (fnmatch)")
    args = ap.parse_args(argv)
    if not 0.0 < args.sample <= 1.0:
        print(f"mutate_quick: --sample must be in (0, 1], not {args.sample}")
        return 2
    root = Path("mutants").resolve()
    if not (root / "src").is_dir():
        print("mutate_quick: no mutants/ here: run `tools/mutate_narrow.py --generate FILE...` first")
        return 2
    cache = args.build_cache.resolve()
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ["OPFUSE_CACHE_DIR"] = str(cache)
    for t in args.tests:
        (root / t).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(t, root / t)
    every = mutant_names(root)  # in the order of the patterns (the first to run first)
    names = list(dict.fromkeys(n for p in args.patterns for n in every if fnmatch.fnmatch(n, p)))
    if args.sample < 1.0:
        names = [n for n in names if in_sample(n, args.sample, args.sample_seed)]
    if args.resume:
        done = {line.split()[0] for line in args.resume.read_text().splitlines() if line.startswith("opfuse.")}
        names = [n for n in names if n not in done]
    os.chdir(root)
    sys.path[:] = [str(root / "src")] + [p for p in sys.path if not p.rstrip("/").endswith("/src")]
    preimport(root)
    tests, skipped = collect(args.tests, tuple(args.exclude_mark if args.exclude_mark is not None else ["slow"]))
    tests = [t for t in tests if not any(d in t.id for d in args.deselect)
             and (not args.select or any(k in t.id for k in args.select))]
    for tid in skipped:
        print(f"# skipped: {tid}")
    from opfuse.runtime.toolchain import Toolchain
    for native in (True, False):  # the compiler probes (lru_cache), once here rather than in every fork
        Toolchain.detect(native=native)
    scratch = Path(tempfile.mkdtemp(prefix="mutate-quick-logs-"))
    try:
        return _run(args, names, tests, cache, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(args, names: list[str], tests: list[Test], cache: Path, scratch: Path) -> int:
    t0 = time.monotonic()
    for which, want in (("", 0), ("fail", 1)):
        pid = _fork(which, tests, cache, log_to=scratch / f"sanity{which}.json")
        _, status = os.waitpid(pid, 0)
        if (os.waitstatus_to_exitcode(status) != 0) != bool(want):
            print(f"mutate_quick: the tests {'fail unmutated' if not which else 'miss a forced failure'}")
            return 2
    first = json.loads((scratch / "sanity.json").read_text())
    hits, keys, cost, compiled = reach(tests, cache, fresh=args.fresh_fixtures)
    baseline = {k for ks in keys.values() for k in ks}
    print(f"# {len(tests)} tests, {len(baseline)} programs built through the cache; the first unmutated run "
          f"compiled {first['compiled']}, the second {compiled} ({time.monotonic() - t0:.0f} s)", flush=True)
    if compiled != 0:
        print("mutate_quick: the unmutated tests compiled C again on a warm cache (C not deterministic, or the "
              "cache not used): every mutant would compile")
        return 2
    jobs = []
    results: dict[str, str] = {}
    for n in names:
        ids = set(hits.get(function_of(n), ()))
        if not ids:
            results[n] = "not reached"
            print(n, "not reached", flush=True)
        else:
            mine = sorted((t for t in tests if t.id in ids), key=lambda t: cost.get(t.id, 0.0))  # cheapest first
            jobs.append((n, mine[:args.max_tests] if args.max_tests else mine))
    built = {n: {k for t in ts for k in keys.get(t.id, ())} for n, ts in jobs}  # per mutant: its tests' programs
    running: dict[int, tuple[str, float, Path]] = {}
    t1 = time.monotonic()
    while jobs or running:
        while jobs and len(running) < args.jobs:
            n, ts = jobs.pop(0)
            log_to = scratch / f"{n}.json"
            running[_fork(n, ts, cache, args.cpu_limit, log_to)] = (n, time.monotonic(), log_to)
        time.sleep(0.02)
        for pid, (n, start, log_to) in list(running.items()):
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
            log = json.loads(log_to.read_text()) if log_to.is_file() else None
            results[n] = classify(results[n], log, built[n])
            compiled_note = f"{log['compiled']} compiled" if log is not None else "?"
            by = f", by {log['failure']}" if log is not None and log.get("failure") and results[n] == "killed" else ""
            print(n, results[n], f"# {time.monotonic() - start:.1f} s, {compiled_note}{by}", flush=True)
    counts = {s: sum(1 for v in results.values() if v == s) for s in sorted(set(results.values()))}
    print("mutate_quick:", len(results), "mutants", counts, f"in {time.monotonic() - t1:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
