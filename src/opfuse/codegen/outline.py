"""Parallel loops outlined into functions that run on the program's thread pool (``threadpool.py``).

The kernel generators mark a loop to split across threads with a pragma line,
``OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static|dynamic, 1) [collapse(k)] if(nt > 1))``
(``KernelContext.parallel_for``), the syntax OpenMP reads. On the host the program runs no OpenMP: each
marked loop becomes a function of its own (the loop's body over a range of its iterations) and a call
``opfuse_parallel(function, &context, iterations, nt, schedule)`` in its place, as a compiler's own
OpenMP lowering does. The microcontroller's program has no threads and keeps the loop where it is
(``strip``).

The context is a struct of what the loop reads from the kernel: the kernel's parameters and the locals
declared before the loop in the scopes around it, copied by value (a pointer's target is shared, as it
is in OpenMP; no loop writes a scalar local of its kernel but the fault flags). Integer constants
declared before the loop (``const long n = 96;``, ``const long rows = n / 6;``) are declared again in
the function instead, so the loop bounds stay compile-time constants there. Fault flags are
OR-reductions: each piece ORs its own into the context, and the kernel ORs the context's into its flag.

A loop inside ``#if`` branches gets its function inside the same conditions. The locals are found by
reading the kernel's declarations, one statement per line as the ``CWriter`` writes them; a local the
reader missed leaves its name undeclared in the function, which the C compiler rejects (never a
silently wrong value).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

PRAGMA = "OPFUSE_PRAGMA(omp parallel for"
STATIC_CLAUSE = "schedule(static)"       # the markers' schedules (OpenMP's names), as KernelContext writes them
DYNAMIC_CLAUSE = "schedule(dynamic, 1)"
REGION = "OPFUSE_PRAGMA(omp parallel num_threads"
SHARED_LOOP = "OPFUSE_PRAGMA(omp for"
_SCHEDULE = re.compile(r"schedule\((static|dynamic)")
_COLLAPSE = re.compile(r"collapse\((\d+)\)")
_HEAD = re.compile(r"^(\s*)for \(long (\w+) = ([^;]+); \2 < ([^;]+); (?:\+\+\2|\2 \+= (\d+))\)\s*(.*)$")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_TYPE = (r"(?:unsigned\s+)?(?:long long|long|int|short|char|float|double|size_t|ptrdiff_t|"
         r"u?int(?:8|16|32|64)_t|__m\d+[a-z]*|__mmask\d+|_Float16|__fp16|\w+x\d+_t)")
_DECL = re.compile(rf"^(?:static\s+)?(?P<const>const\s+)?(?P<type>{_TYPE})\b\s*(?P<rest>[*\w].*);\s*$")
_DECLARATOR = re.compile(r"^(?P<ptr>(?:\*\s*(?:const\s+|restrict\s+)*)*)(?P<name>[A-Za-z_]\w*)\s*"
                         r"(?P<arr>(?:\[[^\]]*\])*)\s*(?:=\s*(?P<init>.*))?$")
_FOR_DECL = re.compile(r"^for \(long (\w+) = ")
_TRAILING_COMMENT = re.compile(r"\s*/\*(?:(?!\*/).)*\*/\s*$")
_INTEGER = {"long", "int", "short", "char", "size_t", "ptrdiff_t", "long long", "unsigned long", "unsigned",
            "unsigned int", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
            "uint64_t"}
_KEYWORDS = {"for", "if", "else", "while", "return", "sizeof", "const", "restrict", "long", "int", "float",
             "double", "char", "void", "unsigned", "short", "break", "continue", "do", "struct", "defined"}


class OutlineError(AssertionError):
    """A marked loop the outliner cannot read: a code generator broke the contract above."""


@dataclass(frozen=True)
class Local:
    """A local the loop may read: how it is declared, how a context member and a copy declare it."""

    name: str
    member: str        # the struct member's declaration, e.g. "const float* p"
    copy: str          # the function's declaration of it from the context, e.g. "const float* restrict p = c_->p;"
    init: str          # the kernel's expression for the member, e.g. "p"
    replica: str | None = None  # an integer constant's own declaration, repeated in the function


@dataclass
class _Scope:
    names: dict[str, Local] = field(default_factory=dict)


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses and brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def declarations(stmt: str) -> list[Local]:
    """The locals a line declares (none when it is no declaration)."""
    stmt = _TRAILING_COMMENT.sub("", stmt)
    m = _FOR_DECL.match(stmt)
    if m:
        name = m.group(1)
        return [Local(name, f"long {name}", f"const long {name} = c_->{name};", name)]
    m = _DECL.match(stmt)
    if not m or m["rest"].startswith(("(", "=")):
        return []
    const, ctype = bool(m["const"]), re.sub(r"\s+", " ", m["type"])
    out = []
    for part in _split_top(m["rest"]):
        d = _DECLARATOR.match(part)
        if d is None:
            return []
        name, ptr, arr, init = d["name"], d["ptr"] or "", d["arr"] or "", d["init"]
        ptr_plain = re.sub(r"\s*restrict\s*", "", ptr).replace(" ", "")
        if arr:  # an array: shared through a pointer to its first element (row)
            dims = re.findall(r"\[[^\]]*\]", arr)
            inner = "".join(dims[1:])
            cq = "const " if const else ""
            if inner:
                member, copy = f"{cq}{ctype} (*{name}){inner}", f"{cq}{ctype} (*const {name}){inner} = c_->{name};"
            else:
                member, copy = f"{cq}{ctype}* {name}", f"{cq}{ctype}* const {name} = c_->{name};"
            out.append(Local(name, member, copy, name))
            continue
        if ptr:  # a pointer: a leading const qualifies what it points to
            cq = "const " if const else ""
            out.append(Local(name, f"{cq}{ctype}{ptr_plain} {name}",
                             f"{cq}{ctype}{ptr.rstrip()} {name} = c_->{name};".replace("  ", " "), name))
            continue
        replica = (f"const {ctype} {name} = {init};" if const and ctype in _INTEGER and init is not None
                   and "OPFUSE_TID" not in init else None)
        out.append(Local(name, f"{ctype} {name}", f"{'const ' if const else ''}{ctype} {name} = c_->{name};",
                         name, replica))
    return out


@dataclass
class _Head:
    var: str
    start: str
    bound: str
    step: int
    text: str  # as the generator wrote it, without the body

    def extent(self) -> str:
        if self.start == "0" and self.step == 1:
            return f"({self.bound})"
        span = f"({self.bound}) - ({self.start})"
        return f"({span})" if self.step == 1 else f"((({span}) + {self.step - 1}) / {self.step})"


def _statement(lines: list[str], j: int) -> int:
    """The index after the statement starting at ``lines[j]`` (a line, a loop head and its body, a block)."""
    text = lines[j].rstrip()
    m = _HEAD.match(text)
    if m and not m.group(6):
        return _statement(lines, j + 1)
    if text.endswith("{"):
        depth = 0
        for k in range(j, len(lines)):
            depth += lines[k].count("{") - lines[k].count("}")
            if depth == 0:
                return k + 1
        raise OutlineError(f"unbalanced braces from: {text.strip()}")
    return j + 1


def _loop(lines: list[str], j: int, collapse: int) -> tuple[list[_Head], list[str], int, str]:
    """The ``collapse`` loop heads from ``lines[j]``, the innermost body's lines, the index after the loop
    and the first head's indentation."""
    heads: list[_Head] = []
    indent = None
    end = _statement(lines, j)
    k = j
    body: list[str] = []
    for level in range(collapse):
        m = _HEAD.match(lines[k].rstrip())
        if m is None:
            raise OutlineError(f"a parallel loop's head is not a canonical loop: {lines[k].strip()}")
        indent = m.group(1) if indent is None else indent
        head_text = lines[k].strip()
        head_text = head_text[:len(head_text) - len(m.group(6))].rstrip()
        heads.append(_Head(m.group(2), m.group(3).strip(), m.group(4).strip(), int(m.group(5) or 1), head_text))
        rest = m.group(6)
        if rest == "{":
            inner_end = _statement(lines, k)
            body = lines[k + 1:inner_end - 1]
            if level + 1 < collapse:
                if not body or _statement(body, 0) != len(body):
                    raise OutlineError("collapsed loops that are not perfectly nested")
                lines, k = body, 0
                continue
        elif rest:
            if level + 1 < collapse:
                raise OutlineError("collapsed loops written on one line")
            body = [m.group(1) + "  " + rest]
        else:
            body = lines[k + 1:_statement(lines, k + 1)]
            if level + 1 < collapse:
                lines, k = body, 0
                continue
    assert indent is not None
    return heads, body, end, indent


