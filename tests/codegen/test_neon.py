"""The aarch64 NEON build (``vector_isa="neon"``) and its runner under qemu-aarch64 (``runtime/aarch64.py``).

Float: the AdvSIMD micro-kernels (6 x 16, ``vfmaq_laneq_f32``) give the same bits as the AVX2/FMA ones (one fused
multiply-add per product, the same panels, k in the same order); whole zoo models equal the reference within the
x86 tests' tolerance, and the plain C99 build (``simd="none"``) compiled for aarch64 gives the same bits as on x86.
Int8: the ``sdot`` GEMM is bit-exact against the reference, as are its Armv8.0 form (``vmull_s8`` + ``vpadalq_s16``,
compiled without the dot product) and its ``#else`` (plain C over the same packed words, what x86 compiles of it),
and the NEON build equals the plain build bit for bit.

The QEMU tests need aarch64-linux-gnu-gcc and qemu-aarch64 (``make aarch64-tools``) and skip without them. QEMU's
run time is no measure of an Arm core's speed: nothing here times anything."""
from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from cg_support import assert_close
from opfuse.codegen import generate
from opfuse.codegen.microkernel import NEON_GUARD, fits_neon, microkernel
from opfuse.codegen.options import PORTABLE, CodegenOptions
from opfuse.compiler import CompileOptions, plan_model
from opfuse.errors import InputError
from opfuse.ops import GraphBuilder
from opfuse.runtime import aarch64, reference
from opfuse.runtime.native import build
from opfuse.targets.calibrate import simd_isa_of
from test_int8_host import CASES, _built_with, _feeds, qconv

needs_tools = pytest.mark.skipif(not aarch64.tools_available(),
                                 reason="aarch64 tests need aarch64-linux-gnu-gcc and qemu-aarch64: run "
                                        "`make aarch64-tools`")
NEON = CodegenOptions(vector_isa="neon")


def _x86_fma() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx2" in flags and "fma" in flags


# Code generation (no toolchain needed) -------------------------------------------------------------------------

def test_register_block_fits_the_32_q_registers():
    assert fits_neon(6, 16) and fits_neon(8, 12) and fits_neon(1, 48)  # 24 + 4 + 2, 24 + 3 + 2, 12 + 12 + 1
    assert not fits_neon(8, 16) and not fits_neon(6, 18)                # 32 + 4 + 2 registers; 18 floats
    o = NEON.resolved("avx2")
    assert (o.vector_isa, o.gemm_mr, o.gemm_nr) == ("neon", 6, 16)
    assert CodegenOptions(vector_isa="neon", simd="none").resolved("neon").vector_isa == "avx2"  # the plain block


def test_an_aarch64_host_resolves_to_neon():
    assert simd_isa_of("aarch64", 16) == simd_isa_of("arm64", 16) == "neon"
    assert simd_isa_of("x86_64", 64) == "avx512" and simd_isa_of("x86_64", 32) == "avx2"


def test_micro_kernel_neon_body_comes_first_and_only_for_neon():
    fn, text = microkernel(6, 16, "packed", "koff", neon=True, epilogue="br")
    assert fn.endswith("_n") and text.index(f"#if {NEON_GUARD}") < text.index("#elif defined(__AVX2__)")
    assert "#include <arm_neon.h>" in text and text.count("vfmaq_laneq_f32") == 4 * 4 and "vfmaq_lane_f32" in text
    assert "vbslq_f32(vcltq_f32(y, zero), zero, y)" in text  # Relu as y < 0 ? 0 : y (-0 and NaN kept)
    _, rows = microkernel(6, 16, "rows", "packed", neon=True)
    assert "vfmaq_n_f32" in rows and "vfmaq_laneq_f32" not in rows  # A in place: one scalar per row
    for kw in ({"neon": False}, {"neon": True, "simd": "none"}):
        assert "arm_neon" not in microkernel(6, 16, **kw)[1]


def _mm(m=37, k=70, n=50, seed=0):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("mm")
    y = b.op("MatMul", b.input("x", (m, k)), b.const("w", rng.standard_normal((k, n)).astype(np.float32)))
    return b.build(b.op("Relu", b.op("Add", y, b.const("bias", rng.standard_normal((n,)).astype(np.float32)))))


