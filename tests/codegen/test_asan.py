"""The generated C run under AddressSanitizer: every buffer the caller hands ``opfuse_run`` (each input, each
output, the arena, the weights and the scratch) is its own allocation of exactly the size the program states, so
a read or a write one byte past any of them stops the run with ASan's report. ``run_guarded`` sees stores out
of bounds only; a read past the end of an input (a partial panel of B packed as if whole, mutation testing:
tests/MUTATION.md, codegen/gemm.py's ``_pack_b``) lands in whatever follows it and changes no output.

Each case is the program the native backend builds (the host's vector path, 1 and 2 threads), compiled with a
small C driver into one executable, run in a child process; its outputs are compared with the reference. (``make
fuzz-sanitized`` runs whole cases in Python children under libasan, tests/testing/test_fuzz_ubsan.py: there the
arena, weights and scratch are the runtime's buffers, whose sizes are rounded up, so a read just past them is not
seen; the driver here gives ASan every buffer's exact end.)"""
from __future__ import annotations

import math
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import CompileOptions, plan_model
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.toolchain import BASE_FLAGS, STRICT_FLAGS, THREAD_FLAGS, find_compiler, is_gcc

ASAN_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1"]
ENV = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=99"}


def _asan_available() -> bool:
    try:
        cc = find_compiler()
    except Exception:
        return False
    with tempfile.TemporaryDirectory(prefix="opfuse-asan-") as d:
        probe = Path(d, "probe")
        r = subprocess.run([*cc.split(), *ASAN_FLAGS, "-x", "c", "-", "-o", str(probe)],
                           input="int main(void){return 0;}", capture_output=True, text=True)
        return r.returncode == 0 and subprocess.run([str(probe)], capture_output=True, env=ENV).returncode == 0


pytestmark = pytest.mark.skipif(not _asan_available(), reason="no C compiler with AddressSanitizer here")


def _flags() -> list[str]:
    """The native build's flags for an executable at -O1 (ASan's), in strict C where the compiler is GCC."""
    cc = find_compiler()
    strict = list(STRICT_FLAGS) if is_gcc(cc) else []
    return [f for f in BASE_FLAGS if f not in ("-O3", "-shared", "-fPIC")] + ["-march=native", *THREAD_FLAGS, *strict]


def _driver(program) -> str:
    """main(): each buffer allocated to its exact size (64-byte aligned), the weights and the inputs read from
    files, ``opfuse_run`` called with the thread count given, the outputs written to files."""
    ins = [math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in program.inputs]
    outs = [math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in program.outputs]
    lines = [
        "#define _POSIX_C_SOURCE 200112L",
        "#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>",
        "int opfuse_run(void* const* inputs, void* const* outputs, char* arena, const char* weights, char* scratch,"
        " int threads);",
        "static void* exact(size_t n) { void* p = 0; if (posix_memalign(&p, 64, n ? n : 1)) exit(3); return p; }",
        "static void load(const char* path, void* p, size_t n) {",
        "  FILE* f = fopen(path, \"rb\"); if (!f || fread(p, 1, n, f) != n) exit(4); fclose(f); }",
        "static void save(const char* path, const void* p, size_t n) {",
        "  FILE* f = fopen(path, \"wb\"); if (!f || fwrite(p, 1, n, f) != n) exit(5); fclose(f); }",
        "int main(int argc, char** argv) {",
        f"  const size_t in_bytes[] = {{{', '.join(str(n) for n in ins) or '0'}}};",
        f"  const size_t out_bytes[] = {{{', '.join(str(n) for n in outs) or '0'}}};",
        f"  enum {{ NIN = {len(ins)}, NOUT = {len(outs)} }};",
        "  int threads = atoi(argv[1]);",
        f"  char* weights = exact({len(program.weights)}); load(argv[2], weights, {len(program.weights)});",
        f"  char* arena = exact({program.arena_bytes});",
        f"  char* scratch = exact((size_t){program.scratch_stride} * threads);",
        "  void* in[NIN + 1]; void* out[NOUT + 1];",
        "  for (int i = 0; i < NIN; ++i) { in[i] = exact(in_bytes[i]); load(argv[3 + i], in[i], in_bytes[i]); }",
        "  for (int i = 0; i < NOUT; ++i) { out[i] = exact(out_bytes[i]); memset(out[i], 0, out_bytes[i]); }",
        "  int rc = opfuse_run(in, out, arena, weights, scratch, threads);",
        "  for (int i = 0; i < NOUT; ++i) save(argv[3 + NIN + i], out[i], out_bytes[i]);",
        "  return rc;",
        "}",
    ]
    return "\n".join(lines) + "\n"


