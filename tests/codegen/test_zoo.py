"""Every zoo model through the C backend, unfused and fused, against the reference.

Each model is imported, run by the reference and compiled once per plan per session.
The two 224x224 models take a few seconds each and are marked slow.
"""
from __future__ import annotations

import functools

import pytest

from cg_support import assert_close, fused_plan
from opfuse.runtime import reference
from opfuse.runtime.native import build

from opfuse import zoo

HEAVY = {"mobilenet_v1", "resnet18"}
MODELS = [pytest.param(m, marks=pytest.mark.slow) if m in HEAVY else m for m in zoo.list_models()]


@functools.lru_cache(maxsize=None)
def _model(name):
    g = zoo.load(name)
    feeds = reference.random_inputs(g, 0)
    return g, feeds, reference.run(g, feeds)


@pytest.mark.parametrize("name", MODELS)
def test_zoo_unfused_matches_reference(name, cache_dir):
    g, feeds, want = _model(name)
    model = build(g, None, cache_dir=cache_dir)
    assert_close(model.run(feeds), want)
    assert model.report["kernels"] == len(g.nodes)
    assert model.memory.conflicts() == []


@pytest.mark.parametrize("name", MODELS)
def test_zoo_fused_matches_reference(name, cache_dir):
    g, feeds, want = _model(name)
    plan = fused_plan(name, g)
    model = build(g, plan, cache_dir=cache_dir)
    assert_close(model.run(feeds), want)
    assert model.report["kernels"] == len(plan.groups) < len(g.nodes)
    assert model.memory.conflicts() == []
    assert 0 < model.report["arena_lower_bound_bytes"] <= model.report["arena_bytes"]


@pytest.mark.parametrize("name", MODELS)
def test_zoo_with_the_fusion_pipeline(name, cache_dir):
    """The rules' candidate plan (``opfuse.passes.fuse``), built and run in C."""
    from opfuse.passes import fuse
    g0, feeds, want = _model(name)
    g, plan, _ = fuse(g0)
    model = build(g, plan, cache_dir=cache_dir)
    assert_close(model.run(feeds), want)


@pytest.mark.parametrize("name", [m for m in zoo.list_models() if m not in HEAVY])
def test_zoo_fused_with_the_size_thresholds_lowered(name, cache_dir):
    """The fuzzer's ``thresholds`` code-generation profile (``fuzz_check.CODEGEN_PROFILES``) on the zoo models
    that take seconds: the kernels large tensors get (Winograd on every 3x3 convolution, streaming stores, K
    blocks of 16, many GEMM tiles, parallel loops everywhere, staged and attention blocks) on real layer shapes,
    at 2 threads."""
    from opfuse.testing.fuzz_check import codegen_options
    g, feeds, want = _model(name)
    model = build(g, fused_plan(name, g), cache_dir=cache_dir, options=codegen_options("thresholds"), threads=2)
    assert_close(model.run(feeds), want)