def _conv(k=3, cin=13, cout=20, hw=(17, 15), seed=0):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("conv")
    w = b.const("w", rng.standard_normal((cout, cin, k, k)).astype(np.float32))
    y = b.op("Conv", b.input("x", (1, cin) + hw), w, b.const("b", rng.standard_normal((cout,)).astype(np.float32)),
             pads=[k // 2] * 4)
    return b.build(b.op("Relu", y))


def test_same_c_twice_and_the_x86_builds_have_no_neon():
    g = _conv()
    plan = plan_model(g).plan
    a, b = generate(plan.graph, plan, options=NEON), generate(plan.graph, plan, options=NEON)
    assert a.source == b.source and a.weights == b.weights and "vfmaq_n_f32" in a.source
    for isa in ("avx2", "avx512"):
        assert "arm_neon" not in generate(plan.graph, plan, options=CodegenOptions(vector_isa=isa)).source


def test_the_neon_c_compiled_for_x86_takes_its_plain_branches():
    """The NEON-targeted C is portable: on x86 its float micro-kernels are the AVX2 bodies and its int8 GEMM the
    plain C over the packed quads, which equals the reference bit for bit."""
    g = qconv(cin=9, cout=10, residual=True, stride=2, hw=(11, 13))
    comp = plan_model(g)
    feeds = _feeds(g)
    want = reference.run(g, feeds)
    program = generate(comp.plan.graph, comp.plan, options=NEON)
    assert any("NEON s8 x s8 GEMM (sdot by lane;" in n for k in program.kernels for n in k.notes)
    got = build(comp.plan.graph, comp.plan, options=NEON).run(feeds)
    np.testing.assert_array_equal(got["y"] if "y" in got else next(iter(got.values())), next(iter(want.values())))
    f = _mm()
    fc = plan_model(f)
    ff = reference.random_inputs(f, 0)
    assert_close(build(fc.plan.graph, fc.plan, options=NEON).run(ff), reference.run(f, ff))


@pytest.mark.parametrize("params, note", [
    ({"group": 6, "cin": 6, "cout": 6}, "NEON int16 planes (vmlal_n_s16)"),
    ({"group": 5, "cin": 5, "cout": 5, "wmax": 30000, "stride": 2}, "NEON int16 planes (vmlal_n_s16)"),
    ({"group": 3, "cin": 3, "cout": 3, "wmax": 30000, "hw": (16, 6)}, "NEON int16 planes (vmlal_n_s16)"),
    ({"cin": 7, "cout": 5}, "NEON s8 x s8 GEMM"),
], ids=["depthwise", "depthwise-int16-weights", "depthwise-int16-weights-tall", "gemm"])
def test_the_neon_int8_kernels_and_their_notes(params, note):
    g = qconv(**params)
    comp = plan_model(g)
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=NEON).kernels for n in k.notes]
    assert any(note in n for n in notes) and not any("not used" in n for n in notes), notes


@pytest.mark.parametrize("params, reason", [
    ({"wmax": 30000, "cin": 4, "cout": 6}, "NEON sdot needs int8 weights"),
    ({"x_dtype": "uint8", "zp": -3, "cin": 5}, "an 8-bit zero point"),
], ids=["wide-weights", "zero-point"])
def test_where_the_neon_int8_gemm_is_not_used_the_notes_say_why(params, reason):
    g = qconv(**params)
    comp = plan_model(g)
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=NEON).kernels for n in k.notes]
    assert any("host int8 kernel not used" in n and reason in n for n in notes), notes
    assert not any("NEON s8 x s8 GEMM" in n for n in notes)
    feeds = _feeds(g)
    np.testing.assert_array_equal(next(iter(build(comp.plan.graph, comp.plan, options=NEON).run(feeds).values())),
                                  next(iter(reference.run(g, feeds).values())))


def _quantized_to_last_int8(name: str, last: str):
    """The quantized zoo model up to its int8 tensor ``last`` (the float tail after it rounds differently in C)."""
    from opfuse.quantization import quantize
    qmodel = quantize(f"zoo:{name}", calibration_random=2).model
    cut = next(i for i, n in enumerate(qmodel.graph.node) if last in n.output)
    del qmodel.graph.node[cut + 1:]
    del qmodel.graph.output[:]
    qmodel.graph.output.append(helper.make_tensor_value_info(last, TensorProto.INT8, None))
    comp = plan_model(qmodel)
    feeds = reference.random_inputs(comp.graph, 0)
    want = reference.run(plan_model(qmodel, CompileOptions(fuse=False)).graph, feeds)
    assert want[last].dtype == np.int8 and want[last].std() > 1  # not all clamped
    return comp, feeds, want