def _visible(scopes: list[_Scope]) -> dict[str, Local]:
    """The locals of the open scopes, inner ones hiding outer ones of the same name."""
    visible: dict[str, Local] = {}
    for sc in scopes:
        visible.update(sc.names)
    return visible


def _schedule(marker: str) -> str:
    """"dynamic" or "static": the schedule a marker line names."""
    m = _SCHEDULE.search(marker)
    return "dynamic" if m and m.group(1) == "dynamic" else "static"


class Outliner:
    """Outlines the marked loops of one kernel: ``run(lines)`` gives the kernel's new lines, ``functions``
    the outlined functions' text (to be placed before the kernel)."""

    def __init__(self, kernel: str, params: list[tuple[str, str]], faults: list[str], attributes: str = ""):
        """``attributes``: written before each outlined function's storage class, as before the kernel's."""
        self.kernel = kernel
        self.params = {name: decl for decl, name in params}  # name -> "const float* restrict"
        self.faults = faults
        self.attributes = attributes
        self.functions: list[str] = []

    def _param(self, name: str) -> Local:
        decl = self.params[name]
        plain = re.sub(r"\s*restrict\s*", "", decl).rstrip()
        return Local(name, f"{plain} {name}", f"{decl.rstrip()} {name} = c_->{name};", name)

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        scopes = [_Scope()]
        conds: list[list[str]] = []  # per open #if: the conditions of its branches so far
        j = 0
        while j < len(lines):
            ln = lines[j]
            s = ln.strip()
            if s.startswith("#"):
                self._directive(s, conds)
                out.append(ln)
                j += 1
                continue
            if s.startswith(REGION):
                out.extend(self._region(lines, j + 1, scopes, conds))
                j = _statement(lines, j + 1)
                continue
            if s.startswith(PRAGMA):
                collapse = _COLLAPSE.search(s)
                heads, body, end, indent = _loop(lines, j + 1, int(collapse.group(1)) if collapse else 1)
                out.extend(self._outline(heads, body, indent, _visible(scopes), lines[j + 1:end], _schedule(s),
                                         conds))
                j = end
                continue
            self._scan(s, scopes)
            out.append(ln)
            j += 1
        return out

    @staticmethod
    def _scan(s: str, scopes: list[_Scope]) -> None:
        """Follow the line ``s``'s declarations and braces."""
        loop_var = _FOR_DECL.match(s)
        if not loop_var:
            found = declarations(s)
            for d in found:
                scopes[-1].names[d.name] = d
            if found:  # its braces are an initializer's (``static const float t[4] = {...};``), no block's
                return
        opens, closes = s.count("{"), s.count("}")
        for _ in range(closes):
            if len(scopes) > 1:
                scopes.pop()
        for _ in range(opens):
            scopes.append(_Scope())
        if loop_var and opens:  # the loop variable lives in the block the head opens (none without one)
            scopes[-1].names.update({d.name: d for d in declarations(s)})

    def _region(self, lines: list[str], j: int, scopes: list[_Scope], conds: list[list[str]]) -> list[str]:
        """``omp parallel`` over the block at ``lines[j]``: its lines before each ``omp for`` loop are each
        thread's set-up (they write only the thread's own scratch). Each loop becomes a parallel loop of its
        own whose function runs the set-up first, once per piece; the loops run one after the other, as the
        region's barriers had them."""
        if lines[j].strip() != "{":
            raise OutlineError("an omp parallel region is not a block")
        end = _statement(lines, j)
        block = lines[j + 1:end - 1]
        visible = _visible(scopes)
        out = [lines[j]]
        pre: list[str] = []
        k = 0
        while k < len(block):
            s = block[k].strip()
            if s.startswith(SHARED_LOOP):
                heads, body, stop, indent = _loop(block, k + 1, 1)
                out.extend(self._outline(heads, body, indent, visible, pre + block[k + 1:stop], _schedule(s),
                                         conds, pre))
                k = stop
                continue
            if s.startswith(("OPFUSE_PRAGMA(", "#")):
                raise OutlineError(f"an omp parallel region holds {s}")
            pre.append(block[k])
            k += 1
        out.append(lines[end - 1])
        return out

    @staticmethod
    def _directive(s: str, conds: list[list[str]]) -> None:
        word = s[1:].strip().split(None, 1)
        kw, arg = (word[0], word[1] if len(word) > 1 else "") if word else ("", "")
        if kw == "if":
            conds.append([f"({arg})"])
        elif kw == "ifdef":
            conds.append([f"defined({arg})"])
        elif kw == "ifndef":
            conds.append([f"!defined({arg})"])
        elif kw == "elif":
            conds[-1].append(f"({arg})")
        elif kw == "else":
            conds[-1].append("1")
        elif kw == "endif":
            conds.pop()

    @staticmethod
    def _condition(conds: list[list[str]]) -> str | None:
        terms = []
        for branches in conds:
            *before, cur = branches
            terms += [f"!{b}" for b in before if b != "1"]
            if cur != "1":
                terms.append(cur)
        return " && ".join(terms) if terms else None

    def _captures(self, text: str, visible: dict[str, Local]) -> tuple[list[Local], list[Local]]:
        """(the context's members, the integer constants declared again), in declaration order."""
        order = list(visible)
        need = {t for t in _IDENT.findall(text) if t not in _KEYWORDS}
        replicas: dict[str, Local] = {}
        members: dict[str, Local] = {}
        todo = [t for t in need if t in visible or t in self.params]
        while todo:
            name = todo.pop()
            if name in replicas or name in members:
                continue
            if name in visible:
                loc = visible[name]
                if loc.replica is not None:
                    replicas[name] = loc
                    todo += [t for t in _IDENT.findall(loc.replica.split("=", 1)[1])
                             if t in visible or t in self.params]
                    continue
                members[name] = loc
            else:
                members[name] = self._param(name)
        params = [members[n] for n in self.params if n in members and n not in visible]
        locals_ = [members[n] for n in order if n in members]
        return params + locals_, [replicas[n] for n in order if n in replicas]

    def _outline(self, heads: list[_Head], body: list[str], indent: str, visible: dict[str, Local],
                 loop_text: list[str], schedule: str, conds: list[list[str]], pre: Sequence[str] = ()) -> list[str]:
        k = len(self.functions)
        fn, ctx = f"{self.kernel}_par{k}", f"{self.kernel}_par{k}_ctx"
        members, replicas = self._captures("\n".join(loop_text), visible)
        faults = [f for f in self.faults if re.search(rf"\b{f}\b", "\n".join(loop_text))]
        members = [m for m in members if m.name not in faults]
        # The function: the context copied into locals, the constants declared again, the loop over [lo_, hi_).
        fields = [f"  {m.member};" for m in members] + [f"  int {f};" for f in faults]
        if not fields:
            fields = ["  char unused_;"]
        what = [schedule_clause(schedule)] + ([f"collapse({len(heads)})"] if len(heads) > 1 else [])
        what += [f"reduces {', '.join(faults)}"] if faults else []
        text = [f"/* {LOOP_COMMENT} {k} of {self.kernel} ({', '.join(what)}):",
                *[f" *   {h.text}" for h in heads[:-1]], f" *   {heads[-1].text} */",
                f"struct {ctx} {{", *fields, "};",
                f"OPFUSE_KERNEL {self.attributes}static void {fn}(void* arg_, long lo_, long hi_, int tid_) {{",
                f"  struct {ctx}* const c_ = (struct {ctx}*)arg_;",
                "  const int opfuse_tid = tid_;",
                "  (void)c_; (void)opfuse_tid;"]
        text += [f"  {m.copy}" for m in members]
        text += [f"  {r.replica}" for r in replicas]
        text += [f"  int {f} = 0;" for f in faults]
        base = len(indent)

        def rebase(ln: str) -> str:  # indented from the loop's head, one level into the function
            return "  " + ln[base:] if ln.startswith(indent) else ln
        inner = [rebase(ln) for ln in body]
        text += [rebase(ln) for ln in pre]
        if len(heads) == 1:
            h = heads[0]
            if h.start == "0" and h.step == 1:
                text.append(f"  for (long {h.var} = lo_; {h.var} < hi_; ++{h.var}) {{")
            else:
                step = f" * {h.step}" if h.step != 1 else ""
                inc = f"++{h.var}" if h.step == 1 else f"{h.var} += {h.step}"
                text.append(f"  for (long {h.var} = ({h.start}) + lo_{step}; {h.var} < ({h.start}) + hi_{step}; "
                            f"{inc}) {{")
        else:
            text.append("  for (long i_ = lo_; i_ < hi_; ++i_) {")
            rest = "i_"
            for i, h in reversed(list(enumerate(heads))):
                if i == 0:
                    idx = rest
                else:
                    text.append(f"    const long e{i}_ = {h.extent()};")
                    idx = f"{rest} % e{i}_"
                step = f" * {h.step}" if h.step != 1 else ""
                start = "" if h.start == "0" else f"({h.start}) + "
                text.append(f"    const long {h.var} = {start}({idx}){step};")
                rest = f"({rest} / e{i}_)" if i else rest
        text += inner
        text.append("  }")
        text += [f"  if ({f}) __atomic_fetch_or(&c_->{f}, {f}, __ATOMIC_RELAXED);" for f in faults]
        text.append("}")
        cond = self._condition(conds)
        if cond:
            text = [f"#if {cond}", *text, "#endif"]
        self.functions.append("\n".join(text) + "\n")
        # The call in the kernel.
        n = " * ".join(h.extent() for h in heads)
        inits = [m.init for m in members] + ["0"] * len(faults) or ["0"]
        sched = "OPFUSE_DYNAMIC" if schedule == "dynamic" else "OPFUSE_STATIC"
        call = [f"{indent}{{",
                f"{indent}  struct {ctx} c{k}_ = {{{', '.join(inits)}}};",
                f"{indent}  opfuse_parallel({fn}, &c{k}_, {n}, nt, {sched});"]
        call += [f"{indent}  {f} |= c{k}_.{f};" for f in faults]
        call.append(f"{indent}}}")
        return call


