"""Run ``tools/mutate_quick.py`` with each mutant against only the tests that execute its mutated line.

A wrapper for triage of C-generator mutants whose functions every test of a wide selection reaches (mutG,
2026-12-03): ``--covering FILE`` is JSON ``{mutant name: [test ids]}``, the tests of the selection that run the
mutated statement in the unmutated source (line coverage per test). A test that never executes the statement
runs the mutant exactly as the original, so it cannot kill it: the verdicts are those of the whole selection.
A mutant no test covers is printed ``not reached``. The file may also be compact: ``{"tests": [ids], "covering":
{mutant: [indices into tests]}}``. Every other option is ``mutate_quick.py``'s.

    python tools/mutate_lines.py --covering covering.json --jobs 2 --tests tests/codegen/test_fused.py -- NAMES
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutate_quick  # noqa: E402


def main(argv: list[str]) -> int:
    i = argv.index("--covering")
    covering: dict = json.loads(Path(argv[i + 1]).read_text())
    if "covering" in covering:  # the compact form
        ids = covering["tests"]
        covering = {m: [ids[k] for k in ks] for m, ks in covering["covering"].items()}
    rest = argv[:i] + argv[i + 2:]
    reach = mutate_quick.reach

    def reach_per_mutant(*a, **kw):  # type: ignore[no-untyped-def]
        hits, keys, cost, compiled = reach(*a, **kw)
        return {m: ids for m, ids in covering.items()}, keys, cost, compiled

    mutate_quick.reach = reach_per_mutant  # type: ignore[assignment]
    mutate_quick.function_of = lambda name: name  # type: ignore[assignment]
    return mutate_quick.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
