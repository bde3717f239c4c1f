"""``opfuse.testing.masked_loads``: which instructions of an ``objdump -d -l --inlines`` listing read memory under
a mask, the C line each is placed at, and why (its origin). A listing written by hand, no compiler; one C file
through gcc where objdump is installed."""
from __future__ import annotations

import platform
import shutil

import pytest

from opfuse.testing.masked_loads import COUNTED, is_masked_load, parse

SOURCE = [
    "void k0(double* restrict y, const double* restrict x, long n) {",  # 1
    "  double v = 0.5; if (inside) v = x[i - 3];",  # 2
    "  __m256 a = _mm256_maskload_ps(row, mask);",  # 3
    "  const float t = p[idx[i]];",  # 4
    "  const float s = c ? t * w : t;",  # 5
]
LISTING = """
0000000000000000 <k0>:
k0():
/tmp/x/model.c:2
   0:\tvmovupd -0x18(%rsi,%rax,1),%zmm2{%k2}
   6:\tvmovupd %zmm2,(%rdi){%k1}
_mm256_maskload_ps():
/usr/lib/gcc/x86_64-linux-gnu/12/include/avxintrin.h:980
inlined by /tmp/x/model.c:3 (k0)
   c:\tvmaskmovps (%rbx),%ymm2,%ymm3
k0():
/tmp/x/model.c:4
  10:\tkxnorw %k1,%k1,%k1
  14:\tkmovw  %k1,%k3
  18:\tvgatherdps (%rsi,%zmm1,4),%zmm0{%k3}
  1e:\tkmovb  0x0(%rip),%k4        # 26 <k0+0x26>
  26:\tvgatherdps (%rsi,%ymm2,4),%ymm0{%k4}
/tmp/x/model.c:5
  2c:\tvmulps 0x40(%rdx),%zmm1,%zmm0{%k5}
  32:\tvbroadcastss 0x0(%rip),%zmm4{%k5}        # 3a <k0+0x3a>
  3a:\tvblendmps 0x40(%rdi),%zmm7,%zmm0{%k2}
"""


def test_each_masked_read_its_line_and_origin():
    found = [(m.line, m.mnemonic, m.origin) for m in parse(LISTING, SOURCE)]
    assert found == [(2, "vmovupd", "compiler"), (3, "vmaskmovps", "intrinsic"), (4, "vgatherdps", "unmasked"),
                     (4, "vgatherdps", "fixed-mask"), (5, "vmulps", "folded"), (5, "vbroadcastss", "constant"),
                     (5, "vblendmps", "blend")]
    assert [m.text for m in parse(LISTING, SOURCE) if m.origin in COUNTED] == [SOURCE[1].strip()]


@pytest.mark.parametrize(("mnemonic", "operands", "masked"), [
    ("vmovups", "(%rax),%zmm1{%k1}{z}", True),
    ("vmovups", "%zmm1,(%rax){%k1}", False),  # a masked store
    ("vmaskmovps", "%ymm2,%ymm1,(%rax)", False),  # AVX's masked store
    ("vmaskmovpd", "0x8(%rax),%ymm1,%ymm2", True),
    ("vgatherdps", "%ymm2,(%rsi,%ymm3,4),%ymm0", True),  # AVX2: always masked
    ("vaddps", "(%rax),%zmm1,%zmm2", False),
    ("vmovaps", "%zmm1,%zmm2{%k1}", False),  # no memory
])
def test_is_masked_load(mnemonic, operands, masked):
    assert is_masked_load(mnemonic, operands) == masked


