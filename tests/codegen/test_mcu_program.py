"""The microcontroller flavour of the program (``CodegenOptions(platform="mcu")``), checked on the
host: its C is portable C99, so the host compiler builds it too. Same bits as the host build, no
memory outside the arena, nothing of libc beyond math.h and string.h. (The emulated Cortex-M7
runs are in ``tests/runtime/test_mcu_qemu.py``.)"""
from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cg_support import epilogue_plan
from opfuse.codegen import generate
from opfuse.codegen.mcu import HEADER_NAME, SOURCE_NAME, WEIGHTS_NAME
from opfuse.codegen.microkernel import microkernel
from opfuse.codegen.options import CORTEX_M7, CodegenOptions, options_for_target
from opfuse.compiler import CompileOptions, plan_model
from opfuse.errors import OpfuseError
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build
from opfuse.runtime.toolchain import find_compiler
from opfuse.codegen.options import PORTABLE

GUARD = 256  # poisoned bytes on both sides of the arena
POISON = 0xA7
HOST_FLAGS = ["-O2", "-std=c99", "-pedantic", "-Werror=implicit-function-declaration", "-ffp-contract=off",
              "-fno-math-errno", "-fPIC", "-shared"]
# What the generated code may call: math.h and string.h (the host compiler's own names aside).
ALLOWED_HEADERS = {"math.h", "stddef.h", "stdint.h", "string.h", HEADER_NAME}
STRING_H = {"memcpy", "memset", "memmove", "memcmp"}
MATH_H = re.compile(r"(exp|log|log2|log10|log1p|expm1|pow|sqrt|cbrt|sin|cos|tan|asin|acos|atan|atan2|sinh|cosh|"
                    r"tanh|asinh|acosh|atanh|erf|erfc|fabs|floor|ceil|round|lround|rint|nearbyint|trunc|fmod|"
                    r"remainder|fmin|fmax|copysign|ldexp|frexp|modf|hypot)f?")


class HostRun:
    """The mcu library built as a host shared library and called through ``opfuse_run``."""

    def __init__(self, program, directory: Path):
        for name, text in program.mcu.files(program.source).items():
            (directory / name).write_text(text)
        lib = directory / "libmcu.so"
        cc = find_compiler()
        subprocess.run([cc, *HOST_FLAGS, "-o", str(lib), str(directory / SOURCE_NAME), str(directory / WEIGHTS_NAME),
                        "-lm"], check=True, capture_output=True, text=True)
        obj = directory / "model.o"
        subprocess.run([cc, "-O2", "-std=c99", "-ffp-contract=off", "-fno-math-errno", "-c", "-o", str(obj),
                        str(directory / SOURCE_NAME)], check=True)
        nm = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True, check=True).stdout
        self.undefined = [line.split()[-1] for line in nm.splitlines() if line.strip()]
        self.program = program
        self.lib = ctypes.CDLL(str(lib))
        self.lib.opfuse_run.restype = ctypes.c_int

    def run(self, feeds, fill: int = POISON, faults: bool = False):
        """The outputs of one run; asserts that ``opfuse_run`` returned a fault (nonzero) or not, as ``faults``
        says, and that nothing was written outside the arena or outside any output (each output lies between
        poisoned guards too)."""
        p = self.program
        ins = [np.ascontiguousarray(feeds[t.name], dtype=t.dtype) for t in p.inputs]
        guarded = [_guarded(math.prod(t.shape) * np.dtype(t.dtype).itemsize) for t in p.outputs]
        outs = []
        for t, (obuf, ostart) in zip(p.outputs, guarded, strict=True):
            nbytes = math.prod(t.shape) * np.dtype(t.dtype).itemsize
            out = obuf[ostart:ostart + nbytes].view(t.dtype).reshape(t.shape)
            out[...] = np.nan if np.dtype(t.dtype).kind == "f" else 0
            outs.append(out)
        buf, start = _guarded(p.arena_bytes, fill)
        in_ptrs = (ctypes.c_void_p * max(len(ins), 1))(*[a.ctypes.data for a in ins])
        out_ptrs = (ctypes.c_void_p * max(len(outs), 1))(*[a.ctypes.data for a in outs])
        assert (self.lib.opfuse_run(in_ptrs, out_ptrs, ctypes.c_void_p(buf.ctypes.data + start)) != 0) == faults
        untouched = np.concatenate([buf[:start], buf[start + p.arena_bytes:]])
        assert (untouched == fill).all(), "a kernel wrote outside the arena"
        for t, out, (obuf, ostart) in zip(p.outputs, outs, guarded, strict=True):
            around = np.concatenate([obuf[:ostart], obuf[ostart + out.nbytes:]])
            assert (around == POISON).all(), f"a kernel wrote outside output '{t.name}'"
        return {t.name: out.copy() for t, out in zip(p.outputs, outs, strict=True)}


