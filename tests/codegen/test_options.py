"""``CodegenOptions``: what it refuses (and says so), what it accepts at each bound, how ``resolved`` fills in
the vector ISA and the register block, and the options of each target. No compiler: the expectations are read
off the docstrings and comments of ``codegen/options.py``."""
from __future__ import annotations

import re

import pytest

from opfuse.codegen.options import (CORTEX_M7, PORTABLE, REGISTER_BLOCKS, CodegenOptions, options_for_target)
from opfuse.errors import OpfuseError


@pytest.mark.parametrize(("field", "value", "message"), [
    ("layout", "NHWC", "layout 'NHWC' is not supported by the C backend (supported: NCHW)"),
    ("platform", "gpu", "platform 'gpu': expected one of host, mcu"),
    ("weights", "file", "weights mode 'file': expected one of blob, embed"),
    ("profile_clock", "cycles", "profile clock 'cycles': expected one of wall, thread_cpu"),
    ("simd", "sse", "simd mode 'sse': expected one of auto, none"),
    ("winograd", "maybe", "winograd mode 'maybe': expected one of auto, off, on"),
    ("vector_isa", "sve", "vector ISA 'sve': expected one of host, avx2, avx512, neon"),
])
def test_unknown_names_are_refused_with_the_choices(field, value, message):
    with pytest.raises(OpfuseError, match=f"^{re.escape(message)}$"):
        CodegenOptions(**{field: value})


@pytest.mark.parametrize("field", ["layout", "platform", "weights", "profile_clock", "simd", "winograd", "vector_isa"])
def test_every_listed_choice_is_accepted(field):
    choices = {"layout": ["NCHW"], "platform": ["host", "mcu"], "weights": ["blob", "embed"],
               "profile_clock": ["wall", "thread_cpu"], "simd": ["auto", "none"], "winograd": ["auto", "off", "on"],
               "vector_isa": ["host", "avx2", "avx512", "neon"]}[field]
    for value in choices:
        assert getattr(CodegenOptions(**{field: value}), field) == value


DEPTHWISE_CHUNKS = "depthwise_chunk_planes and depthwise_min_chunks must be at least 1"
DEPTHWISE_ROWS = "depthwise_row_block and depthwise_block_group must be at least 1"
F16C = "f16c_min_block must be a multiple of 8 and f16c_block at least f16c_min_block"
MR_NR = "gemm_mr and gemm_nr must be positive (0: the vector ISA's register block)"


@pytest.mark.parametrize(("kw", "message"), [
    ({"depthwise_chunk_planes": 0}, DEPTHWISE_CHUNKS),
    ({"depthwise_min_chunks": 0}, DEPTHWISE_CHUNKS),
    ({"depthwise_row_block": 0}, DEPTHWISE_ROWS),
    ({"depthwise_block_group": 0}, DEPTHWISE_ROWS),
    ({"f16c_min_block": 0, "f16c_block": 64}, F16C),  # a multiple of 8, but below 8
    ({"f16c_min_block": 12, "f16c_block": 64}, F16C),  # not a multiple of 8
    ({"f16c_min_block": 32, "f16c_block": 24}, F16C),  # the block below the minimum
    ({"gemm_mr": -1}, MR_NR),
    ({"gemm_nr": -1}, MR_NR),
    ({"gemm_mr": 5}, "gemm_mc (96) must be a multiple of gemm_mr (5) and gemm_nc (256) of gemm_nr (0)"),
    ({"gemm_nr": 24}, "gemm_mc (96) must be a multiple of gemm_mr (0) and gemm_nc (256) of gemm_nr (24)"),
    ({"simd_unroll": 0}, "simd_unroll must be at least 1 (1: one vector per iteration)"),
    ({"pool_prefetch_bytes": -1}, "pool_prefetch_bytes must be at least 0 (0: no prefetch)"),
])
def test_out_of_range_numbers_are_refused(kw, message):
    with pytest.raises(OpfuseError, match=f"^{re.escape(message)}$"):
        CodegenOptions(**kw)