def test_the_plain_branch_reads_an_in_place_input_before_storing_over_it():
    """int8 ds_cnn's 1x1 convs store their output over their input (memory/inplace.py). The vector kernels read
    the whole image into words first; the plain C under ``#else`` (x86 without AVX2, aarch64 without the dot
    product) now copies it first too: before, 5663 of pw4's values came out wrong."""
    comp, feeds, want = _quantized_to_last_int8("ds_cnn", "pw4_relu_quantized")
    got = _built_with(comp.plan.graph, comp.plan, CodegenOptions(vector_isa="avx512"), "-mno-avx2").run(feeds)
    np.testing.assert_array_equal(got["pw4_relu_quantized"], want["pw4_relu_quantized"])
    got = build(comp.plan.graph, comp.plan, memory=comp.memory, options=NEON).run(feeds)  # #else on x86
    np.testing.assert_array_equal(got["pw4_relu_quantized"], want["pw4_relu_quantized"])


# Under qemu-aarch64 -------------------------------------------------------------------------------------------

def _qemu(graph, plan, feeds, options=NEON, arch="dotprod", memory=None, workdir=None):
    program = aarch64.generate_aarch64(graph, plan, memory, options=options)
    return aarch64.run_on_qemu(program, feeds, arch=arch, workdir=workdir).outputs


INT8_QEMU = ["3x3", "1x1-flat", "stride2", "dilation2", "odd-channels", "grouped-odd", "rect-kernel",
             "mono-10x4-stride2", "mono-dilated-uint8", "uint8-in-out", "residual-uint8-stride2", "shifts-mixed",
             "int8-zero-point-extremes", "batch3-residual", "deep-small-plane", "dw", "dw-stride2-odd",
             "dw-residual-uint8", "dw-dilation", "batch2-dw-rows"]
INT8_QEMU_PLAIN = ["3x3", "mono-10x4-stride2", "uint8-in-out", "residual-uint8-stride2", "batch2-grouped-uint8",
                   "dw-stride2-odd"]


@needs_tools
@pytest.mark.parametrize("case", INT8_QEMU, ids=INT8_QEMU)
def test_int8_conv_with_sdot_is_bit_exact(case):
    g = qconv(**CASES[case])
    comp = plan_model(g)
    feeds = _feeds(g)
    want = reference.run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(_qemu(comp.plan.graph, comp.plan, feeds)[name], want[name])


@needs_tools
@pytest.mark.parametrize("case", INT8_QEMU_PLAIN, ids=INT8_QEMU_PLAIN)
def test_int8_conv_without_the_dot_product_is_bit_exact(case):
    """Armv8.0-A without FEAT_DotProd: ``vmull_s8`` + ``vpadalq_s16`` over the same signed quads."""
    g = qconv(**CASES[case])
    comp = plan_model(g)
    feeds = _feeds(g)
    want = reference.run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(_qemu(comp.plan.graph, comp.plan, feeds, arch="neon")[name], want[name])


@needs_tools
def test_int8_requantization_in_vectors_at_its_extremes_is_bit_exact():
    """Inputs at the 8-bit extremes, multipliers near 2^31, shifts from 1 (a tie at every odd accumulator) to 62
    and residual multipliers up to 2^52 (both halves of the split ``rmult``): every lane as the reference's."""
    rng = np.random.default_rng(11)
    b = GraphBuilder("q")
    x = b.input("x", (1, 14, 6, 6), "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(127, np.int32)))
    w = np.where(rng.random((24, 14, 3, 3)) < 0.5, -127, 127).astype(np.int32)
    acc = b.op("Conv", xc, b.const("w", w), name="conv", pads=[1] * 4)
    shift = np.concatenate([np.arange(1, 13), rng.integers(40, 63, 12)]).astype(np.int32)
    mult = rng.integers(1 << 30, 1 << 31, 24).astype(np.int32)
    r = b.input("r", (1, 24, 6, 6), "int8")
    rc = b.op("Sub", b.op("Cast", r, to=int(TensorProto.INT32)), b.const("rzp", np.array(-128, np.int32)))
    rm = rng.integers(1, 1 << 52, 24, dtype=np.int64) >> rng.integers(0, 40, 24)
    y = b.op("Requantize", acc, b.const("m", mult.reshape(1, 24, 1, 1)), b.const("s", shift.reshape(1, 24, 1, 1)),
             rc, b.const("rm", rm.reshape(1, 24, 1, 1)), zero_point=-3, lo=-128, hi=127, to=int(TensorProto.INT8))
    g = b.build(y)
    comp = plan_model(g)
    feeds = {"x": np.where(rng.random((1, 14, 6, 6)) < 0.5, -128, 127).astype(np.int8),
             "r": rng.integers(-128, 128, (1, 24, 6, 6)).astype(np.int8)}
    want = reference.run(g, feeds)
    (name,) = want
    assert np.unique(want[name]).size > 3  # not everything clamped
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan)
    assert "opfuse_q8n_requantize(" in program.source.split("static void k0_", 1)[-1]
    for arch in ("dotprod", "neon"):
        np.testing.assert_array_equal(aarch64.run_on_qemu(program, feeds, arch=arch).outputs[name], want[name])


