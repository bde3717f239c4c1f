"""tools/mutate_cover.py's map from a mutant to the statement it mutates (what ``mutate_lines.py`` runs each mutant
against the tests covering), on a small module mutated the way mutmut writes its copies: a mutation of a
continuation line counts as its statement's first line, a repeated line by occurrence, a compound statement's
header as its own line."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import mutate_cover as mc  # noqa: E402

SOURCE = textwrap.dedent('''\
    def f(a, b):
        x = (a +
             b)
        if a > b:
            w.line("c")
        w.line("c")
        return x
''')


def _mutated(bodies: dict[str, str]) -> str:
    """A mutmut-like file: ``x_f__mutmut_orig`` and one copy of f per mutant."""
    out = []
    for name, body in bodies.items():
        out.append(f"def x_f__mutmut_{name}(a, b):\n{textwrap.indent(body, '    ')}")
    return "\n".join(out)


def test_statement_lines_of_mutants(tmp_path):
    orig = SOURCE.split("\n", 1)[1]
    body = textwrap.dedent(orig)
    mutants = {
        "orig": body,
        "1": body.replace("b)", "None)"),                        # continuation line 3 -> statement line 2
        "2": body.replace("if a > b:", "if a >= b:"),           # a header: its own line 4
        "3": body.replace('w.line("c")', 'w.line("XXcXX")', 1),  # the first of two equal lines: 5
        "4": body[::-1].replace('w.line("c")'[::-1], 'w.line("XXcXX")'[::-1], 1)[::-1],  # the second: 6
        "5": body.replace("return x", "return None"),            # 7
    }
    src, mutated = tmp_path / "m.py", tmp_path / "mutated.py"
    src.write_text(SOURCE)
    mutated.write_text(_mutated(mutants))
    got = mc.statement_lines(src, mutated)
    assert got == {"x_f__mutmut_1": 2, "x_f__mutmut_2": 4, "x_f__mutmut_3": 5, "x_f__mutmut_4": 6,
                   "x_f__mutmut_5": 7}
