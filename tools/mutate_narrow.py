"""Run mutmut's mutants against a narrower test selection than ``[tool.mutmut]`` (one module's tests).

``make mutate`` (mutmut) runs each mutant against every configured test that reaches the mutated
function; for code every compile goes through (the code generator, the memory planner) that is most
of tests/codegen and tests/e2e per surviving mutant, hours on 2 cores. This runs chosen mutants
against chosen tests, the way mutmut does (the mutated tree in ``mutants/``, one forked pytest per
mutant, ``MUTANT_UNDER_TEST`` naming it), so a module can be triaged against the tests that are about
it. A mutant that survives here may still die in the full selection: rerun the survivors with
``mutmut run NAMES`` before calling one equivalent. ``mutants/`` must exist (``mutmut run`` made it).

    python tools/mutate_narrow.py --tests tests/codegen/test_checks.py -- 'opfuse.codegen.checks.*'

Prints ``name status`` per mutant (killed / survived / timeout) and a count; ``--json FILE`` saves them.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import signal
import sys
import time
from pathlib import Path


def mutant_names(root: Path) -> list[str]:
    """Every mutant mutmut generated, by name (from its ``.meta`` files)."""
    names = []
    for meta in sorted((root / "src").rglob("*.py.meta")):
        names.extend(json.loads(meta.read_text())["exit_code_by_key"])
    return sorted(names)


def run_one(name: str, tests: list[str], timeout: float) -> str:
    pid = os.fork()
    if pid == 0:  # child: the mutant is chosen per call by the trampolines
        os.environ["MUTANT_UNDER_TEST"] = name
        import pytest
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        code = pytest.main(["--rootdir=.", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests])
        os._exit(int(code))
    start = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return "survived" if code == 0 else ("killed" if code in (1, 2, 3) or code < 0 else f"error {code}")
        if time.monotonic() - start > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tests", action="append", required=True, help="pytest argument (repeatable)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    ap.add_argument("--json", type=Path, help="write {name: status} here")
    ap.add_argument("patterns", nargs="+", help="mutant names or globs (fnmatch)")
    args = ap.parse_args(argv)
    root = Path("mutants").resolve()
    out = args.json.resolve() if args.json else None
    if not (root / "src").is_dir():
        print("mutate_narrow: no mutants/ here: run `mutmut run` (at least until it has generated them)")
        return 2
    names = [n for n in mutant_names(root) if any(fnmatch.fnmatch(n, p) for p in args.patterns)]
    os.chdir(root)
    sys.path[:] = [str(root / "src")] + [p for p in sys.path if not p.rstrip("/").endswith("/src")]
    import pytest  # imported once, before forking, like mutmut

    pytest.main(["--rootdir=.", "--collect-only", "-q", "-p", "no:cacheprovider", *args.tests])
    for sanity, want in (("", "survived"), ("fail", "killed")):
        got = run_one(sanity, args.tests, args.timeout)
        if got != want:
            print(f"mutate_narrow: the tests {'fail unmutated' if sanity == '' else 'miss a forced failure'} "
                  f"({got}); fix that first")
            return 2
    results = {}
    for name in names:
        results[name] = run_one(name, args.tests, args.timeout)
        print(name, results[name], flush=True)
    counts = {s: sum(1 for v in results.values() if v == s) for s in sorted(set(results.values()))}
    print("mutate_narrow:", len(results), "mutants", counts)
    if out is not None:
        out.write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