LOOP_COMMENT = "Parallel loop"
_LOOP_INFO = re.compile(rf"/\* {LOOP_COMMENT} \d+ of (\w+) \((.*)\):\n((?: \*   .*\n?)+)")


def schedule_clause(schedule: str) -> str:
    return DYNAMIC_CLAUSE if schedule == "dynamic" else STATIC_CLAUSE


@dataclass(frozen=True)
class LoopInfo:
    """A parallel loop as the comment above its function describes it (``parallel_loops``)."""

    kernel: str
    schedule: str          # "schedule(static)" or "schedule(dynamic, 1)"
    collapse: int
    reduces: tuple[str, ...]
    heads: tuple[str, ...]  # the loop heads as generated, "for (long i = 0; i < 96; ++i)"

    @property
    def bound(self) -> str:
        """The outermost loop's bound as written (a number, or an expression)."""
        return self.heads[0].split("<", 1)[1].split(";", 1)[0].strip()


def parallel_loops(source: str) -> list[LoopInfo]:
    """The parallel loops of a generated program, from the comments above their functions."""
    out = []
    for m in _LOOP_INFO.finditer(source):
        extra = m.group(2)
        collapse = re.search(r"collapse\((\d+)\)", extra)
        reduces = re.search(r"reduces ([\w, ]+)", extra)
        heads = tuple(ln.strip()[1:].strip().removesuffix("*/").strip() for ln in m.group(3).splitlines())
        out.append(LoopInfo(m.group(1), schedule_clause(_schedule(extra)), int(collapse.group(1)) if collapse else 1,
                            tuple(f.strip() for f in reduces.group(1).split(",")) if reduces else (), heads))
    return out


def strip(lines: list[str]) -> list[str]:
    """The kernel's lines without the loop markers (a program with no threads)."""
    return [ln for ln in lines if not ln.lstrip().startswith(PRAGMA)]