def asan_run(graph, feeds, tmp_path: Path, options: CodegenOptions | None = None, threads=(1, 2)):
    """The outputs of ``graph``'s fused program run under ASan at each thread count (asserting a clean run)."""
    comp = plan_model(graph, CompileOptions())
    program = generate(comp.graph, comp.plan, memory=comp.memory, options=options or CodegenOptions())
    (tmp_path / "model.c").write_text(program.source)
    (tmp_path / "main.c").write_text(_driver(program))
    (tmp_path / "weights.bin").write_bytes(program.weights)
    names = [t.name for t in program.inputs]
    for k, name in enumerate(names):
        np.ascontiguousarray(feeds[name], dtype=program.inputs[k].dtype).tofile(tmp_path / f"in{k}.bin")
    exe = tmp_path / "run"
    r = subprocess.run([*find_compiler().split(), *_flags(), *ASAN_FLAGS, str(tmp_path / "model.c"),
                        str(tmp_path / "main.c"), "-lm", "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    results = []
    for n in threads:
        outs = [tmp_path / f"out{j}_{n}.bin" for j in range(len(program.outputs))]
        r = subprocess.run([str(exe), str(n), str(tmp_path / "weights.bin"),
                            *[str(tmp_path / f"in{k}.bin") for k in range(len(names))], *map(str, outs)],
                           capture_output=True, text=True, env={**ENV, "PATH": "/usr/bin:/bin"}, timeout=300)
        assert "AddressSanitizer" not in r.stderr and r.returncode == 0, r.stderr[-4000:]
        results.append({t.name: np.fromfile(o, dtype=t.dtype).reshape(t.shape)
                        for t, o in zip(program.outputs, outs, strict=True)})
    return program, results


def _assert_reference(graph, feeds, results, atol: float) -> None:
    """Each thread count's outputs close to the reference executor's."""
    want = reference.run(graph, feeds)
    for got in results:
        for name, v in want.items():
            np.testing.assert_allclose(got[name], v, rtol=1e-4, atol=atol)


def _w(rng, *shape):
    return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def _pointwise(cin: int, cout: int, h: int, w: int, act: str = "Relu"):
    rng = np.random.default_rng(cin * 1000 + cout + h * w)
    b = GraphBuilder("pw")
    x = b.input("x", (1, cin, h, w))
    y = b.op(act, b.op("Conv", x, b.const("w", _w(rng, cout, cin, 1, 1)), b.const("b", _w(rng, cout)), name="pw"))
    return b.build(y), {"x": rng.standard_normal((1, cin, h, w)).astype(np.float32)}


@pytest.mark.parametrize("cin, cout, h, w", [
    (16, 24, 3, 11),   # 33 positions, few output channels: positions as the GEMM's rows, B the weights
    (8, 16, 9, 89),    # 801 positions: whole panels and one column (N % NR == 1 with AVX-512's 32, AVX2's 16)
    (32, 16, 5, 5),    # 25: one part panel
    (8, 64, 7, 9),     # 63: a whole panel and 31 columns
    (24, 40, 8, 8),    # 64: whole panels only
])
def test_a_pointwise_convolution_reads_no_byte_past_its_input(cin, cout, h, w, tmp_path):
    """The input is B: its last channel's row ends where its allocation does, so a part panel packed as whole
    reads past it."""
    graph, feeds = _pointwise(cin, cout, h, w)
    _assert_reference(graph, feeds, asan_run(graph, feeds, tmp_path)[1], atol=1e-4)


def test_a_small_network_reads_and_writes_only_its_buffers(tmp_path):
    """Convolutions (3x3, strided, depthwise, pointwise), a residual add, pooling and a classifier: every
    kernel's reads and writes inside the caller's buffers, at 1 and 2 threads."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("small")
    x = b.input("x", (1, 3, 17, 13))
    c1 = b.op("Relu", b.op("Conv", x, b.const("w1", _w(rng, 16, 3, 3, 3)), pads=[1, 1, 1, 1], strides=[2, 2]))
    d1 = b.op("Relu", b.op("Conv", c1, b.const("w2", _w(rng, 16, 1, 3, 3)), group=16, pads=[1, 1, 1, 1]))
    p1 = b.op("Conv", d1, b.const("w3", _w(rng, 16, 16, 1, 1)))
    s = b.op("Relu", b.op("Add", p1, c1))
    g = b.op("GlobalAveragePool", s)
    y = b.op("Gemm", b.op("Flatten", g), b.const("fc", _w(rng, 10, 16)), b.const("fb", _w(rng, 10)), transB=1)
    graph = b.build(b.op("Softmax", y, axis=1))
    feeds = {"x": rng.standard_normal((1, 3, 17, 13)).astype(np.float32)}
    _assert_reference(graph, feeds, asan_run(graph, feeds, tmp_path)[1], atol=1e-5)


def test_the_driver_sees_a_read_past_an_input(tmp_path):
    """The harness itself: a program whose kernel reads one float past its input is stopped by ASan."""
    graph, feeds = _pointwise(16, 24, 3, 11)
    comp = plan_model(graph, CompileOptions())
    program = generate(comp.graph, comp.plan, memory=comp.memory, options=CodegenOptions())
    (tmp_path / "model.c").write_text(program.source + "\nfloat opfuse_probe_past(const float* p) { return p[%d]; }\n"
                                      % (16 * 33))
    main = _driver(program).replace("  int rc = opfuse_run(", "  { float opfuse_probe_past(const float*); "
                                    "if (threads == 7) return (int)opfuse_probe_past((const float*)in[0]); }\n"
                                    "  int rc = opfuse_run(")
    (tmp_path / "main.c").write_text(main)
    (tmp_path / "weights.bin").write_bytes(program.weights)
    feeds["x"].tofile(tmp_path / "in0.bin")
    exe = tmp_path / "run"
    subprocess.run([*find_compiler().split(), *_flags(), *ASAN_FLAGS, str(tmp_path / "model.c"),
                    str(tmp_path / "main.c"), "-lm", "-o", str(exe)], check=True, capture_output=True)
    args = [str(tmp_path / "weights.bin"), str(tmp_path / "in0.bin"), str(tmp_path / "out.bin")]
    ok = subprocess.run([str(exe), "1", *args], capture_output=True, text=True, env=ENV)
    assert ok.returncode == 0, ok.stderr[-2000:]
    bad = subprocess.run([str(exe), "7", *args], capture_output=True, text=True, env=ENV)
    assert bad.returncode == 99 and "heap-buffer-overflow" in bad.stderr