def _guarded(nbytes: int, fill: int = POISON) -> tuple[np.ndarray, int]:
    """A buffer of ``fill`` bytes with room for ``nbytes`` at a 64-byte aligned offset, ``GUARD`` bytes or more
    on either side: (the buffer, that offset)."""
    buf = np.full(nbytes + 2 * GUARD + 64, fill, dtype=np.uint8)
    return buf, GUARD + (-(buf.ctypes.data + GUARD) % 64)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def resnet8(tmp_path_factory):
    comp = plan_model("zoo:resnet8", CompileOptions(target="cortex-m7"))
    program = generate(comp.graph, comp.plan, memory=comp.memory, options=options_for_target("cortex-m7"))
    return comp, program, HostRun(program, tmp_path_factory.mktemp("mcu-resnet8"))


def test_same_bits_as_the_host_build_and_nothing_outside_the_arena(resnet8, cache_dir):
    comp, program, host_mcu = resnet8
    feeds = reference.random_inputs(comp.graph, 0)
    host = build(comp.graph, comp.plan, memory=comp.memory, cache_dir=cache_dir, options=PORTABLE).run(feeds)
    first = host_mcu.run(feeds)
    again = host_mcu.run(feeds, fill=0x00)  # the arena's old contents do not matter
    for name, want in host.items():
        assert _same_bits(first[name], want) and _same_bits(again[name], want)


def test_scratch_lives_in_the_arena_beside_the_live_tensors(resnet8):
    comp, program, _ = resnet8
    assert program.scratch_stride == 0 and "scratch" not in program.mcu.header
    placed = [k for k in program.kernels if k.scratch_bytes]
    assert placed, "resnet8's convolutions pack panels in scratch"
    assert program.arena_bytes >= comp.memory.arena_bytes
    for t, k in enumerate(program.kernels):
        if not k.scratch_bytes:
            continue
        lo, hi = k.scratch_offset, k.scratch_offset + k.scratch_bytes
        assert hi <= program.arena_bytes
        for off, size, start, end in comp.memory.blocks.values():
            if start <= t <= end:
                assert hi <= off or off + size <= lo, (k.group, (lo, hi), (off, size))


def test_no_os_no_threads_no_libc_beyond_math_and_string(resnet8):
    _, program, host_mcu = resnet8
    src = program.source
    assert set(re.findall(r'#include [<"]([^>"]+)[>"]', src)) <= ALLOWED_HEADERS
    code = re.sub(r"/\*.*?\*/", "", src, flags=re.S).replace("OPFUSE_", "")  # comments may say "branch-free"
    assert not re.search(r"\b(omp|malloc|calloc|free|printf|clock_gettime|pthread)\b", code)
    assert "OPFUSE_PRAGMA(omp" not in src
    calls = {s for s in host_mcu.undefined if not s.startswith("_") and s != "opfuse_weights"}
    assert all(s in STRING_H or MATH_H.fullmatch(s) for s in calls), calls


def test_header_declares_the_entry_point_and_the_arena(resnet8):
    _, program, _ = resnet8
    h = program.mcu.header
    assert f"#define OPFUSE_ARENA_BYTES {program.arena_bytes}u" in h
    assert "int opfuse_run(const float *const inputs[], float *const outputs[], uint8_t *arena);" in h
    assert "const uint32_t opfuse_weights[" in program.mcu.weights_source
    assert "opfuse_weights" not in program.source.split("int opfuse_run")[0].replace("model.h", "")


def test_outputs_no_kernel_writes_are_copied(tmp_path):
    """A graph input returned as is, a constant output, the same value twice."""
    b = GraphBuilder("passthrough")
    x = b.input("x", (2, 3))
    r = b.op("Relu", x)
    k = b.const("k", np.arange(4, dtype=np.float32))
    g = b.build(r, x, k, r)
    program = generate(g, None, options=CORTEX_M7)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 3}
    outs = HostRun(program, tmp_path).run(feeds)
    assert np.array_equal(outs["x"], feeds["x"])
    assert np.array_equal(outs["k"], np.arange(4, dtype=np.float32))
    assert np.array_equal(outs["relu"], np.maximum(feeds["x"], 0))


