"""Row maps (``codegen/rowmaps.py``): a nearest Resize upsampling by integer factors (``resize.nearest_factors``,
``CodegenOptions.row_maps``): the ops before the Resize computed once per input position, output rows
copied where the Resize is the stage's output, no index tables. Results against the reference and bit for bit
against the table form; the mappings that are not ``o // s`` keep the tables."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import assert_close
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.outline import parallel_loops
from opfuse.codegen.resize import nearest_factors
from opfuse.compiler import build_native, plan_model
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference

F32 = np.float32


def _chain(b, tag, shape, scales, *, ctm="asymmetric", nearest="floor", after=False, mode="nearest",
           both_outputs=False, dtype=F32):
    """x * s + x -> Resize (-> + z -> Relu with ``after``): one injective group, its Mul named ``m_<tag>``."""
    rank = len(shape)
    x = b.input(f"x_{tag}", shape, dtype=dtype)
    s = b.const(f"s_{tag}", np.arange(1, shape[-3] + 1, dtype=dtype).reshape((shape[-3], 1, 1)) if rank >= 3
                else np.array([3], dtype))
    y = b.op("Add", b.op("Mul", x, s, name=f"m_{tag}"), x)
    r = b.op("Resize", y, b.const(f"roi_{tag}", np.zeros(0, F32)), b.const(f"sc_{tag}", np.array(scales, F32)),
             mode=mode, coordinate_transformation_mode=ctm, nearest_mode=nearest, name=f"resize_{tag}")
    if not after:
        return [r]
    z = b.input(f"z_{tag}", tuple(int(n * f) for n, f in zip(shape, scales, strict=True)), dtype=dtype)
    return [b.op("Relu", b.op("Add", r, z)), *([r] if both_outputs else [])]


def upsample_graph(shape, scales, **kw):
    b = GraphBuilder("up")
    return b.build(*_chain(b, "a", shape, scales, **kw))


def _kernel(source: str, tag: str) -> str:
    """The C of the kernel whose group starts at ``m_<tag>``."""
    return next(part for part in source.split("/* group ")[1:] if part.startswith(f"g_m_{tag}:")).split(
        "int opfuse_run(")[0]


def _node(g):
    return next(n for n in g.nodes if n.op_type == "Resize")


def _builds(g, threads=1, **options):
    plan = plan_model(g)
    return {on: build_native(plan, threads=threads, codegen_options=CodegenOptions(row_maps=on, **options))
            for on in (True, False)}


def _parallel_as_planned(kernel: str, lead: int) -> bool:
    """The row-map loop nest split across threads (every kernel is, with ``parallel_min_work=1``): the leading
    axes' loop with the rows' under ``collapse(2)`` where it has fewer than ``parallel_min_outer`` iterations."""
    loops = parallel_loops(kernel)
    return len(loops) > 0 and (loops[0].collapse == 2) == (lead < CodegenOptions().parallel_min_outer)


CASES = {
    # shape, scales, coordinate mode, nearest mode
    "2x2-floor": ((2, 5, 7, 6), (1, 1, 2, 2), "asymmetric", "floor"),
    "4x4-floor": ((1, 3, 5, 9), (1, 1, 4, 4), "asymmetric", "floor"),
    "2x2-half-pixel": ((1, 4, 6, 5), (1, 1, 2, 2), "half_pixel", "round_prefer_floor"),
    "rows-only": ((1, 3, 5, 8), (1, 1, 2, 1), "asymmetric", "floor"),
    "columns-only": ((2, 3, 4, 7), (1, 1, 1, 2), "asymmetric", "floor"),
    "3x2": ((1, 2, 4, 5), (1, 1, 3, 2), "asymmetric", "floor"),
    "height-one": ((1, 3, 1, 5), (1, 1, 2, 2), "asymmetric", "floor"),
    "rank-3": ((6, 5, 4), (1, 2, 3), "asymmetric", "floor"),
    "rank-2": ((6, 5), (2, 3), "asymmetric", "floor"),
    "lead-16": ((1, 16, 3, 4), (1, 1, 2, 2), "asymmetric", "floor"),  # parallel_min_outer: no collapse
}


def test_upsampling_matches_reference_and_the_tables():
    """Every case twice (the Resize last, then ops after it), all in one graph: one kernel each."""
    b = GraphBuilder("ups")
    outs, tags = [], []
    for name, (shape, scales, ctm, nearest) in sorted(CASES.items()):
        for after in (False, True):
            tag = f"{name.replace('-', '_')}_{int(after)}"
            outs += _chain(b, tag, shape, scales, ctm=ctm, nearest=nearest, after=after)
            tags.append((tag, scales, after))
    g = b.build(*outs)
    for n in g.nodes:
        if n.op_type == "Resize":
            scales = CASES[next(k for k in CASES if n.name.startswith(f"resize_{k.replace('-', '_')}"))][1]
            assert nearest_factors(n) == tuple(int(f) for f in scales)
    feeds = reference.random_inputs(g, 0)
    want = reference.run(g, feeds)
    builds = _builds(g, threads=2, parallel_min_work=1)
    got = {on: m.run(feeds) for on, m in builds.items()}
    for k in want:
        assert_close({k: got[True][k]}, {k: want[k]})
        assert np.array_equal(got[True][k], got[False][k]), k
    assert builds[True].report["kernels"] == len(tags)
    for tag, scales, after in tags:
        fast, tables = _kernel(builds[True].program.source, tag), _kernel(builds[False].program.source, tag)
        assert "_idx" not in fast and "_idx" in tables, tag
        assert ("memcpy(" in fast) == (not after and scales[-2] > 1), tag
        shape = CASES[tag.rsplit("_", 1)[0].replace("_", "-")][0]
        assert _parallel_as_planned(fast, int(np.prod(shape[:-2]))), tag


def test_resize_as_a_second_output_and_integers():
    """The Resize's output stored as well as the ops after it (the general form), and an int32 chain."""
    for dtype in (F32, np.int32):
        g = upsample_graph((1, 3, 4, 5), (1, 1, 2, 2), after=True, both_outputs=True, dtype=dtype)
        feeds = reference.random_inputs(g, 1)
        want = reference.run(g, feeds)
        builds = _builds(g)
        got = {on: m.run(feeds) for on, m in builds.items()}
        for k in want:
            assert np.array_equal(got[True][k], want[k]), k
            assert np.array_equal(got[False][k], want[k]), k
        assert "_idx" not in _kernel(builds[True].program.source, "a")


