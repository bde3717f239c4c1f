"""The attention kernel's own loops 512 bits wide (``CodegenOptions.attention_vector_width_512``): with the AVX-512
vector ISA the kernel's function and its parallel loop's carry ``OPFUSE_VECTOR_512`` (GCC's
``target("prefer-vector-width=512")``; the rest of the program keeps the toolchain's 256), the macro is defined
once, the kernel says so in its notes, and no output bit changes (gcc reorders no float sum without -ffast-math):
the same bits as the option off, at 1 and 2 threads (the plain C99 build, whose micro-kernel sums in another
order, within tolerance of the reference as they are). AVX2, the plain C build and the option off write no such
attribute; None resolves from the host's FMA width, as ``depthwise_avx512``."""
from __future__ import annotations

import re

import numpy as np
import pytest

from opfuse.codegen import CodegenOptions
from opfuse.codegen.kernel import VECTOR_512
from opfuse.codegen.program import generate
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build
from opfuse.targets import host_simd_isa

NOTE = "512 bits wide"


def _heads(heads: int = 4, seq: int = 48, dim: int = 32):
    """Scaled dot-product attention over ``heads`` heads (enough tiles for two threads)."""
    b = GraphBuilder("att512")
    q, kt = b.input("q", (heads, seq, dim)), b.input("kt", (heads, dim, seq))
    v = b.input("v", (heads, seq, dim))
    s = b.op("Div", b.op("MatMul", q, kt, name="mm1"), b.const("scale", np.float32(np.sqrt(dim))), name="scale")
    g = b.build(b.op("MatMul", b.op("Softmax", s, axis=-1, name="sm"), v, name="mm2"))
    return g, FusionPlan(g, [FusionGroup("att", list(g.nodes), "attention", None)])


def _attention_functions(source: str) -> list[str]:
    """The heads of the attention kernel's functions (the kernel's and its parallel loops')."""
    return re.findall(r"^OPFUSE_KERNEL .*static \w+ k\d+_att\w*\(", source, re.M)


def test_avx512_marks_the_kernel_and_its_parallel_loop():
    g, plan = _heads()
    program = generate(g, plan, options=CodegenOptions(vector_isa="avx512", attention_vector_width_512=True))
    heads = _attention_functions(program.source)
    assert len(heads) == 2 and all(f" {VECTOR_512} static " in h for h in heads)
    assert program.source.count(f"#define {VECTOR_512} __attribute__((target(\"prefer-vector-width=512\")))") == 1
    (kernel,) = [k for k in program.kernels if k.function]
    assert any(NOTE in n for n in kernel.notes)


@pytest.mark.parametrize("options", [dict(vector_isa="avx512", attention_vector_width_512=False),
                                     dict(vector_isa="avx2", attention_vector_width_512=True),
                                     dict(simd="none", attention_vector_width_512=True)],
                         ids=["option-off", "avx2", "plain-c"])
def test_nothing_is_marked_elsewhere(options):
    g, plan = _heads()
    program = generate(g, plan, options=CodegenOptions(**options))
    assert VECTOR_512 not in program.source
    assert not any(NOTE in n for k in program.kernels for n in k.notes)


def test_none_follows_the_host_s_fma_width():
    on = CodegenOptions(vector_isa="avx512").resolved("avx512", full_width_fma=True)
    off = CodegenOptions(vector_isa="avx512").resolved("avx512", full_width_fma=False)
    assert on.attention_vector_width_512 is True and off.attention_vector_width_512 is False
    assert CodegenOptions(attention_vector_width_512=False).resolved("avx512", True).attention_vector_width_512 is False


@pytest.mark.skipif(host_simd_isa() != "avx512", reason="needs an AVX-512 host")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_same_bits_as_256_bits(cache_dir, threads):
    g, plan = _heads()
    feeds = reference.random_inputs(g, 3)
    runs = {}
    for name, opts in (("wide", dict(vector_isa="avx512", attention_vector_width_512=True)),
                       ("narrow", dict(vector_isa="avx512", attention_vector_width_512=False)),
                       ("plain", dict(simd="none"))):
        model = build(g, plan, cache_dir=cache_dir, threads=threads, options=CodegenOptions(**opts))
        assert (VECTOR_512 in model.program.source) == (name == "wide")
        runs[name] = next(iter(model.run(feeds).values()))
    assert np.array_equal(runs["wide"], runs["narrow"])
    want = next(iter(reference.run(g, feeds).values()))
    assert np.allclose(runs["wide"], want, rtol=1e-4, atol=1e-5)
    assert np.allclose(runs["plain"], want, rtol=1e-4, atol=1e-5)