@pytest.mark.parametrize("kw", [
    {"depthwise_chunk_planes": 1, "depthwise_min_chunks": 1, "depthwise_row_block": 1, "depthwise_block_group": 1},
    {"f16c_min_block": 8, "f16c_block": 8},  # the smallest minimum, the block equal to it
    {"f16c_min_block": 16, "f16c_block": 17},  # the block need not be a multiple of 8
    {"gemm_mr": 0, "gemm_nr": 0, "gemm_mc": 7, "gemm_nc": 9},  # 0: the ISA's block, no multiple checked
    {"gemm_mr": 6, "gemm_nr": 16, "gemm_mc": 96, "gemm_nc": 256},
    {"gemm_mr": 4, "gemm_nr": 4, "gemm_mc": 64, "gemm_nc": 16},
    {"gemm_mr": 1, "gemm_nr": 1, "gemm_mc": 3, "gemm_nc": 5},
    {"simd_unroll": 1, "pool_prefetch_bytes": 0},
])
def test_values_at_the_bounds_are_accepted(kw):
    opts = CodegenOptions(**kw)
    assert all(getattr(opts, k) == v for k, v in kw.items())


def test_with_replaces_the_named_fields_and_checks_them_again():
    base = CodegenOptions()
    changed = base.with_(gemm_kc=64, simd="none")
    assert (changed.gemm_kc, changed.simd) == (64, "none")
    assert (base.gemm_kc, base.simd) == (1024, "auto")  # frozen: the original is unchanged
    assert changed.with_() == changed
    with pytest.raises(OpfuseError, match="^simd mode 'avx': "):
        base.with_(simd="avx")


@pytest.mark.parametrize(("isa", "host", "want"), [
    ("host", "avx2", "avx2"), ("host", "avx512", "avx512"), ("host", "neon", "neon"),
    ("avx2", "avx512", "avx2"), ("avx512", "avx2", "avx512"), ("neon", "avx512", "neon"),
])
def test_resolved_names_a_concrete_isa_and_its_register_block(isa, host, want):
    opts = CodegenOptions(vector_isa=isa).resolved(host)
    assert opts.vector_isa == want
    assert (opts.gemm_mr, opts.gemm_nr) == REGISTER_BLOCKS[want]
    assert opts.winograd_avx512 is False  # None resolves to the host's FMA width, here not given: off
    assert opts.depthwise_avx512 is False  # likewise
    assert opts.attention_vector_width_512 is False  # likewise
    # nothing else moved
    assert opts.windows_mr_max == 8  # None resolves to 14 where the FMA pipes are zmm-wide, here not given
    assert opts.with_(vector_isa=isa, gemm_mr=0, gemm_nr=0, winograd_avx512=None, windows_mr_max=None,
                      depthwise_avx512=None, attention_vector_width_512=None) == CodegenOptions(vector_isa=isa)


@pytest.mark.parametrize("isa", ["host", "avx512", "neon"])
def test_resolved_plain_c_keeps_the_avx2_block_whatever_the_machine(isa):
    opts = CodegenOptions(simd="none", vector_isa=isa).resolved("avx512")
    assert (opts.vector_isa, opts.gemm_mr, opts.gemm_nr) == ("avx2", 6, 16)


def test_resolved_keeps_a_register_block_given():
    opts = CodegenOptions(gemm_mr=8, gemm_nr=0, gemm_mc=96).resolved("avx512")
    assert (opts.gemm_mr, opts.gemm_nr) == (8, 32)
    opts = CodegenOptions(gemm_mr=0, gemm_nr=8).resolved("avx2")
    assert (opts.gemm_mr, opts.gemm_nr) == (6, 8)


def test_options_for_target():
    assert options_for_target("cortex-m7") is CORTEX_M7
    assert (CORTEX_M7.platform, CORTEX_M7.simd, CORTEX_M7.weights) == ("mcu", "none", "embed")
    # Silu stays x * sigmoid(x) on the microcontroller and its host twin (the emulated run's bits are PORTABLE's)
    assert not CORTEX_M7.silu_direct and not PORTABLE.silu_direct and CodegenOptions().silu_direct
    assert options_for_target("host") == CodegenOptions()
    assert options_for_target("x86_64") == CodegenOptions()
