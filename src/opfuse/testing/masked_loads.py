"""Find the masked loads gcc made of generated C, and the C line each came from (issue 13).

gcc 12.2 at -O3 if-converts a load under a condition inside a loop it vectorises (``if (inside) v =
x[...]``) into masked loads (``vmaskmovps/pd``, ``vpmaskmovd/q``, AVX-512 ``{%k}``-masked moves and
gathers), and three times those loads returned other memory. ``scan`` compiles a C text with the
toolchain's flags plus ``-g`` into an object, disassembles it with its line table (``objdump -d -l``) and
returns every instruction that reads memory under a mask, with the function it is in and the C line
it came from. A masked load whose C line is an intrinsic (``_mm256_maskload_ps``, ``_mm512_maskz_loadu_ps``:
the kernel masks on purpose, with a mask it computed; ``_mm512_mask_blend_ps`` of a vector it loaded whole,
which gcc folds into a masked move) is ``intrinsic``; one that reads a constant
(``%rip``-relative: a literal vector, no index) is ``constant``; one that reads the stack (a spill) is
``stack``; a gather whose mask was set to all ones (``kxnor k,k``, ``vpcmpeqd x,x``) reads every lane and is
``unmasked``; one whose ``{%k}`` mask was loaded from a constant (``kmov (%rip)``: gcc knew at compile time which
lanes a fully unrolled nest uses, and skips the others) is ``fixed-mask``; a ``vblendm``/``vpblendm`` with a
memory operand is ``blend`` (gcc folds an ordinary vector load into the select; a masked load of its
if-conversion is a masked move, never a blend), and masked arithmetic with a memory operand (``vmulps
(mem),%zmm,%zmm{%k}``: PRelu's ``x < 0 ? x * slope : x``) is ``folded`` for the same reason; any other (masked
moves, broadcasts, gathers, ``vmaskmov``) is the compiler's (``compiler``): an if-converted load, a masked vector
epilogue, or an ordinary load merged into a select (Round's ``|x| < 2^23 ? ... : x``: the C line says which).
``COUNTED`` are the origins an audit counts.

    from opfuse.testing.masked_loads import scan
    for m in scan(model.program.source, model.toolchain):
        print(m.function, m.line, m.text)
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from opfuse.runtime.toolchain import Toolchain

# gcc options that make a library, not an object; the rest are the build's own.
_LINK_ONLY = ("-shared",)
_SYMBOL = re.compile(r"^[0-9a-f]+ <(?P<name>[^>]+)>:$")
_LOCATION = re.compile(r"^(?P<file>\S+):(?P<line>\d+)(?: \(discriminator \d+\))?$")
_INLINED = re.compile(r"^inlined by (?P<file>\S+):(?P<line>\d+)(?: \(discriminator \d+\))?(?: \(.*\))?$")
_INSN = re.compile(r"^\s*[0-9a-f]+:\s+(?P<mnemonic>\S+)\s*(?P<operands>.*)$")
# An intrinsic that loads under a mask the kernel computed itself.
_MASKING_INTRINSIC = re.compile(r"_mm(256|512)?_mask[z]?_?(load|expandload|i32gather|i64gather|mov|blend)|"
                                r"_mm(256)?_maskload_|_mm(256|512)?_mask_i(32|64)gather")


COUNTED = ("compiler",)
_MOVES = ("vmov", "vbroadcast", "vpbroadcast", "vmaskmov", "vpmaskmov", "vexpand", "vpexpand", "vpmov")
_ALL_ONES = re.compile(r"^(kxnor[bwdq]|vpcmpeq[bwdq])$")


@dataclass(frozen=True)
class MaskedLoad:
    function: str      # the symbol the instruction is in (a kernel: ``k3_...``)
    line: int          # the C line gcc attributes it to (0 when the line table has none)
    text: str          # that line of the C, stripped
    instruction: str   # mnemonic and operands as objdump prints them (AT&T)
    origin: str  # intrinsic, constant, stack, unmasked, fixed-mask, blend, folded or compiler (module docstring)

    @property
    def mnemonic(self) -> str:
        return self.instruction.split()[0]


def _operands(text: str) -> list[str]:
    """Split AT&T operands at the commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return [o.strip() for o in out]


def is_masked_load(mnemonic: str, operands: str) -> bool:
    """Does this instruction read memory under a mask? AVX/AVX2 ``vmaskmov``/``vpmaskmov`` with a memory
    source, AVX2 gathers (always masked), and any AVX-512 instruction with a memory source and a
    ``{%k}``-masked register destination (moves, broadcasts, gathers, arithmetic)."""
    ops = _operands(operands.split("#")[0])
    if not ops:
        return False
    has_mem = any("(" in o for o in ops[:-1])
    if mnemonic.startswith(("vmaskmov", "vpmaskmov")):
        return "(" in ops[0]
    if "gather" in mnemonic:
        return True
    return has_mem and ops[-1].startswith("%") and "{%k" in ops[-1]


