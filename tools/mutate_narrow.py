"""Run mutmut's mutants against a narrower test selection than ``[tool.mutmut]`` (one module's tests).

``make mutate`` (mutmut) runs each mutant against every configured test that reaches the mutated
function; for code every compile goes through (the code generator, the memory planner) that is most
of tests/codegen and tests/e2e per surviving mutant, hours on 2 cores. This runs chosen mutants
against chosen tests, the way mutmut does (the mutated tree in ``mutants/``, one forked pytest per
mutant, ``MUTANT_UNDER_TEST`` naming it), so a module can be triaged against the tests that are about
it. A mutant that survives here may still die in the full selection: rerun the survivors with
``mutmut run NAMES`` before calling one equivalent.

``mutants/`` must exist: ``mutmut run`` makes it (for every configured file, then runs them all), or
``--generate FILE...`` makes it with mutmut's own generator for the named source files only (seconds),
the other files copied unmutated:

    python tools/mutate_narrow.py --generate src/opfuse/codegen/checks.py
    python tools/mutate_narrow.py --tests tests/codegen/test_checks.py -- 'opfuse.codegen.checks.*'

``--per-test`` first runs the selection once recording which tests reach which function (mutmut's
"stats" mode), then runs each mutant only against the tests that reach its function (cheapest
first, ``-x``), as mutmut does: a mutant whose function no test reaches is ``not reached`` without a
run. ``--recheck`` reruns every survivor of the short run against the whole selection (a test that only
reads a cached result of the function is not recorded as reaching it).
``--jobs N`` runs N mutants at once.

A mutant of code that runs while its module is imported (a module constant built by a function: vecmath.py's
helper texts) cannot die in a fork: the tests were collected, so the module imported unmutated, before the fork.
Without ``--fresh`` such a mutant shows as ``survived`` (``not reached`` with ``--per-test``) without having run.
``--fresh`` runs every mutant in a new interpreter instead (``python -m pytest`` with ``MUTANT_UNDER_TEST`` set, the
mutated tree first on ``PYTHONPATH``: its imports and collection per mutant, slower); with ``--per-test`` only the
mutants no test reaches run that way, against the whole selection.

Prints ``name status`` per mutant (killed / survived / timeout / not reached) and a count; ``--json FILE``
saves them.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

_OUTSIDE = "<outside a test>"  # a function reached while collecting (module level): every test may need it


def mutant_names(root: Path) -> list[str]:
    """Every mutant mutmut generated, by name (from its ``.meta`` files)."""
    names = []
    for meta in sorted((root / "src").rglob("*.py.meta")):
        names.extend(json.loads(meta.read_text())["exit_code_by_key"])
    return sorted(names)


def function_of(mutant: str) -> str:
    """The mangled name of the function a mutant belongs to (``mod.x_f__mutmut_3`` -> ``mod.x_f``)."""
    return mutant.partition("__mutmut_")[0]


def generate(files: list[str]) -> int:
    """Write ``mutants/`` with mutmut's generator: the named files mutated, every other file copied."""
    from mutmut.__main__ import create_file_mutants
    from mutmut.configuration import config
    from mutmut.mutation.trampoline import set_mutant_under_test
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir

    config().only_mutate[:] = files
    set_mutant_under_test("mutant_generation")
    Path("mutants").mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    for f in files:
        result = create_file_mutants(Path(f))
        if result.error:
            raise result.error
    return 0


def _pytest_child(tests: list[str], extra: list[str]) -> int:
    import pytest
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    return int(pytest.main(["--rootdir=.", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *extra, *tests]))


def start_fresh(name: str, tests: list[str]) -> int:
    """A new interpreter running ``tests`` with mutant ``name``: its modules imported mutated (see ``--fresh``)."""
    env = {**os.environ, "MUTANT_UNDER_TEST": name,
           "PYTHONPATH": os.pathsep.join([str(Path("src").resolve()), os.environ.get("PYTHONPATH", "")]).rstrip(
               os.pathsep)}
    argv = [sys.executable, "-m", "pytest", "--rootdir=.", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-x",
            *tests]
    quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
    return os.posix_spawn(sys.executable, argv, env, file_actions=quiet)


def start_one(name: str, tests: list[str], fresh: bool = False) -> int:
    if fresh:
        return start_fresh(name, tests)
    pid = os.fork()
    if pid == 0:  # child: the mutant is chosen per call by the trampolines
        os.environ["MUTANT_UNDER_TEST"] = name
        try:
            code = _pytest_child(tests, ["-x"])
        except BaseException:
            code = 3
        os._exit(code)
    return pid


def status_of(exit_status: int) -> str:
    code = os.waitstatus_to_exitcode(exit_status)
    return "survived" if code == 0 else ("killed" if code in (1, 2, 3) or code < 0 else f"error {code}")


def run_many(jobs: list[tuple[str, list[str]]], timeout: float, width: int,
             fresh: bool | frozenset[str] = False) -> dict[str, str]:
    """Run each (mutant, tests) in its own fork, or a new interpreter where ``fresh`` (all, or those names),
    ``width`` at a time; name -> status."""
    results: dict[str, str] = {}
    todo = list(jobs)
    running: dict[int, tuple[str, float]] = {}
    while todo or running:
        while todo and len(running) < width:
            name, tests = todo.pop(0)
            own_interpreter = fresh if isinstance(fresh, bool) else name in fresh
            running[start_one(name, tests, own_interpreter)] = (name, time.monotonic())
        time.sleep(0.05)
        for pid, (name, start) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                results[name] = status_of(status)
            elif time.monotonic() - start > timeout:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                results[name] = "timeout"
            else:
                continue
            del running[pid]
            if name not in ("", "fail"):
                print(name, results[name], flush=True)
    return results


