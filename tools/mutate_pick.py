"""Names of a function's mutants whose mutated line is one a change added (to run a session's new code whole).

``python tools/mutate_pick.py MUTFILE SRC FUNC --base REV``: MUTFILE is mutmut's mutated copy of SRC (in
``mutants/``, made by ``tools/mutate_narrow.py --generate``), FUNC the function's mutmut name (``x__emit_gemm``,
``xǁConvWindowsǁ__init__``). A mutant is kept where the first line it changes in the function is, by its text, one
of the ``+`` lines of ``git diff REV..HEAD -- SRC``. Prints the kept names (``module.function__mutmut_N``) on one
line, and on stderr how many of how many. Used by the mutation records mutX (``--base eee066d``) and mutY
(``--base 3a9148a``), tests/mutation/.
"""
from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys


def added_lines(src: str, base: str) -> set[str]:
    diff = subprocess.run(["git", "diff", f"{base}..HEAD", "--", src], capture_output=True, text=True,
                          check=True).stdout
    return {line[1:].strip() for line in diff.splitlines()
            if line.startswith("+") and not line.startswith("+++") and line[1:].strip()}


def body(source: str, name: str) -> list[str]:
    """The function's lines without its ``def`` line (which differs by name in every mutant)."""
    m = re.search(rf"^(\s*)def {re.escape(name)}\(.*?(?=^\1def |\Z|^\S)", source, re.S | re.M)
    if m is None:
        raise SystemExit(f"mutate_pick: no function {name} in the mutated file")
    return [ln for ln in m.group(0).splitlines() if not ln.lstrip().startswith(f"def {name}")]


def pick(source: str, func: str, added: set[str]) -> tuple[list[str], int]:
    """(the mutant functions' names kept, how many there are)."""
    orig = body(source, f"{func}__mutmut_orig")
    names = sorted(set(re.findall(rf"def ({re.escape(func)}__mutmut_\d+)\(", source)),
                   key=lambda s: int(s.rsplit("_", 1)[1]))
    keep = []
    for n in names:
        for op in difflib.SequenceMatcher(None, orig, body(source, n), autojunk=False).get_opcodes():
            if op[0] != "equal":
                lines = orig[op[1]:op[2]] or orig[max(op[1] - 1, 0):op[1] + 1]
                if any(ln.strip() in added for ln in lines):
                    keep.append(n)
                break
    return keep, len(names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mutfile")
    ap.add_argument("src")
    ap.add_argument("func")
    ap.add_argument("--base", required=True, help="the revision the change starts from")
    args = ap.parse_args()
    with open(args.mutfile) as f:
        source = f.read()
    keep, total = pick(source, args.func, added_lines(args.src, args.base))
    mod = args.src.replace("src/", "").replace(".py", "").replace("/", ".")
    print(total, len(keep), file=sys.stderr)
    print(" ".join(f"{mod}.{n}" for n in keep))


if __name__ == "__main__":
    main()
