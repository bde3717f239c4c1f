"""Explicit-SIMD elementwise chains (``codegen/simdchain.py``, ``CodegenOptions.simd_elementwise``) and their
streaming stores (``stream_store_min_bytes``): bitwise the C loop's results (gcc's vectorised plain C, the same
build with ``simd_elementwise=False``) with the AVX-512 and the AVX2 bodies, over special values and, for the
exp-based ops, a sweep of float32 bit patterns; NaN and -0 kept; 2 threads as 1; against the reference; the
stages it refuses, with their reasons; the plain C99 build without intrinsics."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, assert_relu_keeps_nan_and_negative_zero
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen import simdchain
from opfuse.errors import OpfuseError
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

AVX512 = CodegenOptions(vector_isa="avx512")
AVX2 = CodegenOptions(vector_isa="avx2")
PORTABLE = CodegenOptions(simd="none")
# the C loops gcc vectorises; with Gelu (erf) by the table polynomial its vector forms use (by default those loops
# take the erf form, which gcc vectorises: ``CodegenOptions.scalar_gelu_table``)
GCC = CodegenOptions(simd_elementwise=False, scalar_gelu_table=True)
STREAM = CodegenOptions(vector_isa="avx512", stream_store_min_bytes=0)
STREAM_AVX2 = CodegenOptions(vector_isa="avx2", stream_store_min_bytes=0)
VECTOR_BUILDS = {"avx512": AVX512, "avx2": AVX2, "stream": STREAM, "stream_avx2": STREAM_AVX2}
SPECIAL = np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1e-40, -1e-40, 1e-45, -1e-45, 3.4e38, -3.4e38,
                    88.5, 89.5, -87.5, -103.5, -104.5, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 6.0], np.float32)
SWEEP_STRIDE = 4099


def _values(n: int, seed: int = 0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(n) * 4).astype(np.float32)
    x[:len(SPECIAL)] = SPECIAL
    x[-len(SPECIAL):] = SPECIAL  # in the scalar remainder too
    return x


def _sweep() -> np.ndarray:
    """Every SWEEP_STRIDE-th float32 bit pattern of both signs (NaNs and infinities included)."""
    bits = np.arange(0, 1 << 31, SWEEP_STRIDE, dtype=np.uint32)
    return np.concatenate([bits, bits | np.uint32(1 << 31)]).view(np.float32)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, except that a NaN may be any NaN (which NaN operand x86 returns is the order of the
    operands, which the C leaves to the compiler)."""
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


def _one_kernel(g) -> FusionPlan:
    return FusionPlan(g, [FusionGroup("chain", list(g.nodes), "elementwise")])


def _chain(n: int, sigmoid: bool):
    """The benchmark's chain8 (``sigmoid``) or chain8_arith on ``n`` floats."""
    b = GraphBuilder("chain")
    x = b.input("x", (n,))

    def c(name: str, v: float):
        return b.const(name, np.float32(v))
    y = b.op("Relu", b.op("Add", b.op("Mul", x, c("half", 0.5)), c("quarter", 0.25)))
    y = b.op("Sub", y, c("one", 1.0))
    y = b.op("Sigmoid", y) if sigmoid else b.op("LeakyRelu", y, alpha=0.1)
    y = b.op("Clip", b.op("Mul", y, x), c("lo", -2.0), c("hi", 2.0))
    y = b.op("Add", y, c("eighth", 0.125)) if sigmoid else b.op("HardSwish", y)
    return b.build(y)


def _outputs(g, plan, feeds, options, cache_dir, threads: int = 1) -> np.ndarray:
    m = build(g, plan, cache_dir=cache_dir, options=options, threads=threads)
    return next(iter(m.run(feeds).values()))


@pytest.mark.parametrize("sigmoid", [False, True], ids=["chain8_arith", "chain8"])
def test_chain_is_intrinsics_and_the_c_loops_bits(sigmoid, cache_dir):
    n = 4099  # a remainder after the vectors, and a peel before them where the output is not aligned
    g = _chain(n, sigmoid)
    plan = _one_kernel(g)
    feeds = {"x": _values(n)}
    want = _outputs(g, plan, feeds, GCC, cache_dir)
    assert_close({"y": want}, {"y": next(iter(reference.run(g, feeds).values()))})
    for name, options in VECTOR_BUILDS.items():
        src = generate(g, plan, options=options).source
        p = "_mm512" if options.vector_isa == "avx512" else "_mm256"
        assert f"{p}_max_ps" in src and f"{p}_min_ps" in src, name
        assert (f"{p}_stream_ps" in src and "_mm_sfence()" in src) == (options.stream_store_min_bytes == 0), name
        for threads in (1, 2):
            assert _same_bits(_outputs(g, plan, feeds, options, cache_dir, threads), want), (name, threads)
    assert "_mm512" not in generate(g, plan, options=GCC).source


