"""Names from the model never reach the C source raw: hostile names compile to safe code."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import assert_close, epilogue_plan, run_both
from opfuse.codegen.names import MAX_IDENT_CHARS, NameTable, c_ident
from opfuse.ops import GraphBuilder

HOSTILE = [
    'x"); system("rm -rf /"); //',
    "*/ int evil = 1; /*",
    "line\nbreak\\\n#include <stdio.h>",
    "123starts_with_digit",
    "ünïcödé-名前",
    "",
    "a-b",
    "a_b",
    "for",
    "x" * 300,
]


@pytest.mark.parametrize("name", HOSTILE)
def test_c_ident_is_a_plain_identifier(name):
    ident = c_ident(name, "v")
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident)
    assert len(ident) <= MAX_IDENT_CHARS + 2


def test_name_table_keeps_identifiers_unique():
    t = NameTable()
    idents = [t.fresh(n) for n in ("a-b", "a_b", "a b", "a-b")]
    assert len(set(idents)) == 4


def test_hostile_node_and_value_names_produce_safe_c(cache_dir):
    b = GraphBuilder('model"); system("id')
    x = b.input(HOSTILE[0], (1, 3, 4, 4))
    w = b.const(HOSTILE[1], np.ones((3, 3, 1, 1), np.float32))
    c = b.op("Conv", x, w, name=HOSTILE[2])
    r = b.op("Relu", c, name=HOSTILE[6])
    s = b.op("Sigmoid", r, name=HOSTILE[7])
    y = b.op("Add", s, x, name=HOSTILE[9])
    g = b.build(y)
    for plan in (None, epilogue_plan(g)):
        got, want, model = run_both(g, plan, cache_dir)
        assert_close(got, want)
        src = model.program.source + model.program.header()
        assert "system(" not in src and "evil" not in src and "#include <stdio.h>" not in src
        for name in HOSTILE[:3]:
            assert name not in src


@pytest.mark.parametrize(("name", "prefix", "want"), [
    ("conv1", "v", "v_conv1"),
    ("a/b..c d", "k3", "k3_a_b_c_d"),  # each run of other characters is one underscore
    ("__x__", "v", "v_x"),  # underscores at both ends dropped
    ("X_y_X", "v", "v_X_y_X"),
    ("yX", "v", "v_yX"),
    ("  x\t", "v", "v_x"),
    ("***", "v", "v"),  # nothing left: the prefix alone
    ("", "node", "node"),
    ("", "for", "for_"),  # a bare prefix that is a C keyword gets an underscore
    ("a" * 39 + "/b", "v", "v_" + "a" * 39),  # cut at MAX_IDENT_CHARS, then no trailing underscore
    ("b" * 50, "v", "v_" + "b" * MAX_IDENT_CHARS),
])
def test_c_ident_keeps_letters_digits_and_inner_underscores(name, prefix, want):
    assert c_ident(name, prefix) == want


def test_c_ident_and_name_table_default_to_the_v_prefix():
    assert c_ident("x") == "v_x"
    t = NameTable()
    assert [t.fresh("x"), t.fresh("x"), t.fresh("x", "k"), t.fresh("x"), t.fresh("x_1")] == [
        "v_x", "v_x_1", "k_x", "v_x_2", "v_x_1_1"]
