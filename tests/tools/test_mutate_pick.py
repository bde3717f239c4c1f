"""tools/mutate_pick.py: a mutant is kept where the first line it changes is one the change added (by text)."""
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import mutate_pick as mp  # noqa: E402

MUTATED = textwrap.dedent("""\
    def x_f__mutmut_orig(a):
        b = a + 1
        c = b * 2
        return c
    def x_f__mutmut_1(a):
        b = a - 1
        c = b * 2
        return c
    def x_f__mutmut_2(a):
        b = a + 1
        c = b / 2
        return c
    def x_f__mutmut_10(a):
        b = a + 1
        c = b * 2
        return None
    def x_g__mutmut_orig(a):
        return a
    """)


def test_keeps_the_mutants_of_added_lines_in_number_order():
    keep, total = mp.pick(MUTATED, "x_f", {"c = b * 2", "return c"})
    assert total == 3 and keep == ["x_f__mutmut_2", "x_f__mutmut_10"]
    assert mp.pick(MUTATED, "x_f", set()) == ([], 3)
    assert mp.pick(MUTATED, "x_f", {"b = a + 1"}) == (["x_f__mutmut_1"], 3)


def test_the_function_body_stops_at_the_next_function():
    assert mp.body(MUTATED, "x_f__mutmut_orig") == ["    b = a + 1", "    c = b * 2", "    return c"]
    assert mp.body(MUTATED, "x_g__mutmut_orig") == ["    return a"]
