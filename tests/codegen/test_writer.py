"""``CWriter``: lines at the current indentation (two spaces a level), braces from ``block``, the level restored
when a block's body raises. No compiler."""
from __future__ import annotations

import pytest

from opfuse.codegen.writer import CWriter


def test_blocks_nest_and_close_with_two_spaces_a_level():
    w = CWriter()
    w.line("int f(void)")
    with w.block(""):
        w.line("int s = 0;")
        with w.block("for (int i = 0; i < 4; ++i)"):
            w.line("s += i;")
        w.line()
        w.line("return s;")
    assert w.text() == ("int f(void)\n"
                        "{\n"
                        "  int s = 0;\n"
                        "  for (int i = 0; i < 4; ++i) {\n"
                        "    s += i;\n"
                        "  }\n"
                        "\n"  # an empty line carries no indentation
                        "  return s;\n"
                        "}\n")
    assert w.level == 0


def test_a_writer_can_start_indented_and_indent_without_braces():
    w = CWriter(indent=2)
    w.line("a;")
    with w.indented():
        w.line("b;")
    w.line("c;")
    assert w.lines == ["    a;", "      b;", "    c;"]
    assert CWriter().level == 0


def test_lines_from_indents_every_line_of_a_text():
    w = CWriter(1)
    w.lines_from("x = 1;\ny = 2;\n\nz = 3;")
    assert w.lines == ["  x = 1;", "  y = 2;", "", "  z = 3;"]
    assert w.text() == "  x = 1;\n  y = 2;\n\n  z = 3;\n"


def test_the_level_comes_back_when_a_body_raises():
    w = CWriter()
    for context in (w.block("if (x)"), w.indented()):
        with pytest.raises(ValueError):
            with context:
                raise ValueError
        assert w.level == 0
    assert w.lines == ["if (x) {", "}"]
    w.line("after;")
    assert w.lines[-1] == "after;"


def test_an_empty_writer_is_one_newline():
    assert CWriter().text() == "\n"