def _run_into(m, x: np.ndarray, out: np.ndarray) -> None:
    """Run ``m`` on ``x`` into the caller's ``out`` (which ``CompiledModel.run`` would allocate itself)."""
    b = m._binding
    with m._lock:
        b.point([x], [out])
        assert m._run(b.input_table, b.output_table, b.arena, b.weights, m._scratch_at, m._threads) == 0


def test_streaming_output_at_every_alignment(cache_dir):
    """The scalar peel before the first aligned store and the remainder after the last, wherever the output
    starts: outputs at every float offset of a 64-byte line, views into a larger buffer whose ends must stay."""
    n = 1000
    g = _chain(n, False)
    plan = _one_kernel(g)
    x = _values(n)
    want = _outputs(g, plan, {"x": x}, GCC, cache_dir)
    for options in (STREAM, STREAM_AVX2):
        m = build(g, plan, cache_dir=cache_dir, options=options, threads=2)
        for shift in range(16):
            buf = np.full(n + 32, 7.0, np.float32)
            start = (-(buf.ctypes.data // 4) + shift) % 16
            out = buf[start:start + n]
            _run_into(m, x, out)
            assert _same_bits(out, want), shift
            assert (buf[:start] == 7.0).all() and (buf[start + n:] == 7.0).all(), shift


OPS = [("Add", {}), ("Sub", {}), ("Mul", {}), ("Div", {}), ("Max", {}), ("Min", {}), ("Sum", {}), ("PRelu", {}),
       ("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}),
       ("Clip", {}), ("Neg", {}), ("Abs", {}), ("Sqrt", {}), ("Reciprocal", {}), ("Identity", {}), ("Exp", {}),
       ("Sigmoid", {}), ("Silu", {}), ("Tanh", {}), ("Gelu", {"approximate": "tanh"}), ("Gelu", {}), ("Erf", {}),
       ("Log", {}), ("Softplus", {}), ("Silu", {"silu_direct": False})]


@pytest.mark.parametrize("op,attrs", OPS, ids=[o + ("_tanh" if "approximate" in a else "_product" if a else "")
                                               for o, a in OPS])
def test_each_vector_op_is_the_c_rules_bits(op, attrs, cache_dir):
    """Every op of ``VECTOR_OPS`` on two dense operands with NaN, +-0, +-inf and subnormals in both (binary
    ops) or over a sweep of bit patterns (unary ops), bitwise the C loop's result, with AVX-512 and AVX2 (a Silu
    in both forms: ``silu_direct`` on and off)."""
    build_options = {k: attrs[k] for k in ("silu_direct",) if k in attrs}
    attrs = {k: v for k, v in attrs.items() if k not in build_options}
    assert op in simdchain.VECTOR_OPS
    b = GraphBuilder(f"op_{op.lower()}")
    binary = op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "PRelu")
    if binary:
        n = 4099
        x, s = b.input("x", (n,)), b.input("s", (n,))
        y = b.op(op, x, s)
        rng = np.random.default_rng(1)
        sv = (rng.standard_normal(n) * 3).astype(np.float32)
        sv[:len(SPECIAL)] = SPECIAL[::-1]
        xv = _values(n)
        xv[len(SPECIAL):2 * len(SPECIAL)] = SPECIAL  # every special value against every other, in part
        feeds = {"x": xv, "s": sv}
    else:
        xv = _sweep()
        x = b.input("x", xv.shape)
        if op == "Clip":
            y = b.op("Clip", x, b.const("lo", np.float32(-0.5)), b.const("hi", np.float32(0.75)))
        else:
            y = b.op(op, x, **attrs)
        feeds = {"x": xv}
    g = b.build(b.op("Relu", y) if op == "Identity" else y)
    plan = _one_kernel(g)
    want = _outputs(g, plan, feeds, GCC.with_(**build_options), cache_dir)
    ref = next(iter(reference.run(g, feeds).values()))
    finite = np.isfinite(ref) & np.isfinite(want)
    assert np.array_equal(np.isnan(want), np.isnan(ref))
    assert np.allclose(want[finite], ref[finite], rtol=1e-4, atol=1e-5)  # cg_support's tolerance
    for options in (AVX512.with_(**build_options), AVX2.with_(**build_options)):
        src = generate(g, plan, options=options).source
        if op == "Silu":
            assert ("siluf(" in src) == build_options.get("silu_direct", True)
        assert "_mm512_loadu_ps" in src if options.vector_isa == "avx512" else "_mm256_loadu_ps" in src
        assert _same_bits(_outputs(g, plan, feeds, options, cache_dir), want), options.vector_isa


def test_relu_keeps_nan_and_negative_zero(cache_dir):
    b = GraphBuilder("relu4d")
    g = b.build(b.op("Relu", b.op("Mul", b.input("x", (1, 16, 7, 7)), b.const("two", np.float32(2.0)))))
    x = np.ones((1, 16, 7, 7), np.float32)
    x[0, :, 0, 0] = np.nan
    x[0, :, 0, 1] = -0.0
    assert_relu_keeps_nan_and_negative_zero(g, _one_kernel(g), x, cache_dir, (AVX512, AVX2, STREAM, PORTABLE),
                                            "simd_elementwise")


@pytest.mark.parametrize("case", ["short_inner_loop", "mish", "elu", "int32", "clip_tensor_bounds"])
def test_refused_stages_keep_the_c_loop(case, cache_dir):
    """An innermost loop shorter than a vector, ops without a vector form, integers and run-time Clip bounds keep
    gcc's loop:
    no intrinsics in the kernel, the reason (``simdchain.refusal``) in its notes, results as the reference."""
    b = GraphBuilder(f"refuse_{case}")
    if case == "short_inner_loop":  # a per-row bias splits the loops: 64 rows of 4
        x = b.input("x", (64, 4))
        y = b.op("Relu", b.op("Add", x, b.const("bias", np.ones((64, 1), np.float32))))
        reason = "the innermost loop is shorter than a vector"
    elif case == "mish":  # Log and Softplus have vector forms since 2026-12-02 night
        y = b.op("Mish", b.op("Relu", b.input("x", (4096,))))
        reason = "op Mish has no vector form"
    elif case == "elu":
        y = b.op("Elu", b.op("Relu", b.input("x", (4096,))))
        reason = "op Elu has no vector form"
    elif case == "int32":
        y = b.op("Add", b.input("x", (4096,), dtype=np.int32), b.input("s", (4096,), dtype=np.int32))
        reason = "an output is not float32 over the whole domain"
    else:
        x = b.input("x", (4096,))
        y = b.op("Clip", x, b.input("lo", ()), b.input("hi", ()))
        reason = "Clip's bounds are not constants"
    g = b.build(y)
    plan = _one_kernel(g)
    src = generate(g, plan, options=AVX512).source
    assert "_mm512" not in src and "_mm256" not in src
    assert f"elementwise loop left to the C compiler's vectoriser ({reason})" in src
    feeds = reference.random_inputs(g, 0)
    m = build(g, plan, cache_dir=cache_dir, options=AVX512)
    assert_close(m.run(feeds), reference.run(g, feeds))


@pytest.mark.parametrize("inner", [33, 8, 64])
def test_broadcast_operands_vectorise_per_row(inner, cache_dir):
    """[2, 64, inner] with a per-channel scale and bias ([64, 1], constant along the innermost loop: computed once
    per row by the scalar rules, ``simdchain.hoist``) and a per-position weight ([inner], varying along it, the same
    for every row): the rows in vectors and a remainder, bitwise the C loop with AVX-512 and AVX2, 1 and 2
    threads, NaN and -0 included."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("rows")
    x = b.input("x", (2, 64, inner))
    scale = b.const("scale", rng.standard_normal((64, 1)).astype(np.float32))
    bias = b.const("bias", rng.standard_normal((64, 1)).astype(np.float32))
    w = b.input("w", (inner,))
    y = b.op("Add", b.op("Mul", x, b.op("Relu", scale)), b.op("Mul", bias, b.const("two", np.float32(2.0))))
    y = b.op("Clip", b.op("Mul", b.op("Relu", y), w), b.const("lo", np.float32(-1)), b.const("hi", np.float32(1)))
    g = b.build(b.op("Sigmoid", y))
    plan = _one_kernel(g)
    xv = (rng.standard_normal((2, 64, inner)) * 3).astype(np.float32)
    xv.reshape(-1)[:len(SPECIAL)] = SPECIAL
    wv = (rng.standard_normal(inner) * 2).astype(np.float32)
    wv[:3] = [np.nan, -0.0, np.inf]
    feeds = {"x": xv, "w": wv}
    want = _outputs(g, plan, feeds, GCC, cache_dir)
    assert_close({"y": want}, {"y": next(iter(reference.run(g, feeds).values()))})
    for options in (AVX512, AVX2, STREAM):
        src = generate(g, plan, options=options).source
        p, lanes = ("_mm512", 16) if options.vector_isa == "avx512" else ("_mm256", 8)
        # rows shorter than the ISA's vector: its branch is the scalar loop (no empty vector loop emitted)
        assert (f"{p}_loadu_ps" in src) == (inner >= lanes) and "_stream_ps" not in src  # rows: no streaming stores
        for threads in (1, 2):
            assert _same_bits(_outputs(g, plan, feeds, options, cache_dir, threads), want), (options, threads)


def test_plain_c_build_has_no_intrinsics(cache_dir):
    g = _chain(4099, True)
    src = generate(g, _one_kernel(g), options=PORTABLE).source
    assert "_mm" not in src and "immintrin" not in src and "vectoriser" not in src


def test_no_streaming_below_the_threshold_or_in_place(cache_dir):
    """Streaming stores only for an output of at least ``stream_store_min_bytes`` that no operand shares: a
    kernel storing over its dying input (in place, inside a model) keeps regular stores."""
    g = _chain(4099, False)
    plan = _one_kernel(g)
    assert "_stream_ps" not in generate(g, plan, options=AVX512.with_(stream_store_min_bytes=4099 * 4 + 1)).source
    assert "_stream_ps" in generate(g, plan, options=AVX512.with_(stream_store_min_bytes=4099 * 4)).source
    b = GraphBuilder("inplace")
    g2 = b.build(b.op("Relu", b.op("Neg", b.op("Exp", b.input("x", (4099,))))))
    plan2 = FusionPlan.unfused(g2)
    program = generate(g2, plan2, options=STREAM)
    assert program.memory.location(g2.nodes[1].outputs[0]) == program.memory.location(g2.nodes[0].outputs[0])
    exp, neg, relu = program.source.split("/* group ")[1:]
    assert "_mm512_stream_ps" in exp and "_mm512_stream_ps" in relu  # fresh arena buffer, graph output
    assert "_mm512_stream_ps" not in neg and "_mm512_storeu_ps" in neg  # over Exp's output, which dies
    feeds = {"x": _values(4099)}
    assert _same_bits(_outputs(g2, plan2, feeds, STREAM, cache_dir), _outputs(g2, plan2, feeds, GCC, cache_dir))


def _two_input_chain(n: int):
    """Sigmoid(x * 0.5 + y) * x + w: two inputs and a constant array read densely, two scalar constants."""
    b = GraphBuilder("two")
    x, y = b.input("x", (n,)), b.input("y", (n,))
    w = b.const("w", np.linspace(-1, 1, n, dtype=np.float32))
    s = b.op("Sigmoid", b.op("Add", b.op("Mul", x, b.const("half", np.float32(0.5))), y))
    return b.build(b.op("Add", b.op("Mul", s, x), w))


def test_streaming_loop_prefetches_each_dense_input(cache_dir):
    """``stream_prefetch_floats``: the streaming loop prefetches, that many floats ahead, exactly the arrays its
    vectors load (both inputs and the constant array, not the scalar constants nor the output), in the staged
    block's first pass and the unrolled loop, once per 64-byte line; none with 0 or without streaming stores;
    the same bits either way, at 1 and 2 threads, an output of any alignment (the prefetch runs past the end)."""
    import re
    n = 4099
    g = _two_input_chain(n)
    plan = _one_kernel(g)
    for stream in (STREAM, STREAM_AVX2):
        src = generate(g, plan, options=stream).source
        body = src[src.index("OPFUSE_KERNEL static void"):]
        body = body[:body.index("#elif" if stream is STREAM else "#else")]  # the ISA's own loops
        loaded = set(re.findall(r"_mm(?:256|512)_loadu_ps\((p\d+_\w+|w\w*) \+", body))
        fetched = re.findall(r"_mm_prefetch\(\(const char\*\)\(\(uintptr_t\)\((\w+) \+ (\w+)\) \+ (\d+)u\)", body)
        assert len(loaded) == 3 and {f[0] for f in fetched} == loaded, (loaded, fetched)
        lines = 64 * 4 // 64 if stream is STREAM else 32 * 4 // 64  # lanes x simd_unroll floats a step
        assert {int(f[2]) for f in fetched} == {4096 + 64 * k for k in range(lines)}  # 1024 floats on, by line
        assert len(fetched) == 2 * 3 * lines  # staged first pass + unrolled loop, three arrays
        assert "_mm_prefetch" not in generate(g, plan, options=stream.with_(stream_prefetch_floats=0)).source
        assert "_mm_prefetch" not in generate(g, plan, options=stream.with_(stream_store_min_bytes=n * 4 + 1)).source
    assert "_mm_prefetch((const char*)((uintptr_t)" in generate(
        g, plan, options=STREAM.with_(stream_prefetch_floats=16)).source
    x, y = _values(n), _values(n, 1)
    want = _outputs(g, plan, {"x": x, "y": y}, GCC, cache_dir)
    assert_close({"o": want}, {"o": next(iter(reference.run(g, {"x": x, "y": y}).values()))})
    for options in (STREAM, STREAM_AVX2, STREAM.with_(stream_prefetch_floats=16)):
        for threads in (1, 2):
            assert _same_bits(_outputs(g, plan, {"x": x, "y": y}, options, cache_dir, threads), want)


def test_each_streaming_kernel_prefetches_what_it_loads():
    """Unfused, each kernel of Exp -> Neg -> Relu streams its own input: Relu prefetches Neg's output (which
    another kernel computed), not what Neg read; Neg, storing over its dying input, neither streams nor
    prefetches."""
    import re
    b = GraphBuilder("unfused")
    g = b.build(b.op("Relu", b.op("Neg", b.op("Exp", b.input("x", (4099,))))))
    for options in (STREAM, STREAM_AVX2):
        src = generate(g, FusionPlan.unfused(g), options=options).source
        kernels = src.split("/* group ")[1:]
        assert len(kernels) == 3
        for k, streams in zip(kernels, (True, False, True), strict=True):
            body = k[:k.index("#elif" if options is STREAM else "#else")]
            loaded = set(re.findall(r"_mm(?:256|512)_loadu_ps\((\w+) \+", body))
            fetched = set(re.findall(r"_mm_prefetch\(\(const char\*\)\(\(uintptr_t\)\((\w+) \+", body))
            assert len(loaded) == 1 and fetched == (loaded if streams else set()), (k[:40], loaded, fetched)


def test_stream_prefetch_floats_is_checked():
    with pytest.raises(OpfuseError, match="stream_prefetch_floats"):
        CodegenOptions(stream_prefetch_floats=-1)


def test_note_names_the_intrinsics_and_streaming():
    g = _chain(4099, False)
    src = generate(g, _one_kernel(g), options=STREAM).source
    assert "elementwise loop in avx512 / avx2 intrinsics, non-temporal stores" in src


def test_intrinsics_loop_is_shorter_than_the_c_loop(tmp_path):
    """chain8_arith's vector loop, counted in instructions (objdump; no timing): the intrinsics' max/min for
    the ternaries against gcc's compare-and-mask chains of the same C (``simd_elementwise=False``), one vector
    an iteration each (``simd_unroll=1``: the default loop holds 4)."""
    import shutil
    import subprocess

    from opfuse.runtime.toolchain import Toolchain, ToolchainError
    from test_vectorize import _vector_loop_instructions
    if shutil.which("objdump") is None:
        pytest.skip("needs objdump")
    try:
        tc = Toolchain.detect(threads=False)
    except ToolchainError:
        pytest.skip("no C compiler")
    g = _chain(4096, False)
    counts = {}
    for name, options in (("intrinsics", CodegenOptions(simd_unroll=1)), ("c", GCC)):
        (tmp_path / f"{name}.c").write_text(generate(g, _one_kernel(g), options=options).source)
        subprocess.run([tc.cc, *tc.flags, "-o", str(tmp_path / f"{name}.so"), str(tmp_path / f"{name}.c")],
                       check=True, capture_output=True)
        counts[name] = _vector_loop_instructions(tmp_path / f"{name}.so")
    if "_mm" not in (tmp_path / "intrinsics.c").read_text() or not counts["intrinsics"]:
        pytest.skip("no vector ISA on this host")
    assert 0 < counts["intrinsics"] < counts["c"], counts


def test_constant_operands_along_the_loop_are_read_per_lane(cache_dir):
    """A constant that varies along the innermost loop ([40], in the weights) is loaded per vector, one constant
    along it ([4, 1]) is computed once per row, a scalar is broadcast: bitwise the C loop, and the reference."""
    rng = np.random.default_rng(8)
    b = GraphBuilder("constants")
    x = b.input("x", (4, 40))
    w = b.const("w", rng.standard_normal(40).astype(np.float32))
    r = b.const("r", rng.standard_normal((4, 1)).astype(np.float32))
    y = b.op("Mul", b.op("Add", b.op("Mul", x, w), r), b.const("half", np.float32(0.5)))
    g = b.build(b.op("Relu", y))
    plan = _one_kernel(g)
    feeds = {"x": (rng.standard_normal((4, 40)) * 3).astype(np.float32)}
    want = _outputs(g, plan, feeds, GCC, cache_dir)
    assert_close({"y": want}, {"y": next(iter(reference.run(g, feeds).values()))})
    for options in (AVX512, AVX2):
        assert "_loadu_ps" in generate(g, plan, options=options).source
        assert _same_bits(_outputs(g, plan, feeds, options, cache_dir), want), options


def _silu_chain(n: int):
    """x -> Mul -> Silu -> Add: a Silu inside a chain, its input computed in the first pass."""
    b = GraphBuilder("silu_chain")
    x = b.input("x", (n,))
    y = b.op("Add", b.op("Silu", b.op("Mul", x, b.const("k", np.float32(1.5)))), x)
    return b.build(y)


@pytest.mark.parametrize("chain", ["chain8", "silu", "silu_product"])
def test_staged_blocks_are_the_one_pass_bits(chain, cache_dir):
    """``simd_stage_block``: a chain with one Sigmoid (Silu) runs whole blocks in two passes (its input and
    its exp into L1 buffers, then the division and the rest), the vectors after the last block in one pass:
    bitwise the one-pass loop and the C loop, with and without streaming stores, AVX-512 and AVX2, 1 and 2
    threads, at blocks that divide the unrolled step and one that does not (48 floats: 3 AVX-512 vectors).
    A Silu in either form (``silu_direct``: ``x / (1 + exp(-x))``; off: ``x * sigmoid(x)``)."""
    n = 3 * 512 + 4 * 16 + 5  # three blocks, leftover vectors, a scalar remainder
    g = _chain(n, True) if chain == "chain8" else _silu_chain(n)
    direct = chain == "silu"
    tail = "siluf_tail" if direct else "sigmoidf_tail"
    plan = _one_kernel(g)
    feeds = {"x": _values(n)}
    want = _outputs(g, plan, feeds, GCC.with_(silu_direct=direct), cache_dir)
    for base in (AVX512, AVX2, STREAM, STREAM_AVX2):
        base = base.with_(silu_direct=direct)
        one_pass = generate(g, plan, options=base.with_(simd_stage_block=0)).source
        assert "_tail" not in one_pass
        assert _same_bits(_outputs(g, plan, feeds, base.with_(simd_stage_block=0), cache_dir), want)
        for block in (512, 48):
            options = base.with_(simd_stage_block=block)
            assert f"{tail}(" in generate(g, plan, options=options).source
            for threads in (1, 2):
                assert _same_bits(_outputs(g, plan, feeds, options, cache_dir, threads), want), (base, block, threads)


def test_stages_only_a_lone_sigmoid_of_a_dense_loop():
    """Two Sigmoids (or none) keep one pass; so does a loop nest with a broadcast operand (outer loops)."""
    b = GraphBuilder("two")
    x = b.input("x", (4096,))
    g = b.build(b.op("Sigmoid", b.op("Sigmoid", x)))
    assert "sigmoidf_tail" not in generate(g, _one_kernel(g), options=AVX512).source
    g = _chain(4096, False)
    assert "sigmoidf_tail" not in generate(g, _one_kernel(g), options=AVX512).source
    b = GraphBuilder("rows")
    x = b.input("x", (8, 1024))
    g = b.build(b.op("Sigmoid", b.op("Mul", x, b.input("s", (8, 1)))))
    assert "sigmoidf_tail" not in generate(g, _one_kernel(g), options=AVX512).source
    with pytest.raises(OpfuseError, match="simd_stage_block"):
        CodegenOptions(simd_stage_block=40)