@needs_tools
def test_the_executable_runs_sdot_and_fmla_by_lane(tmp_path):
    g = qconv(cin=16, cout=24, hw=(8, 12))
    comp = plan_model(g)
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan)
    exe = aarch64.build_executable(program, tmp_path)
    objdump = aarch64.find_tools().gcc.replace("-gcc", "-objdump")
    text = subprocess.run([objdump, "-d", str(exe.path)], capture_output=True, text=True, check=True).stdout
    assert "sdot\tv" in text
    exe = aarch64.build_executable(program, tmp_path / "v8", arch="neon")
    text = subprocess.run([objdump, "-d", str(exe.path)], capture_output=True, text=True, check=True).stdout
    assert "sdot\tv" not in text and "smull\tv" in text and "sadalp\tv" in text
    f = _conv()
    fc = plan_model(f)
    exe = aarch64.build_executable(aarch64.generate_aarch64(fc.plan.graph, fc.plan), tmp_path / "f")
    text = subprocess.run([objdump, "-d", str(exe.path)], capture_output=True, text=True, check=True).stdout
    assert "fmla\tv" in text and ".s[" in text  # a multiply-add by element


@needs_tools
@pytest.mark.skipif(not _x86_fma(), reason="compares with this x86 host's AVX2/FMA micro-kernels")
@pytest.mark.parametrize("make", [_mm, _conv, lambda: _conv(1, 30, 40, (9, 9)), lambda: _mm(1, 100, 70)],
                         ids=["matmul-bias-relu", "conv3x3", "conv1x1", "gemv"])
def test_neon_micro_kernels_give_the_avx2_fma_bits(make):
    g = make()
    comp = plan_model(g)
    feeds = reference.random_inputs(g, 1)
    o = CodegenOptions(vector_isa="avx2", winograd="off")
    x86 = build(comp.plan.graph, comp.plan, options=o, threads=1).run(feeds)
    arm = _qemu(comp.plan.graph, comp.plan, feeds, options=o)
    for name in x86:
        np.testing.assert_array_equal(arm[name], x86[name])


@needs_tools
def test_a_block_past_the_32_q_registers_stores_finished_rows_under_qemu():
    """A register block set by hand that does not fit the 32 q registers (8 x 32) is computed in groups of rows,
    each group finishing its rows (bias, Relu) and storing them itself; results equal the reference."""
    assert not fits_neon(8, 32)
    g = _conv(1, 6, 20, (16, 16))  # 1x1 over 256 positions: whole 32-wide panels, the micro-kernel stores
    comp = plan_model(g)
    feeds = reference.random_inputs(g, 0)
    o = NEON.with_(gemm_mr=8, gemm_nr=32)
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan, None, options=o)
    notes = [n for k in program.kernels for n in k.notes]
    assert "GEMM 'conv': output bias and Relu applied and stored by the micro-kernel" in notes
    ukr = re.search(r"static void opfuse_ukr_\w+\(.*?\n}\n", program.source, re.S)
    assert ukr and "vfmaq_lane_f32" in ukr.group(0)  # the micro-kernel itself has its AdvSIMD body
    want = reference.run(g, feeds)
    assert (next(iter(want.values())) == 0).any()  # the Relu clips
    assert_close(_qemu(comp.plan.graph, comp.plan, feeds, options=o), want)


FLOAT_ZOO = ["resnet8", "ds_cnn", pytest.param("mobilenet_v1_025_96", marks=pytest.mark.slow),
             pytest.param("bert_layer", marks=pytest.mark.slow)]


@needs_tools
@pytest.mark.parametrize("name", FLOAT_ZOO)
def test_float_zoo_model_under_qemu(name):
    """The NEON build within the x86 tests' tolerance of the reference; the plain build (``simd="none"``, no
    AdvSIMD at all: ``+nosimd``) the same bits on aarch64 as on x86."""
    comp = plan_model(f"zoo:{name}")
    feeds = reference.random_inputs(comp.graph, 0)
    want = reference.run(comp.graph, feeds)
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan, comp.memory)
    assert any("NEON" in n for k in program.kernels for n in k.notes) or "vfmaq_laneq_f32" in program.source
    assert_close(aarch64.run_on_qemu(program, feeds).outputs, want)
    plain = _qemu(comp.plan.graph, comp.plan, feeds, options=PORTABLE, arch="none", memory=comp.memory)
    x86 = build(comp.plan.graph, comp.plan, memory=comp.memory, options=PORTABLE, threads=1).run(feeds)
    for out in want:
        np.testing.assert_array_equal(plain[out], x86[out])


