"""Mutation-run aid (not collected by pytest: its name does not start with ``test_``): each of
tests/codegen/test_ops.py's suites as one test that checks every case.

``tools/mutate_quick.py`` records which tests reach a mutated function in one unmutated run; test_ops.py builds
each suite once in a module-scoped fixture, so only the first case of a suite is seen to reach the code generator
and a mutant would be checked on that one case alone. Here each suite is built and compared whole, in one test.

    python tools/mutate_quick.py --tests tests/mutation/ops_suites_whole.py ... -- 'opfuse.codegen.pool.*'
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "codegen"))

import pytest  # noqa: E402
from cg_support import assert_close  # noqa: E402
from test_ops import SUITES  # noqa: E402

from opfuse.runtime import reference  # noqa: E402
from opfuse.runtime.native import build  # noqa: E402


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """As tests/codegen/conftest.py's (this folder has no conftest); mutate_quick.py gives its shared cache."""
    return tmp_path_factory.mktemp("opfuse-cache")


def _whole(name: str, cache_dir) -> None:
    s = SUITES[name]()
    g = s.graph()
    feeds = reference.random_inputs(g, 0)
    got, want = build(g, None, cache_dir=cache_dir).run(feeds), reference.run(g, feeds)
    assert_close(got, want)


def test_conv_suite(cache_dir):
    _whole("conv", cache_dir)


def test_pool_suite(cache_dir):
    _whole("pool", cache_dir)


def test_linalg_suite(cache_dir):
    _whole("linalg", cache_dir)


def test_reduce_suite(cache_dir):
    _whole("reduce", cache_dir)


def test_elementwise_suite(cache_dir):
    _whole("elementwise", cache_dir)


def test_movement_suite(cache_dir):
    _whole("movement", cache_dir)
