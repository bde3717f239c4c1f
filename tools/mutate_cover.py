"""Which tests execute each mutant's mutated statement: the ``--covering`` file of ``tools/mutate_lines.py``.

Runs the test files once, unmutated, in process (``mutate_quick.py``'s runner and fixtures, the build cache given,
so a warm cache compiles nothing), with line coverage of one source file per test; then finds each named mutant's
statement in that file (its original line, from the generated ``mutants/`` tree: the first line the mutation
removes, in the function it mutates, the occurrence order where the same line repeats; a continuation line counts
as its statement's first line, as coverage records it) and writes JSON ``{mutant: [test ids]}``. Line numbers are
those of the source now: make the file again after the source changes. (mutG, 2026-12-03.)

    python tools/mutate_cover.py --source src/opfuse/codegen/gemm.py --out covering.json \
        --tests tests/codegen/test_gemm_paths.py -- 'opfuse.codegen.gemm.*'
"""
from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """mutmut's names (``x_f``, ``xǁClassǁmethod``) of the functions of a module."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out["x_" + node.name] = node
        elif isinstance(node, ast.ClassDef):
            for f in node.body:
                if isinstance(f, ast.FunctionDef):
                    out[f"x\u01c1{node.name}\u01c1{f.name}"] = f
    return out


def _mutations(mutated: Path) -> dict[str, tuple[str, list[str], list[str]]]:
    """Per mutant of a mutmut-mutated file: (function, lines it removes, lines it adds), stripped."""
    src = mutated.read_text()
    lines = src.splitlines()
    bodies: dict[str, dict[str, list[str]]] = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef):
            m = re.match(r"(.*)__mutmut_(orig|\d+)$", node.name)
            if m:
                bodies.setdefault(m.group(1), {})[m.group(2)] = lines[node.lineno:node.end_lineno]
    out = {}
    for f, d in bodies.items():
        for k, body in d.items():
            if k != "orig":
                diff = list(difflib.ndiff(d["orig"], body))
                out[f"{f}__mutmut_{k}"] = (f, [x[2:].strip() for x in diff if x.startswith("- ")],
                                           [x[2:].strip() for x in diff if x.startswith("+ ")])
    return out


def statement_lines(source: Path, mutated: Path) -> dict[str, int | None]:
    """Per mutant (short name): the line coverage records for the statement it mutates, None if not found."""
    src = source.read_text()
    lines = src.splitlines()
    tree = ast.parse(src)
    funcs = _functions(tree)
    stmts = [s for s in ast.walk(tree) if isinstance(s, ast.stmt)]

    def head(ln: int) -> int:
        best = None
        for s in stmts:
            if not s.lineno <= ln <= (s.end_lineno or s.lineno):
                continue
            body = getattr(s, "body", None)
            if isinstance(s, (ast.With, ast.If, ast.For, ast.While, ast.FunctionDef, ast.Try)) and body \
                    and ln >= body[0].lineno:
                continue  # a line of a compound statement's body, not of its header
            if best is None or (s.end_lineno or 0) - s.lineno < (best.end_lineno or 0) - best.lineno:
                best = s
        return best.lineno if best is not None else ln

    muts = _mutations(mutated)
    out: dict[str, int | None] = {}
    for name, (f, rem, add) in muts.items():
        fn = funcs.get(f)
        if fn is None or not rem:
            out[name] = None
            continue
        hits = [i + 1 for i in range(fn.lineno - 1, fn.end_lineno or fn.lineno) if lines[i].strip() == rem[0]]
        same = sorted((k for k, v in muts.items() if v[0] == f and v[1][:1] == rem[:1] and v[2] == add),
                      key=lambda s: int(s.rsplit("_", 1)[1]))
        out[name] = head(hits[same.index(name)] if len(same) == len(hits) else hits[0]) if hits else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="the mutated module's source, e.g. src/opfuse/x.py")
    ap.add_argument("--tests", action="append", required=True, help="a test file (repeatable)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--build-cache", type=Path, default=Path(".opfuse-cache/mutation"))
    ap.add_argument("patterns", nargs="+", help="mutant names or globs (fnmatch)")
    args = ap.parse_args(argv)
    import coverage

    import mutate_quick as mq
    module = ".".join(args.source.with_suffix("").parts[1:])
    stmt = statement_lines(args.source, Path("mutants") / args.source)
    cache = args.build_cache.resolve()
    os.environ["OPFUSE_CACHE_DIR"] = str(cache)
    cov = coverage.Coverage(include=[str(args.source.resolve())], data_file=None)
    tests, _ = mq.collect(args.tests)
    session = mq._Session(cache)
    cov.start()
    for t in tests:
        cov.switch_context(t.id)
        try:
            session.call(t)
        except BaseException as e:  # noqa: BLE001 - a failing test covers what it ran
            print("failed:", t.id, repr(e)[:200], file=sys.stderr)
    cov.stop()
    session.close()
    data = cov.get_data()
    ran: dict[str, set[int]] = {}
    for ctx in data.measured_contexts():
        data.set_query_contexts(["^" + re.escape(ctx) + "$"])
        ran[ctx] = set(data.lines(str(args.source.resolve())) or [])
    names = [f"{module}.{k}" for k in stmt]
    chosen = [n for n in names if any(fnmatch.fnmatch(n, p) for p in args.patterns)]
    result = {n: sorted(t for t, ls in ran.items() if stmt[n.rsplit(".", 1)[1]] in ls) for n in chosen}
    args.out.write_text(json.dumps(result, indent=0))
    print(f"{len(tests)} tests, {len(chosen)} mutants, {sum(1 for v in result.values() if not v)} covered by none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
