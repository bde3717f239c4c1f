"""Mutant names of FUNC (mutmut's ``x_`` name) in MUTFILE whose mutated line is one the session added.

``python pick.py MUTFILE SRC FUNC``: the first line a mutant changes in its function, compared by text with the
``+`` lines of ``git diff 3a9148a..HEAD -- SRC``; prints the names (``module.function__mutmut_N``) kept, and on
stderr how many of how many. mutY (2026-12-04, early morning).
"""
import difflib
import re
import subprocess
import sys

mutfile, src, func = sys.argv[1], sys.argv[2], sys.argv[3]
added = set()
diff = subprocess.run(["git", "diff", "3a9148a..HEAD", "--", src], capture_output=True, text=True).stdout
for line in diff.splitlines():
    if line.startswith("+") and not line.startswith("+++"):
        text = line[1:].strip()
        if text:
            added.add(text)
source = open(mutfile).read()


def body(name: str) -> list[str]:
    """The function's lines without its ``def`` line (which differs by name in every mutant)."""
    m = re.search(rf"^(\s*)def {re.escape(name)}\(.*?(?=^\1def |\Z|^\S)", source, re.S | re.M)
    assert m, name
    return [ln for ln in m.group(0).splitlines() if not ln.lstrip().startswith(f"def {name}")]


orig = body(f"{func}__mutmut_orig")
names = sorted(set(re.findall(rf"def ({re.escape(func)}__mutmut_\d+)\(", source)),
               key=lambda s: int(s.rsplit("_", 1)[1]))
mod = src.replace("src/", "").replace(".py", "").replace("/", ".")
keep = []
for n in names:
    for op in difflib.SequenceMatcher(None, orig, body(n), autojunk=False).get_opcodes():
        if op[0] != "equal":
            lines = orig[op[1]:op[2]] or orig[max(op[1] - 1, 0):op[1] + 1]
            if any(ln.strip() in added for ln in lines):
                keep.append(f"{mod}.{n}")
            break
print(len(names), len(keep), file=sys.stderr)
print(" ".join(keep))