@pytest.mark.skipif(shutil.which("objdump") is None or platform.machine() != "x86_64", reason="x86-64 objdump")
def test_a_guarded_load_gcc_vectorises_is_found():
    """The shape of issue 13's miscompilations, built with the toolchain: found, at its line, as the compiler's."""
    from opfuse.runtime.toolchain import Toolchain
    from opfuse.testing.masked_loads import scan
    src = ("void f(double* restrict y, const double* restrict x, long n, long m) {\n"
           "  for (long i = 0; i < n; ++i) { double v = 0.5; if ((unsigned long)(i - 3) < (unsigned long)m) "
           "v = x[i - 3]; y[i] = v; }\n}\n")
    tc = Toolchain.detect()
    if "-march=native" not in tc.flags or " avx2 " not in f" {_cpu_flags()} " or "clang" in tc.identity:
        pytest.skip("gcc building for a host with AVX2 (masked loads to find)")
    found = scan(src, tc)
    assert found and {m.line for m in found} == {2} and {m.origin for m in found} == {"compiler"}


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1] for ln in f if ln.startswith("flags")), "")
    except OSError:
        return ""


# The layout gcc 12 gave a conv3d kernel built with -march=sapphirerapids: k1 set to all ones once, copied into the
# mask of each gather of the loop's blocks; the last block, laid out after a gather that consumed k1 itself, is
# reached only by the jump from the first, where k1 is still all ones. Read in listing order, its gathers'
# masks looked cleared ("compiler"); along the jumps they are all ones.
FLOW_SOURCE = ["void k0(void) {", "  const float t = p[clamped];"]
FLOW = """
0000000000000000 <k0>:
k0():
/tmp/x/model.c:2
   0:\tkxnorb %k1,%k1,%k1
   4:\tcmp    $0x7,%rsi
   8:\tjbe    30 <k0+0x30>
   e:\tkmovb  %k1,%k7
  12:\tvgatherqps (%r11,%ymm1,4),%xmm18{%k7}
  18:\tvgatherqps (%r11,%ymm2,4),%xmm3{%k1}
  1e:\tret
  20:\tvgatherqps (%r11,%ymm2,4),%xmm3{%k1}
  26:\tjmp    1e <k0+0x1e>
  30:\tkmovb  %k1,%k5
  34:\tvgatherqps (%r11,%xmm3,4),%xmm5{%k5}
  3a:\tvgatherqps (%r11,%xmm2,4),%xmm3{%k1}
  40:\tret
"""


def test_a_masks_state_follows_the_jumps_not_the_listing():
    found = [m.origin for m in parse(FLOW, FLOW_SOURCE)]
    # the gathers at 12, 18: unmasked; at 20: unreachable (nothing known: the compiler's); at 34, 3a: unmasked
    assert found == ["unmasked", "unmasked", "compiler", "unmasked", "unmasked"]


def test_paths_that_disagree_on_a_mask_leave_it_unknown():
    listing = FLOW.replace("   4:\tcmp    $0x7,%rsi", "   4:\tvpcmpleuq %ymm8,%ymm7,%k1").replace(
        "   0:\tkxnorb %k1,%k1,%k1", "   0:\tkxnorb %k1,%k1,%k1\n   2:\tje     8 <k0+0x8>")
    # k1 is all ones at 8 on the path 0 -> 2 -> 8 and a comparison's result on 0 -> 2 -> 4 -> 8: not known
    assert [m.origin for m in parse(listing, FLOW_SOURCE)][-2:] == ["compiler", "compiler"]


def test_a_call_clobbers_the_masks():
    listing = FLOW.replace("  30:\tkmovb  %k1,%k5", "  30:\tcall   0 <k0>\n  32:\tkmovb  %k1,%k5")
    assert [m.origin for m in parse(listing, FLOW_SOURCE)][-2:] == ["compiler", "compiler"]


def test_a_function_jumping_through_a_register_knows_nothing_at_its_blocks():
    listing = FLOW.replace("  26:\tjmp    1e <k0+0x1e>", "  26:\tnotrack jmp *%rax")
    assert {m.origin for m in parse(listing, FLOW_SOURCE)} == {"compiler"}
    # within the block that sets it, a mask is known even so
    straight = FLOW_SOURCE, "\n".join(FLOW.splitlines()[:5]) + "\n  4:\tvgatherqps (%r11,%ymm1,4),%xmm18{%k1}\n" \
        "  a:\tjmp    *%rax\n"
    assert [m.origin for m in parse(straight[1], straight[0])] == ["unmasked"]