INT8_ZOO = [("resnet8", "stack3_relu_quantized", 9, 0), ("ds_cnn", "pw4_relu_quantized", 5, 4),
            pytest.param("mobilenet_v1_025_96", "pw13_relu_quantized", 14, 13, marks=pytest.mark.slow)]


@needs_tools
@pytest.mark.parametrize("name, last, gemms, depthwise", INT8_ZOO)
def test_int8_zoo_model_under_qemu_is_bit_exact(name, last, gemms, depthwise):
    """The fused int8 model up to its last int8 tensor: the sdot kernels (and the Armv8.0 ones) equal the reference
    on the unfused graph, and the NEON build the plain C99 build (``simd="none"``) compiled for aarch64."""
    comp, feeds, want = _quantized_to_last_int8(name, last)
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan, comp.memory)
    assert sum("NEON s8 x s8 GEMM" in n for k in program.kernels for n in k.notes) == gemms
    assert sum("NEON int16 planes" in n for k in program.kernels for n in k.notes) == depthwise
    neon = aarch64.run_on_qemu(program, feeds).outputs
    np.testing.assert_array_equal(neon[last], want[last])
    np.testing.assert_array_equal(aarch64.run_on_qemu(program, feeds, arch="neon").outputs[last], want[last])
    plain = _qemu(comp.plan.graph, comp.plan, feeds, options=PORTABLE, memory=comp.memory)
    np.testing.assert_array_equal(neon[last], plain[last])


@needs_tools
def test_int8_ds_cnn_whole_model_under_qemu():
    """The quantized DS-CNN whole (the fc and the float tail too), every int8 activation an output: each equal to
    the reference's, the logits within the M7 test's tolerance (``tests/runtime/test_mcu_qemu.py``)."""
    from opfuse.quantization import quantize
    model = quantize("zoo:ds_cnn", calibration_random=2).model
    quantized = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    model.graph.output.extend(helper.make_tensor_value_info(q, TensorProto.INT8, None) for q in quantized)
    comp = plan_model(model)
    program = aarch64.generate_aarch64(comp.graph, comp.plan, comp.memory)
    feeds = reference.random_inputs(comp.graph, 3)
    got = aarch64.run_on_qemu(program, feeds).outputs
    want = reference.run(comp.graph, feeds)
    for name in quantized:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    np.testing.assert_allclose(got["output"], want["output"], rtol=1e-5, atol=1e-7)


@needs_tools
def test_the_harness_refuses_a_wrong_input_file_in_one_line(tmp_path):
    b = GraphBuilder("relu")
    g = b.build(b.op("Relu", b.input("x", (2, 3))))
    program = aarch64.generate_aarch64(g, None)
    exe = aarch64.build_executable(program, tmp_path)
    (tmp_path / "short.bin").write_bytes(b"\0" * 7)
    tools = aarch64.find_tools()
    proc = subprocess.run(aarch64.qemu_command(tools, exe.path, [str(tmp_path / "weights.bin"),
                                                                 str(tmp_path / "short.bin"), str(tmp_path / "o")]),
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "exactly 24 bytes" in proc.stderr
    proc = subprocess.run(aarch64.qemu_command(tools, exe.path, []), capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("usage:")
    with pytest.raises(InputError, match="shape"):
        aarch64.run_on_qemu(program, {"x": np.zeros((3, 2), np.float32)})


@needs_tools
def test_cli_run_backend_aarch64(tmp_path):
    out = tmp_path / "o.npz"
    proc = subprocess.run([sys.executable, "-m", "opfuse", "run", "zoo:ds_cnn", "--backend", "aarch64", "--compare",
                           "reference", "--json", "-q", "--outputs", str(out)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["backend"] == "aarch64" and all(o["ok"] for o in result["compare"]["outputs"].values())
    assert out.exists()


def test_cli_without_the_tools_says_what_to_install_in_one_line(tmp_path):
    env = {"PATH": str(tmp_path), "PYTHONPATH": ":".join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-m", "opfuse", "run", "zoo:ds_cnn", "--backend", "aarch64", "-q"],
                          capture_output=True, text=True, check=False, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "make aarch64-tools" in proc.stderr