def disassemble(obj: Path) -> str:
    objdump = shutil.which("objdump")
    if objdump is None:
        raise RuntimeError("objdump (binutils) is needed to find masked loads")
    proc = subprocess.run([objdump, "-d", "-l", "--inlines", "--no-show-raw-insn", str(obj)], capture_output=True,
                          text=True, check=True)
    return proc.stdout


def _sets_all_ones(mnemonic: str, ops: list[str], ones: dict[str, bool | str]) -> bool | str:
    """``kxnor k,k,k`` / ``vpcmpeqd x,x,x`` (equal sources), ``vpternlogd $0xff`` or a copy of such a register:
    every bit set (``"fixed"``: a ``{%k}`` mask loaded from the constant pool)."""
    if mnemonic.startswith("vpternlog"):
        return ops[0] == "$0xff"
    if mnemonic.startswith("kmov") and len(ops) == 2 and "(%rip)" in ops[0]:
        return "fixed"  # a mask from the constant pool
    if mnemonic.startswith(("kmov", "vmovdq", "vmovap", "vmovup")) and len(ops) == 2 and ops[0].startswith("%"):
        return ones.get(ops[0], False)  # a copy
    return bool(_ALL_ONES.match(mnemonic)) and len(ops) == 3 and ops[0] == ops[1]


def _gather_mask(ops: list[str]) -> str:
    """AVX-512: the ``{%k}`` of the destination; AVX2: the first operand."""
    return ops[-1].split("{")[1].rstrip("}") if "{%k" in ops[-1] else ops[0]


def _origin(mnemonic: str, ops: list[str], src: str, ones: dict[str, bool | str]) -> str:
    if _MASKING_INTRINSIC.search(src):
        return "intrinsic"
    mem = next((o for o in ops if "(" in o), "")
    if "(%rip)" in mem:
        return "constant"
    if "(%rsp)" in mem or "(%rbp)" in mem:
        return "stack"
    if mnemonic.startswith(("vblendm", "vpblendm")):
        return "blend"
    if not mnemonic.startswith(_MOVES) and "gather" not in mnemonic:
        return "folded"
    mask = _gather_mask(ops) if "gather" in mnemonic or "{%k" in ops[-1] else ""
    state = ones.get(mask, False)
    if state == "fixed":
        return "fixed-mask"
    if "gather" in mnemonic and state:
        return "unmasked"
    return "compiler"


@dataclass(frozen=True)
class _Insn:
    address: int
    mnemonic: str
    operands: str      # as objdump prints them, the comment dropped
    ops: tuple[str, ...]
    line: int
    text: str


def _instructions(listing: str, source_lines: list[str]) -> dict[str, list[_Insn]]:
    """Each function's instructions in listing order, each placed at its ``model.c`` line. An instruction of an
    inlined header function (an intrinsic) is placed at the innermost ``model.c`` line of its inline chain."""
    functions: dict[str, list[_Insn]] = {}
    insns: list[_Insn] = []
    line = 0
    outside = False  # the innermost location is not in model.c: the next "inlined by" line places it
    for raw in listing.splitlines():
        text = raw.strip()
        if m := _SYMBOL.match(raw):
            insns, line, outside = functions.setdefault(m["name"], []), 0, False
            continue
        if m := _INLINED.match(text):
            if outside and m["file"].endswith("model.c"):
                line, outside = int(m["line"]), False
            continue
        if m := _LOCATION.match(text):
            outside = not m["file"].endswith("model.c")
            line = 0 if outside else int(m["line"])
            continue
        m = _INSN.match(raw)
        if m is None:
            continue
        operands = m["operands"].split("#")[0]
        src = source_lines[line - 1].strip() if 0 < line <= len(source_lines) else ""
        insns.append(_Insn(int(raw.split(":", 1)[0], 16), m["mnemonic"], operands,
                           tuple(_operands(operands)), line, src))
        if line == 0:
            outside = True  # still in a header function: a caller change comes as an "inlined by" line alone
    return functions


_PREFIXES = ("notrack", "bnd", "rex", "rex.w", "data16", "cs", "ds")
_ENDS = ("ret", "retq", "ud2", "hlt")
_Ones = dict[str, bool | str]


def _branch(insn: _Insn) -> tuple[str, int | None] | None:
    """``(kind, target)`` of a jump (``"jmp"`` or ``"jcc"``; the target None where it is indirect), ``("end",
    None)`` for an instruction after which nothing follows, ``("call", None)`` for a call; None otherwise."""
    words = [insn.mnemonic, *insn.operands.split()]
    while words and words[0] in _PREFIXES:
        words = words[1:]
    if not words:
        return None
    op, rest = words[0], words[1:]
    if op in _ENDS:
        return "end", None
    if op.startswith("call"):
        return "call", None
    if not op.startswith("j"):
        return None
    kind = "jmp" if op.startswith("jmp") else "jcc"
    if not rest or rest[0].startswith("*"):
        return kind, None
    try:
        return kind, int(rest[0], 16)
    except ValueError:
        return kind, None


