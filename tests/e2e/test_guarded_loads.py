"""Issue 13, no load under a condition: each code path whose C chose what to load by a condition, built at a width
where gcc 12.2 -O3 made masked loads of it (``tools/masked_loads.py``), fused and unfused, against the reference;
the path is asserted by the fused build's C text. Where the compiler is gcc 12 on x86-64 (CI's), the fused
build's object is also scanned: a masked load the compiler made (``origin == "compiler"``) in these kernels fails
the test. The cases are ``opfuse.testing.masked_load_cases``; every input value is distinct, so a misplaced read
cannot pass. ``FAST`` runs in CI's suite (8 cases fused and unfused, 7 s cold at load 2); the other cases are slow."""
from __future__ import annotations

import platform
import re
import shutil
import subprocess

import numpy as np
import pytest

from opfuse.codegen import CodegenOptions
from opfuse.compiler import CompileOptions, build_native, plan_model
from opfuse.runtime import reference
from opfuse.runtime.toolchain import find_compiler
from opfuse.testing.fuzz_check import compare
from opfuse.testing.masked_load_cases import MAKERS, feeds
from opfuse.testing.masked_loads import COUNTED, scan

F32, F64 = np.float32, np.float64


def _gcc12_x86() -> bool:
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None:
        return False
    try:
        out = subprocess.run([*find_compiler().split(), "-dumpfullversion"], capture_output=True, text=True,
                             timeout=30).stdout
        ident = subprocess.run([*find_compiler().split(), "--version"], capture_output=True, text=True,
                               timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "clang" not in ident and out.strip().startswith("12.")


# name, element type where gcc masked, width, a marker of the path in the C (a regex), whether the kernels
# must be free of compiler-made masked loads
SITES = [
    ("conv1d_padded", F64, 13, r"\(unsigned long\)q\d+ < 13ul\) \? \w+ : 0x0p\+0", True),  # generic im2col load
    ("conv2d_padded", F64, 9, r"\(unsigned long\)q\d+ < 7ul && \(unsigned long\)q\d+ < 9ul\) \? ", True),
    ("conv1d_padded", F32, 17, r"long\* restrict base\d+ = .*\n(?s:.*)dst\d+\[c\d+\] = \(\(unsigned long\)q", True),
    ("conv3d_padded", F32, 3, r"dst\d+\[c\d+\] = \(\(unsigned long\)q\d+ < 3ul && ", True),  # im2col packer
    ("pad_constant", F64, 13, r"p0_x\[\(\(long\)\(\(unsigned long\)\(t\d+\) < 5ul", True),
    ("average_pool", F64, 9, r"\+= in\d+ \? v\d+ : 0x0p\+0;", True),  # the generic window
    ("lstm", F32, 3, r"xw\d+\[m\d+ \* 32 \+ n\d+\] = bias\d+\[n\d+\];", True),  # XW's bias, then zeros
    ("conv_transpose", F32, 7, r"% 2 != 0\) continue;", True),
    ("max_pool_indices", F64, 9, r">= 9\) continue;", True),
    ("col2im", F32, 7, r"% 2 != 0\) continue;", True),
    ("qconv", np.int8, 11, r"dst\[4 \* j \+ q\] = in && rows\[q\] \? v : fill;", True),  # int8 word builders
    # a fused Concat along its innermost axis: one loop per input (its branch per input gcc masked at widths 6-19)
    ("concat_last_axis", F32, 7, r"for \(long (i\d+) = 7; \1 < 15; \+\+\1\)", True),
    ("concat_last_axis", F64, 9, r"for \(long (i\d+) = 9; \1 < 19; \+\+\1\)", True),
    ("concat_three", F32, 13, r"for \(long (i\d+) = 3; \1 < 4; \+\+\1\)", True),
]


# One case per code path runs in CI's suite; the rest (a second width or element type, the paths gcc never
# masked) are slow.
FAST = {"conv1d_padded-float64-13", "conv3d_padded-float32-3", "pad_constant-float64-13", "average_pool-float64-9",
        "lstm-float32-3", "qconv-int8-11", "concat_last_axis-float32-7", "concat_three-float32-13"}


def _cases():
    for name, dt, width, marker, clean in SITES:
        case = f"{name}-{np.dtype(dt).name}-{width}"
        yield pytest.param(name, dt, width, marker, clean, id=case,
                           marks=() if case in FAST else pytest.mark.slow)
        if name not in ("lstm", "qconv"):  # the other element type, slow
            other = F32 if dt is F64 else F64
            yield pytest.param(name, other, width, None, clean, marks=pytest.mark.slow,
                               id=f"{name}-{np.dtype(other).name}-{width}")


@pytest.mark.parametrize(("name", "dt", "width", "marker", "clean"), list(_cases()))
def test_guarded_load_site_against_the_reference(name, dt, width, marker, clean):
    graph = MAKERS[name](dt, width)
    inputs = feeds(graph)
    want = reference.run(graph, inputs)
    for fuse in (False, True):
        # the AVX-512 register blocks' C, whatever the host (the markers are their paths; the C's AVX2 or plain
        # bodies build where the host has no AVX-512, and their object is scanned the same way)
        model = build_native(plan_model(graph, CompileOptions(fuse=fuse, planner="rules")),
                             codegen_options=CodegenOptions(vector_isa="avx512"))
        source = model.program.source
        if marker is not None and fuse:  # the unfused Concat is a copy by slices
            assert re.search(marker, source), "the path's C is not there"
        diff = compare(model.run(inputs), want)
        assert diff is None, f"{'fused' if fuse else 'unfused'}: {diff}"
        if fuse and clean and _GCC12:
            made = [m for m in scan(source, model.toolchain) if m.origin in COUNTED]
            assert not made, "masked loads gcc made: " + "; ".join(
                f"{m.function}:{m.line} {m.instruction} | {m.text}" for m in made[:4])


_GCC12 = _gcc12_x86()
