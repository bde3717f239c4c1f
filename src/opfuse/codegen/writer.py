"""``CWriter``: accumulates C lines with indentation; ``block`` opens and closes braces."""
from __future__ import annotations

from contextlib import contextmanager

INDENT = "  "


class CWriter:
    def __init__(self, indent: int = 0):
        self.lines: list[str] = []
        self.level = indent

    def line(self, text: str = "") -> None:
        self.lines.append(INDENT * self.level + text if text else "")

    def lines_from(self, text: str) -> None:
        for ln in text.splitlines():
            self.line(ln)

    @contextmanager
    def block(self, head: str):
        """``head {`` ... ``}``; ``head`` may be empty for a bare scope."""
        self.line(f"{head} {{" if head else "{")
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1
            self.line("}")

    @contextmanager
    def indented(self):
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
