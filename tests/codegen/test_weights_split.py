"""A GEMM that streams a layer's weights once per tile splits them between the threads (``gemm.weights_split``,
``CodegenOptions.gemm_split_weights_bytes``): a 1x1 convolution 512 -> 512 at 14x14 (1 MB of weights, tiles of a
few positions, each spanning all 512 channels) runs, on more than one thread, the channels in two halves, one per
thread (static schedule, channels outermost), and on one thread the tiles it always had. The split is decided at
run time, says so in the kernel's notes, and changes no bit of the results; below the size, on the
microcontroller, where the tiles already cut the channels or where there are too few tiles, nothing changes."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, assert_threshold_inclusive, pointwise_relu, run_both
from opfuse.codegen import CodegenOptions
from opfuse.codegen.options import CORTEX_M7
from opfuse.codegen.program import generate

rng = np.random.default_rng(11)
SPLIT = "parts of"  # the kernel note's words


def pointwise(c: int, oc: int, hw: int):
    return pointwise_relu(c, oc, hw, rng, "split")


def _kernel(program):
    (info,) = [k for k in program.kernels if k.function]
    return info


def _split_notes(program) -> list[str]:
    return [n for n in _kernel(program).notes if SPLIT in n]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_layer_with_a_megabyte_of_weights_splits_them_per_thread(isa):
    g, plan = pointwise(512, 512, 14)
    program = generate(g, plan, options=CodegenOptions(vector_isa=isa))
    (note,) = _split_notes(program)
    assert "its 512 columns in 2 parts of 256, one per thread" in note
    (loop,) = _kernel(program).parallel
    assert loop.schedule == "static" and loop.work == 2 * 196 * 512 * 512
    assert "(nt > 1 ? " in program.source
    off = generate(g, plan, options=CodegenOptions(vector_isa=isa, gemm_split_weights_bytes=0))
    assert not _split_notes(off) and "(nt > 1 ? " not in off.source
    (before,) = _kernel(off).parallel
    # the split's tiles are the one-thread tiles, each cut in two halves of the channels
    assert loop.iterations == 2 * before.iterations


def test_the_size_is_inclusive():
    g, plan = pointwise(256, 512, 14)  # 256 x 512 floats: 512 KB of weights
    assert_threshold_inclusive(_split_notes, g, plan, "gemm_split_weights_bytes", 256 * 512 * 4)


def test_nothing_is_split_where_it_does_not_apply():
    # 7x7: the 49 positions are one row of tiles, so the channels are already cut into tiles
    g, plan = pointwise(512, 1024, 7)
    assert not _split_notes(generate(g, plan))
    # few channels: 64 x 64 floats of weights, far below the size
    g, plan = pointwise(64, 64, 28)
    assert not _split_notes(generate(g, plan))
    # the microcontroller never splits a loop, and its C has no run-time thread count in a loop head
    g, plan = pointwise(512, 512, 14)
    m7 = generate(g, plan, options=CORTEX_M7)
    assert not _split_notes(m7) and "(nt > 1 ? " not in m7.source
    # no balancing for threads: nothing to split for
    assert not _split_notes(generate(g, plan, options=CodegenOptions(balance_threads=())))


def test_the_option_is_checked():
    from opfuse.errors import OpfuseError
    with pytest.raises(OpfuseError, match="gemm_split_weights_bytes"):
        CodegenOptions(gemm_split_weights_bytes=-1)


def test_results_do_not_change_with_the_threads_or_the_split(cache_dir):
    """1, 2 and 3 threads with the split (at 3, two halves over three threads: the static ranges cross the
    halves) and 2 without give the same bits, close to the reference."""
    g, plan = pointwise(512, 512, 14)
    one, want, model = run_both(g, plan, cache_dir, threads=1)
    assert_close(one, want)
    assert _split_notes(model.program)
    runs = [run_both(g, plan, cache_dir, threads=n)[0] for n in (2, 3)]
    runs.append(run_both(g, plan, cache_dir, threads=2, options=CodegenOptions(gemm_split_weights_bytes=0))[0])
    for got in runs:
        assert all(np.array_equal(one[k], got[k]) for k in one)


def _problem(M: int = 196, N: int = 512, K: int = 512, nb: int = 1, a_static: bool = False):
    """The GEMM as ``weights_split`` sees it: positions (A, packed per tile) x channels (B, the weights)."""
    from opfuse.codegen.gemm import GemmProblem, Operand
    a = Operand(lambda ev, b, m, k: "0", static=np.zeros((nb, M, K), np.float32) if a_static else None)
    b = Operand(lambda ev, b, k, n: "0", static=np.zeros((nb, K, N), np.float32))
    return GemmProblem("pw", nb, M, N, K, a, b, None, None)  # type: ignore[arg-type]


def test_each_condition_of_the_split_at_its_limit():
    """``weights_split`` directly: every condition alone refuses, each numeric one at its limit."""
    from opfuse.codegen.gemm import weights_split
    o = CodegenOptions()

    def split(p=None, o=o, MT=14, NT=1, stores=True, packed_b=True):
        return weights_split(p or _problem(), o, 32, MT, NT, stores, packed_b)

    assert split() == 2
    assert split(stores=False) == 0 and split(packed_b=False) == 0  # a C tile finished at N's width; B packed
    assert split(_problem(a_static=True)) == 0 and split(_problem(nb=2)) == 0
    assert split(NT=2) == 0  # the tiles already cut N
    assert split(MT=4) == 2 and split(MT=3) == 0  # at least one row tile per thread and part, twice
    assert split(_problem(N=576)) == 2 and split(_problem(N=544)) == 0  # whole NR panels in each part
    assert split(o=o.with_(balance_threads=())) == 0 and split(o=o.with_(balance_threads=(1,))) == 0
    assert split(o=o.with_(balance_threads=(1, 2))) == 2 and split(o=o.with_(balance_threads=(2, 4))) == 4
    work = 2 * 196 * 512 * 512
    assert split(o=o.with_(parallel_min_work=work)) == 2 and split(o=o.with_(parallel_min_work=work + 1)) == 0
    assert split(o=o.with_(gemm_split_weights_bytes=0)) == 0