def tests_by_function(tests: list[str]) -> tuple[int, dict[str, list[str]]]:
    """Run ``tests`` once unmutated in a fork, recording per function the test ids that reach it
    (cheapest first, by the CPU time each took)."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    pid = os.fork()
    if pid == 0:
        import pytest
        from mutmut.mutation import trampoline

        os.environ["MUTANT_UNDER_TEST"] = "stats"
        current: list[str] = [_OUTSIDE]
        seconds: dict[str, float] = {_OUTSIDE: -1.0}
        hits: dict[str, set[str]] = {}

        def record(name: str, caller: str | None = None) -> None:
            hits.setdefault(name, set()).add(current[0])

        class Recorder:
            @pytest.hookimpl(hookwrapper=True)
            def pytest_runtest_protocol(self, item, nextitem):  # type: ignore[no-untyped-def]
                current[0] = item.nodeid
                start = time.process_time()
                yield
                seconds[item.nodeid] = time.process_time() - start
                current[0] = _OUTSIDE

        trampoline.record_trampoline_hit = record  # type: ignore[assignment]
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        code = int(pytest.main(["--rootdir=.", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests],
                               plugins=[Recorder()]))
        # cheapest first: with -x a killed mutant stops at its first failing test
        Path(path).write_text(json.dumps({f: sorted(ts, key=lambda t: (seconds.get(t, 0.0), t))
                                          for f, ts in hits.items()}))
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    by_function = json.loads(Path(path).read_text() or "{}")
    os.unlink(path)
    return code, by_function


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tests", action="append", help="pytest argument (repeatable)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    ap.add_argument("--json", type=Path, help="write {name: status} here")
    ap.add_argument("--per-test", action="store_true", help="run each mutant against the tests that reach it")
    ap.add_argument("--fresh", action="store_true",
                    help="a new interpreter per mutant: import-time code mutated too (with --per-test: the unreached)")
    ap.add_argument("--recheck", action="store_true", help="with --per-test: rerun survivors on every test")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once")
    ap.add_argument("--generate", action="store_true", help="the arguments are source files: generate mutants/")
    ap.add_argument("--resume", type=Path, help="skip the mutants this earlier output (``name status`` lines) has")
    ap.add_argument("patterns", nargs="+", help="mutant names or globs (fnmatch)")
    args = ap.parse_args(argv)
    if args.generate:
        return generate(args.patterns)
    if not args.tests:
        ap.error("--tests is required")
    root = Path("mutants").resolve()
    out = args.json.resolve() if args.json else None
    if not (root / "src").is_dir():
        print("mutate_narrow: no mutants/ here: run `mutmut run` or `--generate FILE...` first")
        return 2
    names = [n for n in mutant_names(root) if any(fnmatch.fnmatch(n, p) for p in args.patterns)]
    if args.resume:
        done = {line.split()[0] for line in args.resume.read_text().splitlines() if line.startswith("opfuse.")}
        names = [n for n in names if n not in done]
    os.chdir(root)
    sys.path[:] = [str(root / "src")] + [p for p in sys.path if not p.rstrip("/").endswith("/src")]
    import pytest  # imported once, before forking, like mutmut

    pytest.main(["--rootdir=.", "--collect-only", "-q", "-p", "no:cacheprovider", *args.tests])
    sanity = run_many([("", args.tests), ("fail", args.tests)], args.timeout, 1)
    for which, want in (("", "survived"), ("fail", "killed")):
        if sanity[which] != want:
            print(f"mutate_narrow: the tests {'fail unmutated' if which == '' else 'miss a forced failure'} "
                  f"({sanity[which]}); fix that first")
            return 2
    results: dict[str, str] = {}
    if args.per_test:
        code, reach = tests_by_function(args.tests)
        if code != 0:
            print(f"mutate_narrow: the recording run failed (pytest exit {code})")
            return 2
        jobs, unreached = [], []
        for name in names:
            tests = reach.get(function_of(name))
            if not tests and args.fresh:
                unreached.append(name)
                jobs.append((name, args.tests))
            elif not tests:
                results[name] = "not reached"
                print(name, "not reached", flush=True)
            else:
                jobs.append((name, args.tests if _OUTSIDE in tests else tests))
        results.update(run_many(jobs, args.timeout, args.jobs, frozenset(unreached)))
        again = [(n, args.tests) for n, t in jobs if results[n] == "survived" and t != args.tests and args.recheck]
        if again:
            print(f"mutate_narrow: {len(again)} survivors rerun against the whole selection", flush=True)
            results.update(run_many(again, args.timeout, args.jobs))
    else:
        results = run_many([(n, args.tests) for n in names], args.timeout, args.jobs, args.fresh)
    counts = {s: sum(1 for v in results.values() if v == s) for s in sorted(set(results.values()))}
    print("mutate_narrow:", len(results), "mutants", counts)
    if out is not None:
        out.write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
