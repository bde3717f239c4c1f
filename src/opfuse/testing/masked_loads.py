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


def parse(listing: str, source_lines: list[str]) -> list[MaskedLoad]:
    """The masked loads of an ``objdump -d -l --inlines`` listing of an object compiled from ``source_lines``
    (saved as ``model.c``). An instruction of an inlined header function (an intrinsic) is placed at the
    innermost ``model.c`` line of its inline chain."""
    found, function, line = [], "", 0
    ones: dict[str, bool | str] = {}  # register -> its last write set it to all ones (or a constant mask)
    outside = False  # the innermost location is not in model.c: the next "inlined by" line places it
    for raw in listing.splitlines():
        text = raw.strip()
        if m := _SYMBOL.match(raw):
            function, line, outside = m["name"], 0, False
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
        mnemonic, ops = m["mnemonic"], _operands(m["operands"].split("#")[0])
        if is_masked_load(mnemonic, m["operands"]):
            src = source_lines[line - 1].strip() if 0 < line <= len(source_lines) else ""
            found.append(MaskedLoad(function, line, src, f"{mnemonic} {m['operands'].strip()}",
                                    _origin(mnemonic, ops, src, ones)))
        if ops and ops[-1].startswith("%"):  # the register it writes: is it all ones now?
            ones[ops[-1].split("{")[0]] = _sets_all_ones(mnemonic, ops, ones)
        if "gather" in mnemonic:  # a gather clears its mask
            ones[_gather_mask(ops)] = False
        if line == 0:
            outside = True  # still in a header function: a caller change comes as an "inlined by" line alone
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