@pytest.mark.parametrize("scales,ctm,nearest,mode", [
    ((1, 1, 4, 4), "asymmetric", "round_prefer_floor", "nearest"),   # o = 2 reads 1 (0.5 rounds up): runs shifted
    ((1, 1, 2, 2), "half_pixel", "floor", "nearest"),                # o = 0 reads -1 -> clamped, then 0 0 1 1 ... no
    ((1, 1, 0.5, 0.5), "asymmetric", "floor", "nearest"),            # downsampling
    ((1, 1, 1.5, 2), "asymmetric", "floor", "nearest"),              # a fraction
    ((1, 2, 2, 2), "asymmetric", "floor", "nearest"),                # channels upsampled too
    ((1, 1, 2, 2), "asymmetric", "floor", "linear"),                 # not nearest
])
def test_other_mappings_keep_the_tables(scales, ctm, nearest, mode):
    g = upsample_graph((1, 2, 6, 8), scales, ctm=ctm, nearest=nearest, mode=mode)
    f = nearest_factors(_node(g))
    if mode == "linear" or scales[1] != 1:
        assert f is None or any(s != 1 for s in f[:-2])
    else:
        assert f is None
    feeds = reference.random_inputs(g, 2)
    m = build_native(plan_model(g))
    assert_close(m.run(feeds), reference.run(g, feeds))
    src = _kernel(m.program.source, "a")
    assert "memcpy(" not in src and ("_idx" in src or "_lo" in src)


def test_half_pixel_floor_is_not_a_plain_division():
    """The half-pixel, floor mapping of a 2x upsampling reads 0 0 0 1 1 2 ... (clamped at the start): not
    ``o // 2``, so the fast form must not take it; with round_prefer_floor it is ``o // 2``."""
    g = upsample_graph((1, 1, 4, 4), (1, 1, 2, 2), ctm="half_pixel", nearest="floor")
    assert nearest_factors(_node(g)) is None
    g = upsample_graph((1, 1, 4, 4), (1, 1, 2, 2), ctm="half_pixel", nearest="round_prefer_floor")
    assert nearest_factors(_node(g)) == (1, 1, 2, 2)


def _dts_chain(b, tag, shape, block, mode, act):
    """DepthToSpace (-> ``act``) of a Mul by a per-channel constant: one injective group, named ``m_<tag>``."""
    x = b.input(f"x_{tag}", shape)
    y = b.op("Mul", x, b.const(f"s_{tag}", np.linspace(-1, 1, shape[1], dtype=F32).reshape(shape[1], 1, 1)),
             name=f"m_{tag}")
    y = b.op("DepthToSpace", y, blocksize=block, mode=mode, name=f"d2s_{tag}")
    return [b.op(act, y, name=f"a_{tag}")] if act else [y]


@pytest.mark.parametrize("threads", [1, 2])
def test_depth_to_space_reads_its_rows_in_blocks(threads):
    """DCR and CRD, blocks of 2 and 3, with an activation after and alone: the same values as the per-element
    map (bit for bit: DepthToSpace only moves them) and the reference; no ``%`` per element left."""
    b = GraphBuilder("d2s")
    outs, tags = [], []
    for shape, block in (((1, 8, 5, 7), 2), ((2, 18, 4, 3), 3)):
        for mode in ("DCR", "CRD"):
            for act in ("Relu", "Sigmoid", None):
                tag = f"{block}_{mode}_{act}"
                outs += _dts_chain(b, tag, shape, block, mode, act)
                tags.append(tag)
    g = b.build(*outs)
    feeds = reference.random_inputs(g, 3)
    want = reference.run(g, feeds)
    builds = _builds(g, threads=threads, parallel_min_work=1)
    got = {on: m.run(feeds) for on, m in builds.items()}
    for k in want:
        assert_close({k: got[True][k]}, {k: want[k]})
        assert np.array_equal(got[True][k], got[False][k]), k
    for tag in tags:
        fast, plain = _kernel(builds[True].program.source, tag), _kernel(builds[False].program.source, tag)
        block = int(tag.split("_")[0])
        assert re.search(rf"const long bi\d+ = oh\d+ % {block};", fast), tag  # the row map, not the plain loop
        n, c = next(shape for shape, b in ((((1, 8, 5, 7)), 2), (((2, 18, 4, 3)), 3)) if b == block)[:2]
        assert _parallel_as_planned(fast, n * c // (block * block)), tag
        # No division or remainder of the column variable (the row's block index once per row, the lead axes'
        # outside the inner loop); the per-element map divides every column.
        assert not re.search(r"iw\d+( \* \d+( \+ \d+)?)?\)* [%/]", fast), tag
        inner = re.findall(r"for \(long (\w+) = 0", plain)[-1]
        assert f"({inner} % " in plain and f"({inner} / " in plain, tag
