"""C identifiers from IR names: the sanitiser.

Node and value names come from the model file and may hold anything (quotes, ``*/``,
newlines, ``"); system("...`). Generated C never contains a raw name: every identifier
and every comment that mentions a name goes through ``c_ident``, which keeps only
``[A-Za-z0-9_]``, so no name can close a string, a comment or a statement.
"""
from __future__ import annotations

import re

MAX_IDENT_CHARS = 40  # long enough to recognise a layer, short enough to keep lines readable
_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")
_C_KEYWORDS = frozenset("""auto break case char const continue default do double else enum extern float
for goto if inline int long register restrict return short signed sizeof static struct switch typedef
union unsigned void volatile while _Bool _Complex _Imaginary""".split())


def c_ident(name: str, prefix: str = "v") -> str:
    """A valid, harmless C identifier derived from ``name``: ``prefix`` + ``_`` + the name's
    letters, digits and underscores (runs of anything else become one ``_``), truncated.

    Uniqueness is not this function's job: callers prepend an index (``k12_conv1``).
    """
    body = _UNSAFE.sub("_", str(name)).strip("_")[:MAX_IDENT_CHARS].rstrip("_")
    ident = f"{prefix}_{body}" if body else prefix
    if ident in _C_KEYWORDS:  # only possible with an empty prefix
        ident = f"{ident}_"
    return ident


class NameTable:
    """Hands out unique C identifiers in call order, so generated code is deterministic."""

    def __init__(self):
        self._used: set[str] = set()

    def fresh(self, name: str, prefix: str = "v") -> str:
        base = c_ident(name, prefix)
        ident, n = base, 1
        while ident in self._used:
            ident = f"{base}_{n}"
            n += 1
        self._used.add(ident)
        return ident