def _step(insn: _Insn, ones: _Ones) -> None:
    """What ``insn`` does to the mask state: the register it writes (all ones now?), a gather's cleared mask, a
    call's clobbered registers (every mask and vector register is the caller's to save)."""
    ops = list(insn.ops)
    if ops and ops[-1].startswith("%"):
        ones[ops[-1].split("{")[0]] = _sets_all_ones(insn.mnemonic, ops, ones)
    if "gather" in insn.mnemonic:  # a gather clears its mask
        ones[_gather_mask(ops)] = False
    kind = _branch(insn)
    if kind is not None and kind[0] == "call":
        ones.clear()


def _meet(a: _Ones, b: _Ones) -> _Ones:
    return {r: v for r, v in a.items() if v and b.get(r) == v}


def _mask_states(insns: list[_Insn]) -> list[_Ones]:
    """The mask state before each instruction, following the function's control flow: a register is all ones
    (or a constant mask) at an instruction only where it is so on every path that reaches it (the listing's
    order is not the order it runs in: a block laid out after a gather that cleared a mask may be reached only
    from paths where that mask is still all ones). Where the function jumps through a register (targets not
    known), every block starts from nothing known."""
    if not insns:
        return []
    index = {insn.address: i for i, insn in enumerate(insns)}
    branches = [_branch(insn) for insn in insns]
    leaders = {0}
    for i, br in enumerate(branches):
        if br is not None and br[0] in ("jmp", "jcc", "end"):
            if i + 1 < len(insns):
                leaders.add(i + 1)
            if br[1] in index:
                leaders.add(index[br[1]])
    indirect = any(br is not None and br[0] in ("jmp", "jcc") and br[1] is None for br in branches)
    starts = sorted(leaders)
    block_of = {}
    blocks = []
    for k, s in enumerate(starts):
        e = starts[k + 1] if k + 1 < len(starts) else len(insns)
        blocks.append((s, e))
        block_of[s] = k
    succ: list[list[int]] = [[] for _ in blocks]
    for k, (_s, e) in enumerate(blocks):
        br = branches[e - 1]
        if br is not None and br[0] in ("jmp", "jcc") and br[1] in index:
            succ[k].append(block_of[index[br[1]]])
        falls = br is None or br[0] in ("jcc", "call")
        if falls and k + 1 < len(blocks):
            succ[k].append(k + 1)
    entry: list[_Ones | None] = [None] * len(blocks)  # None: not reached yet (no constraint)
    entry[0] = {}
    work = [0]
    while work:
        k = work.pop()
        state = dict(entry[k] or {})
        for i in range(*blocks[k]):
            _step(insns[i], state)
        for t in succ[k]:
            old = entry[t]
            new: _Ones = {} if indirect else (dict(state) if old is None else _meet(old, state))
            if old is None or new != old:
                entry[t] = new
                work.append(t)
    states: list[_Ones] = []
    for k, (s, e) in enumerate(blocks):
        state = dict(entry[k] or {})
        for i in range(s, e):
            states.append(dict(state))
            _step(insns[i], state)
    return states


def parse(listing: str, source_lines: list[str]) -> list[MaskedLoad]:
    """The masked loads of an ``objdump -d -l --inlines`` listing of an object compiled from ``source_lines``
    (saved as ``model.c``), in listing order. Whether a gather's mask is all ones is followed along the
    function's jumps (``_mask_states``)."""
    found = []
    for function, insns in _instructions(listing, source_lines).items():
        for insn, ones in zip(insns, _mask_states(insns), strict=True):
            if is_masked_load(insn.mnemonic, insn.operands):
                found.append(MaskedLoad(function, insn.line, insn.text, f"{insn.mnemonic} {insn.operands.strip()}",
                                        _origin(insn.mnemonic, list(insn.ops), insn.text, ones)))
    return found


def scan(source: str, toolchain: Toolchain, extra_flags: Iterable[str] = ()) -> list[MaskedLoad]:
    """Compile ``source`` as the toolchain builds it (plus ``-g``) and list its masked loads."""
    flags = [f for f in toolchain.flags if f not in _LINK_ONLY]
    with tempfile.TemporaryDirectory(prefix="opfuse-masked-") as d:
        c, obj = Path(d, "model.c"), Path(d, "model.o")
        c.write_text(source)
        subprocess.run([*toolchain.cc.split(), *flags, *extra_flags, "-g", "-c", "-o", str(obj), str(c)],
                       check=True, capture_output=True, text=True)
        return parse(disassemble(obj), source.splitlines())


def by_line(loads: Iterable[MaskedLoad]) -> list[tuple[MaskedLoad, int]]:
    """One entry per (function, line, mnemonic, origin) with its number of instructions, first seen first."""
    counts: Counter = Counter()
    first: dict = {}
    for m in loads:
        key = (m.function, m.line, m.mnemonic, m.origin)
        counts[key] += 1
        first.setdefault(key, m)
    return [(first[k], counts[k]) for k in first]


__all__ = ["MaskedLoad", "scan", "parse", "is_masked_load", "by_line"]
