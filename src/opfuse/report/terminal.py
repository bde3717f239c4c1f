"""Text bound for a terminal: names from a model never reach it raw.

ONNX names are arbitrary strings, so a model can carry escape sequences (clear the screen,
recolour, rewrite the title), bidirectional overrides or newlines (forge output lines) in its
value and node names. The command line writes through ``safe_output()``:

* every name a loaded model holds that contains such characters (``remember_names``, called by
  ``opfuse.api.load``) is replaced by its escaped form wherever it appears, newlines included;
* any other control character left in the text (C0 but newline and tab, DEL, C1, bidi and
  zero-width format characters) is escaped as a Python escape: ``\\x1b``, ``\\u202e``.

``escape(text, newlines=True)`` also escapes newlines, for a message that must stay one line.
"""
from __future__ import annotations

import contextlib
import re
import sys
from typing import Iterator, TextIO

_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2069\ufeff"
_CONTROL = re.compile(f"[{_UNSAFE}]")
_CONTROL_OR_NEWLINE = re.compile(f"[{_UNSAFE}\n\t]")
_names: dict[str, str] = {}  # raw name -> escaped, for names with unsafe characters


def _escape_char(m: re.Match) -> str:
    return m.group(0).encode("unicode_escape").decode("ascii")


def escape(text: str, *, newlines: bool = False) -> str:
    """``text`` with control characters written as escapes (newline and tab too if ``newlines``)."""
    return (_CONTROL_OR_NEWLINE if newlines else _CONTROL).sub(_escape_char, text)


def remember_names(graph) -> None:
    """Note the value and node names of ``graph`` that would be unsafe on a terminal."""
    for name in [*graph.values, *(n.name for n in graph.nodes), graph.name or ""]:
        if _CONTROL_OR_NEWLINE.search(name):
            _names[name] = escape(name, newlines=True)


def escape_names(text: str) -> str:
    """``text`` with every remembered unsafe name escaped (longest first), then other controls."""
    for raw in sorted(_names, key=len, reverse=True):
        if raw in text:
            text = text.replace(raw, _names[raw])
    return escape(text)


class SafeStream:
    """A text stream that escapes what it writes (``escape_names``) and passes everything else on."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(escape_names(text))
        return len(text)

    def __getattr__(self, name):  # flush, fileno, isatty, encoding, ...
        return getattr(self._stream, name)


@contextlib.contextmanager
def safe_output() -> Iterator[None]:
    """Route ``sys.stdout`` and ``sys.stderr`` through ``SafeStream`` for the duration."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(out), SafeStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
