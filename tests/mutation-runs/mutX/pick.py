"""Mutant names of FUNC (mutmut's x_ name) in MUTFILE whose mutated line is one this session added (git diff)."""
import re, subprocess, sys, difflib
mutfile, src, func = sys.argv[1], sys.argv[2], sys.argv[3]
added = set()
diff = subprocess.run(["git", "diff", "eee066d..HEAD", "--", src], capture_output=True, text=True).stdout
for l in diff.splitlines():
    if l.startswith("+") and not l.startswith("+++"):
        t = l[1:].strip()
        if t: added.add(t)
text = open(mutfile).read()
def body(name):
    m = re.search(rf"^(\s*)def {re.escape(name)}\(.*?(?=^\1def |\Z|^\S)", text, re.S | re.M)
    return [l for l in m.group(0).splitlines() if not l.lstrip().startswith(f"def {name}")] if m else None
orig = body(f"{func}__mutmut_orig")
names = sorted(set(re.findall(rf"def ({re.escape(func)}__mutmut_\d+)\(", text)), key=lambda s: int(s.rsplit("_", 1)[1]))
mod = src.replace("src/", "").replace(".py", "").replace("/", ".")
keep = []
for n in names:
    b = body(n)
    for op in difflib.SequenceMatcher(None, orig, b, autojunk=False).get_opcodes():
        if op[0] != "equal":
            lines = orig[op[1]:op[2]] or orig[max(op[1]-1, 0):op[1]+1]
            if any(l.strip() in added for l in lines):
                keep.append(f"{mod}.{n}")
            break
print(len(names), len(keep), file=sys.stderr)
print(" ".join(keep))
