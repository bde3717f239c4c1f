"""The native runtime: running, input checks, threads, outputs that are not computed,
the report and C export."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from cg_support import assert_close, epilogue_plan
from opfuse.errors import InputError, OpfuseError
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import CompiledModel, build
from opfuse.runtime.toolchain import Toolchain


def _small():
    rng = np.random.default_rng(3)
    b = GraphBuilder("small")
    x = b.input("image", (1, 3, 12, 12))
    c = b.op("Conv", x, b.const("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)), pads=[1, 1, 1, 1])
    r = b.op("Relu", c)
    p = b.op("GlobalAveragePool", r)
    f = b.op("Flatten", p)
    y = b.op("Gemm", f, b.const("fc", rng.standard_normal((5, 8)).astype(np.float32)), transB=1)
    return b.build(b.op("Softmax", y))


@pytest.fixture(scope="module")
def model(cache_dir):
    g = _small()
    return build(g, epilogue_plan(g), cache_dir=cache_dir)


def test_run_matches_reference_and_is_repeatable(model):
    feeds = reference.random_inputs(model.graph, 1)
    want = reference.run(model.graph, feeds)
    first = model.run(feeds)
    assert_close(first, want)
    again = model(feeds)
    assert np.array_equal(first["softmax"], again["softmax"])
    assert first["softmax"] is not again["softmax"]  # fresh output arrays every call


def test_missing_input_is_named(model):
    with pytest.raises(InputError, match="image"):
        model.run({})


def test_wrong_shape_is_named(model):
    with pytest.raises(InputError, match="image.*shape"):
        model.run({"image": np.zeros((1, 3, 12, 13), np.float32)})


def test_wrong_dtype_is_named(model):
    with pytest.raises(InputError, match="image.*dtype"):
        model.run({"image": np.zeros((1, 3, 12, 12), np.complex64)})


def test_unknown_input_is_named(model):
    feeds = reference.random_inputs(model.graph, 0)
    feeds["extra"] = np.zeros(1, np.float32)
    with pytest.raises(InputError, match="extra"):
        model.run(feeds)


@pytest.mark.parametrize("feeds,needle", [(None, "not NoneType"), ("image", "not str"),
                                          ([("image", np.zeros((1, 3, 12, 12), np.float32))], "not list")])
def test_inputs_that_are_not_a_mapping(model, feeds, needle):
    """``run(None)`` was a TypeError, a list of pairs an AttributeError, a string its letters as unknown inputs."""
    for run in (model.run, lambda f: reference.run(model.graph, f)):
        with pytest.raises(InputError, match=f"mapping from input names to arrays.*{needle}"):
            run(feeds)


@pytest.mark.parametrize("value,needle", [(None, "is a NoneType"), ("text", r"is text \(<U4\)"),
                                          ({"a": 1}, "is a dict"), (np.array([None] * 3), "is an object array")])
def test_an_input_that_is_not_numbers_is_named(model, value, needle):
    """``np.asarray`` takes anything: None, a dict or a string became a 0-d object or text array, reported as
    a shape mismatch."""
    with pytest.raises(InputError, match=f"input 'image' {needle}, not an array of numbers"):
        model.run({"image": value})


def test_non_contiguous_inputs_are_accepted_and_other_dtypes_only_with_cast(model):
    feeds = reference.random_inputs(model.graph, 2)
    want = reference.run(model.graph, feeds)
    x = feeds["image"]
    strided = np.empty((1, 3, 12, 24), np.float32)[..., ::2]
    strided[...] = x
    assert_close(model.run({"image": strided}), want)
    as_f64 = np.empty((1, 3, 12, 24), np.float64)[..., ::2]
    as_f64[...] = x
    with pytest.raises(InputError, match="image.*float64.*float32.*cast"):
        model.run({"image": as_f64})
    assert_close(model.run({"image": as_f64}, cast=True), want)
    with pytest.raises(InputError, match="image.*1e\\+39.*does not fit.*float32"):
        model.run({"image": np.full(as_f64.shape, 1e39)}, cast=True)


class _Feeds(dict):
    """A Mapping that is not a plain dict."""


@pytest.mark.parametrize("variant", ["read_only", "dict_subclass", "big_endian", "list_of_lists", "array_subclass",
                                     "fortran_order"])
def test_inputs_bound_without_a_copy_and_every_other_kind_give_the_same_outputs(model, variant):
    """run() binds plain contiguous arrays of the model's dtype by pointer and sends everything
    else through check_inputs; both paths compute the same thing."""
    feeds = reference.random_inputs(model.graph, 5)
    x = feeds["image"]
    want = model.run(feeds)["softmax"]
    assert_close({"softmax": want}, reference.run(model.graph, feeds))
    if variant == "read_only":
        given = x.copy()
        given.flags.writeable = False
    elif variant == "big_endian":
        given = x.astype(">f4")
    elif variant == "list_of_lists":
        given = x.tolist()
    elif variant == "array_subclass":
        given = x.view(np.recarray)
    elif variant == "fortran_order":
        given = np.asfortranarray(x)
    else:
        given = x
    given_feeds = _Feeds(image=given) if variant == "dict_subclass" else {"image": given}
    got = model.run(given_feeds, cast=variant == "list_of_lists")["softmax"]  # a list reads as float64
    assert np.array_equal(got, want)
    assert np.array_equal(np.asarray(given, np.float32), x)  # the caller's input is untouched
    bound = model._binding.exact_inputs(given_feeds)
    if variant in ("read_only", "dict_subclass"):
        assert bound is not None and bound[0] is given  # bound by pointer, no copy
    else:
        assert bound is None  # converted by check_inputs first


def test_outputs_of_earlier_calls_are_not_overwritten(model):
    a, b = (reference.random_inputs(model.graph, s) for s in (6, 7))
    first = model.run(a)["softmax"]
    kept = first.copy()
    second = model.run(b)["softmax"]
    assert np.array_equal(first, kept) and not np.array_equal(first, second)


def test_prepared_calls_and_runs_interleave(model):
    """prepared() and run() fill the same pointer tables; each call points them at its own arrays."""
    a, b = (reference.random_inputs(model.graph, s) for s in (8, 9))
    call, outs = model.prepared(a)
    want_a = model.run(a)["softmax"]
    want_b = model.run(b)["softmax"]
    outs["softmax"][...] = 0
    call()
    assert np.array_equal(outs["softmax"], want_a)
    assert np.array_equal(model.run(b)["softmax"], want_b)


def test_a_right_shape_under_a_wrong_name_is_refused(model):
    x = reference.random_inputs(model.graph, 0)["image"]
    with pytest.raises(InputError, match="unknown input.*imag"):
        model.run({"imag": x})
    with pytest.raises(InputError, match="image.*dtype"):
        model.run({"image": x.astype(np.float64)})
    with pytest.raises(InputError, match="image.*shape"):
        model.run({"image": x[..., :-1]})


def test_threads_do_not_change_results(model):
    feeds = reference.random_inputs(model.graph, 4)
    model.threads = 1
    one = model.run(feeds)["softmax"]
    model.threads = 2
    two = model.run(feeds)["softmax"]
    model.threads = 1
    assert np.array_equal(one, two)
    with pytest.raises(OpfuseError):
        model.threads = 0


def test_fewer_threads_keep_the_scratch(model):
    """The per-thread scratch only grows: back to fewer threads, the buffer (its pages already
    faulted in) stays, so a benchmark switching between 1 and 2 threads times no page faults."""
    stride = model.program.scratch_stride
    model.threads = 2
    two = model._scratch
    assert len(two) >= 2 * stride
    model.threads = 1
    assert model._scratch is two and model._scratch_at == two.ctypes.data
    model.threads = 3
    assert len(model._scratch) >= 3 * stride and model._scratch_at == model._scratch.ctypes.data
    model.threads = 1


def test_multithreaded_big_kernels_are_bitwise_equal(cache_dir):
    rng = np.random.default_rng(0)
    b = GraphBuilder("big")
    x = b.input("x", (1, 32, 40, 40))
    c = b.op("Conv", x, b.const("w", rng.standard_normal((64, 32, 3, 3)).astype(np.float32)), pads=[1, 1, 1, 1])
    g = b.build(b.op("Softmax", b.op("Relu", c), axis=1))
    feeds = reference.random_inputs(g, 0)
    m1 = build(g, epilogue_plan(g), cache_dir=cache_dir, threads=1)
    m2 = build(g, epilogue_plan(g), cache_dir=cache_dir, threads=2)
    out1, out2 = m1.run(feeds), m2.run(feeds)
    assert all(np.array_equal(out1[k], out2[k]) for k in out1)
    assert_close(out1, reference.run(g, feeds))


def test_large_buffers_lie_at_huge_page_boundaries_small_ones_on_ordinary_pages(monkeypatch):
    import mmap

    from opfuse.runtime import native
    big, small = native._aligned(native.HUGE_PAGE_MIN_BYTES + 5), native._aligned(1000)
    for a, n in ((big, native.HUGE_PAGE_MIN_BYTES + 5), (small, 1000)):
        assert a.size == n and a.flags.writeable and not a.any() and a.ctypes.data % native.BUFFER_ALIGNMENT == 0
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert big.ctypes.data % native.HUGE_PAGE_BYTES == 0
    big[:] = 7  # the whole buffer is ours to write
    assert int(big[-1]) == 7 and int(big[0]) == 7
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)  # a platform without the advice
    plain = native._aligned(native.HUGE_PAGE_MIN_BYTES)
    assert plain.size == native.HUGE_PAGE_MIN_BYTES and not plain.any()
    assert plain.ctypes.data % native.BUFFER_ALIGNMENT == 0


def test_a_model_on_huge_page_buffers_gives_the_same_bits(cache_dir, monkeypatch):
    from opfuse.runtime import native
    rng = np.random.default_rng(1)
    b = GraphBuilder("huge")
    x = b.input("x", (1, 64, 72, 72))  # the tensor between the Convs (1.3 MB) lies in an arena over the threshold
    for k in range(2):
        w = b.const(f"w{k}", (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32))
        x = b.op("Relu", b.op("Conv", x, w, pads=[1, 1, 1, 1]))
    g = b.build(x)
    feeds = reference.random_inputs(g, 0)
    m1 = build(g, epilogue_plan(g), cache_dir=cache_dir, threads=1)
    buffers = (m1._arena, m1._weights, m1._scratch)
    assert any(a.size >= native.HUGE_PAGE_MIN_BYTES for a in buffers)
    if hasattr(__import__("mmap"), "MADV_HUGEPAGE"):
        assert all(a.ctypes.data % native.HUGE_PAGE_BYTES == 0 for a in buffers if a.size >= native.HUGE_PAGE_MIN_BYTES)
    monkeypatch.setattr(native, "HUGE_PAGE_MIN_BYTES", 1 << 62)  # every buffer on ordinary pages
    m2 = build(g, epilogue_plan(g), cache_dir=cache_dir, threads=1)
    out1, out2 = m1.run(feeds), m2.run(feeds)
    assert all(np.array_equal(out1[k], out2[k]) for k in out1)
    assert_close(out1, reference.run(g, feeds))


def test_outputs_no_kernel_writes(cache_dir):
    """A graph input returned as is, a constant output, the same value twice."""
    b = GraphBuilder("passthrough")
    x = b.input("x", (2, 3))
    r = b.op("Relu", x)
    k = b.const("k", np.arange(4, dtype=np.float32))
    g = b.build(r, x, k, r)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 3}
    got = build(g, None, cache_dir=cache_dir).run(feeds)
    assert np.array_equal(got["x"], feeds["x"]) and got["x"] is not feeds["x"]
    assert np.array_equal(got["k"], np.arange(4, dtype=np.float32))
    assert np.array_equal(got["relu"], np.maximum(feeds["x"], 0))


def test_report_has_the_documented_keys(model):
    r = model.report
    for key in ("kernels", "functions", "c_kernels", "arena_bytes", "arena_lower_bound_bytes", "arena_ratio",
                "weights_bytes", "scratch_bytes_per_thread", "threads", "compiler", "flags", "cache_hit",
                "build_seconds", "inplace", "views", "concat_aliases"):
        assert key in r, key
    assert r["kernels"] == len(model.plan.groups)
    assert r["arena_bytes"] >= r["arena_lower_bound_bytes"] > 0


def test_export_c_writes_a_standalone_translation_unit(model, tmp_path):
    files = model.export_c(tmp_path / "out")
    names = sorted(f.name for f in files)
    assert names == ["model.c", "model.h", "report.json", "weights.bin"]
    assert (tmp_path / "out" / "weights.bin").stat().st_size == model.report["weights_bytes"]
    tc = Toolchain.detect()
    # The exported source compiles on its own (as an object file, no opfuse needed).
    subprocess.run([tc.cc, "-std=c99", "-O1", "-c", "-fopenmp", "-o", str(tmp_path / "m.o"),
                    str(tmp_path / "out" / "model.c")], check=True, capture_output=True)


def test_embedded_weights_need_no_blob(cache_dir):
    from opfuse.codegen import CodegenOptions
    g = _small()
    feeds = reference.random_inputs(g, 5)
    m = build(g, None, cache_dir=cache_dir, options=CodegenOptions(weights="embed"))
    assert "opfuse_weights_data" in m.program.source
    m._weights[:] = 0  # the blob passed at run time is ignored
    assert_close(m.run(feeds), reference.run(g, feeds))


def test_compiled_model_alias():
    from opfuse.runtime.native import NativeModule
    assert NativeModule is CompiledModel


def test_profile_reports_every_kernel(cache_dir):
    from opfuse.codegen import CodegenOptions
    g = _small()
    m = build(g, epilogue_plan(g), cache_dir=cache_dir, options=CodegenOptions(profile=True))
    rows = m.profile(reference.random_inputs(g, 0), repeat=3)
    assert len(rows) == m.report["functions"]
    assert all(r["ms"] >= 0 for r in rows)
    with pytest.raises(OpfuseError, match="profil"):
        build(g, None, cache_dir=cache_dir).profile({}, 1)


def test_profile_on_the_thread_cpu_clock(cache_dir):
    """``profile_clock="thread_cpu"``: the timers read the calling thread's CPU clock, so at one
    thread the kernels' times add up to at most the CPU time the thread spent in the runs."""
    import time
    from opfuse.codegen import CodegenOptions, generate
    g = _small()
    opts = CodegenOptions(profile=True, profile_clock="thread_cpu")
    from opfuse.codegen.threadpool import POOL_C  # the pool's own spin clock is CLOCK_MONOTONIC
    src = generate(g, epilogue_plan(g), options=opts).source.replace(POOL_C, "")
    assert "CLOCK_THREAD_CPUTIME_ID" in src and "CLOCK_MONOTONIC" not in src
    assert "CLOCK_MONOTONIC" in generate(g, epilogue_plan(g), options=CodegenOptions(profile=True)).source.replace(
        POOL_C, "")
    m = build(g, epilogue_plan(g), cache_dir=cache_dir, options=opts, threads=1)
    feeds = reference.random_inputs(g, 0)
    t0 = time.thread_time()
    rows = m.profile(feeds, repeat=5)
    spent_ms = (time.thread_time() - t0) * 1e3 / 5
    assert len(rows) == m.report["functions"] and all(r["ms"] >= 0 for r in rows)
    assert sum(r["ms"] for r in rows) <= spent_ms
    with pytest.raises(OpfuseError, match="profile clock"):
        CodegenOptions(profile_clock="tsc")


def test_bad_codegen_options_are_user_errors():
    from opfuse.codegen import CodegenOptions
    with pytest.raises(OpfuseError, match="layout"):
        CodegenOptions(layout="NHWC")
    with pytest.raises(OpfuseError, match="weights"):
        CodegenOptions(weights="flash")