def test_runtime_operands_and_epilogues_match_the_host(tmp_path, cache_dir):
    """MatMul of two run-time tensors packs both panels in scratch; Softmax and the epilogue."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("mm")
    a = b.input("a", (2, 19, 37))
    bb = b.input("b", (2, 37, 23))
    y = b.op("MatMul", a, bb)
    z = b.op("Add", y, b.const("bias", rng.standard_normal(23).astype(np.float32)))
    g = b.build(b.op("Softmax", b.op("Relu", z)))
    plan = epilogue_plan(g)
    feeds = reference.random_inputs(g, 2)
    want = build(g, plan, cache_dir=cache_dir, options=PORTABLE).run(feeds)
    got = HostRun(generate(g, plan, options=CORTEX_M7), tmp_path).run(feeds)
    for name in want:
        assert _same_bits(got[name], want[name])


def test_scalar_accumulator_microkernel_names_every_accumulator():
    name, text = microkernel(4, 4, simd="none", scalar_accumulators=True)
    assert len(re.findall(r"c\d_\d \+= v\d \* bj;", text)) == 16 and "acc[" not in text
    assert f"static void {name}(long kc" in text and "_mm256" not in text
    assert CORTEX_M7.simd == "none" and CORTEX_M7.gemm_scalar_accumulators
    b = GraphBuilder("mm")  # and the Cortex-M7 program's GEMM is built with it
    g = b.build(b.op("MatMul", b.input("a", (9, 13)), b.const("w", np.ones((13, 11), np.float32))))
    src = generate(g, None, options=CORTEX_M7).source
    assert len(re.findall(r"c\d_\d \+= v\d \* bj;", src)) == 16  # its one 4 x 4 micro-kernel


@pytest.mark.parametrize("positions, cout, group", [(1, 5, 1), (2, 5, 1), (2, 2, 2)])
def test_int8_conv_of_an_odd_channel_count_writes_only_its_output(positions, cout, group, tmp_path):
    """The int8 convolution's channel passes (``qconv._channel_pairs``: 2 channels at one position;
    ``_channel_pairs2``: the Cortex-M7's 4 at two positions): with 5 output channels the last pass's channels past
    the fifth do not exist, and nothing is written for them (past the output's end); one output channel per group
    of 3 input channels takes the single dot product. Bit-exact."""
    from test_int8_conv import _feeds, qconv_graph
    g = qconv_graph(cin=6, cout=cout, hw=(9, 7), group=group)
    comp = plan_model(g, CompileOptions(target="cortex-m7"))
    options = options_for_target("cortex-m7").with_(int8_conv_positions_per_pass=positions)
    program = generate(comp.graph, comp.plan, memory=comp.memory, options=options)
    feeds = _feeds(g)
    got, want = HostRun(program, tmp_path).run(feeds), reference.run(g, feeds)
    assert all(_same_bits(got[k], want[k]) for k in want)


def test_a_faulting_scatter_index_writes_inside_the_output(tmp_path):
    """ScatterElements with indices past the axis (one too far, and far): the run returns the fault, and the
    writes, clamped to the axis' last row, stay inside the output."""
    b = GraphBuilder("scatter")
    data = b.input("data", (3, 4))
    idx = b.input("idx", (2, 4), np.int64)
    g = b.build(b.op("ScatterElements", data, idx, b.input("upd", (2, 4)), axis=0))
    program = generate(g, None, options=CORTEX_M7)
    feeds = {"data": np.zeros((3, 4), np.float32), "idx": np.array([[0, 1, 2, 3], [3, 3, 9, 2]], np.int64),
             "upd": np.arange(1, 9, dtype=np.float32).reshape(2, 4)}
    HostRun(program, tmp_path).run(feeds, faults=True)


def test_mcu_options_are_checked():
    with pytest.raises(OpfuseError, match="platform"):
        CodegenOptions(platform="rtos")
    assert options_for_target("host") == CodegenOptions()
    assert options_for_target("cortex-m7").platform == "mcu"


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_header_compiles_as_cpp_too(resnet8, tmp_path):
    """The header declares C linkage for a C++ caller (``extern "C"``): a C++ translation unit including it and
    calling ``opfuse_run`` compiles."""
    _, program, _ = resnet8
    (tmp_path / HEADER_NAME).write_text(program.mcu.header)
    caller = tmp_path / "caller.cpp"
    caller.write_text(f'#include "{HEADER_NAME}"\nint call(const float* const* i, float* const* o, uint8_t* a) '
                      "{ return opfuse_run(i, o, a); }\n")
    subprocess.run(["c++", "-std=c++11", "-fsyntax-only", "-I", str(tmp_path), str(caller)], check=True,
                   capture_output=True, text=True)
