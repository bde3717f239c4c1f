"""Audit generated C for masked loads (issue 13): build a set of models fused and unfused, compile each C
text as the toolchain does plus ``-g``, and list every instruction that reads memory under a mask with its
kernel and C line (``opfuse.testing.masked_loads``).

Sets: ``zoo`` (every zoo model), ``real`` (the real-model tests' models, when fetched), ``fuzz`` (graphs the
fuzzer draws with each op in focus: ``--per-op`` each, float32, float64 and integer, seeded), and ``sites``
(small odd-width builds of each code path that loads under a condition today or did). Each case prints one
line per (kernel, C line, mnemonic) with a masked load; ``--json FILE`` writes them all.

    python tools/masked_loads.py sites zoo
    python tools/masked_loads.py fuzz --per-op 3 --seed 0 --json /tmp/fuzz.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, Iterator

import numpy as np

from opfuse.codegen import generate
from opfuse.compiler import CompileOptions, plan_model
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.runtime.toolchain import Toolchain
from opfuse.testing.masked_loads import by_line, scan
from opfuse.testing.masked_load_cases import SITE_CASES

Case = tuple[str, Callable[[], object], dict]  # name, model factory, compile options


def zoo_cases() -> Iterator[Case]:
    from opfuse import zoo
    for name in zoo.list_models():
        yield f"zoo:{name}", (lambda n=name: f"zoo:{n}"), {}


def real_cases() -> Iterator[Case]:
    from opfuse.testing import realmodels
    try:
        paths = realmodels.fetch()
    except realmodels.ModelsUnavailable as e:
        print(f"real models skipped: {e}", file=sys.stderr)
        return
    for key, m in realmodels.MODELS.items():
        yield f"real:{key}", (lambda p=paths[key]: str(p)), {"input_shapes": {m.input_name: m.shape}}


def _keeper(drawn: list) -> Callable[[object], None]:
    def keep(case) -> None:
        drawn.append(case)
    return keep


def fuzz_cases(per_op: int, seed: int, max_nodes: int) -> Iterator[Case]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from opfuse.testing.fuzz_cases import fuzz_cases as strategy
    from opfuse.testing.random_graphs import DEFAULT_OPS, focused_ops
    for op in sorted(DEFAULT_OPS):
        drawn: list = []
        run = hypothesis_seed(seed)(settings(max_examples=per_op, database=None, phases=[Phase.generate],
                                             deadline=None, suppress_health_check=list(HealthCheck))(
            given(strategy(focused_ops(op), max_nodes))(_keeper(drawn))))
        try:
            run()
        except Exception as e:  # noqa: BLE001 - a family that cannot draw is reported, not fatal
            print(f"fuzz {op}: no cases ({type(e).__name__}: {e})", file=sys.stderr)
        for k, case in enumerate(drawn):
            yield f"fuzz:{op}:{k}:{case.dtype}", (lambda c=case: c.graph), {"planner": case.planner}


def site_cases() -> Iterator[Case]:
    for name, make in SITE_CASES.items():
        yield f"site:{name}", make, {"planner": "rules"}


def sources(model, options: dict) -> Iterator[tuple[str, str]]:
    """The C of ``model`` unfused and fused."""
    for fuse in (False, True):
        comp = plan_model(model, CompileOptions(fuse=fuse, **options))
        plan = comp.plan if fuse else FusionPlan.unfused(comp.graph)
        memory = comp.memory if fuse else None
        yield ("fused" if fuse else "unfused"), generate(comp.graph, plan, memory=memory).source


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sets", nargs="+", choices=("zoo", "real", "fuzz", "sites"))
    ap.add_argument("--per-op", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-nodes", type=int, default=6)
    ap.add_argument("--flag", action="append", default=[], help="an extra compiler flag (repeatable)")
    ap.add_argument("--json", help="write every masked load found here")
    args = ap.parse_args(argv)
    tc = Toolchain.detect()
    cases: list[Iterator[Case]] = []
    for s in args.sets:
        cases.append({"zoo": zoo_cases, "real": real_cases, "sites": site_cases,
                      "fuzz": lambda: fuzz_cases(args.per_op, args.seed, args.max_nodes)}[s]())
    rows = []
    for it in cases:
        for name, make, options in it:
            t0 = time.perf_counter()
            try:
                model = make()
                if isinstance(model, Graph):
                    model = model.copy()
                for build, src in sources(model, options):
                    for m, n in by_line(scan(src, tc, args.flag)):
                        row = {"case": name, "build": build, "function": m.function, "line": m.line,
                               "text": m.text, "instruction": m.instruction, "count": n, "origin": m.origin}
                        rows.append(row)
                        print(f"{name} {build} {m.function}:{m.line} x{n} {m.origin} {m.instruction} | {m.text}",
                              flush=True)
            except Exception as e:  # noqa: BLE001 - an unsupported case is skipped, the audit goes on
                print(f"{name}: skipped ({type(e).__name__}: {str(e)[:120]})", file=sys.stderr, flush=True)
            print(f"# {name} {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    compiler = sum(r["count"] for r in rows if r["origin"] == "compiler")
    print(f"{len(rows)} sites, {compiler} compiler-made masked load instructions", file=sys.stderr)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
