"""The Cortex-M7 backend under QEMU: same bits as the host build, an exact instruction count.

Needs arm-none-eabi-gcc, newlib and qemu-system-arm (``make mcu-tools`` installs them); without
them these tests skip, saying so."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from opfuse.codegen.program import TensorSpec
from opfuse.compiler import CompileOptions, plan_model
from opfuse.errors import InputError
from opfuse.ops import GraphBuilder
from opfuse.runtime import mcu, reference
from opfuse.runtime.native import build
from opfuse.codegen.options import PORTABLE

needs_tools = pytest.mark.skipif(not mcu.tools_available(),
                                 reason="Cortex-M7 tests need arm-none-eabi-gcc, newlib and qemu-system-arm: "
                                        "run `make mcu-tools`")


def test_ticks_to_instructions():
    # shift 7: 128 ns an instruction, 40 ns a tick: 1000 instructions are 3200 ticks.
    assert mcu.instructions_from_ticks(3200 + 16, 12, 16) == 1000
    # Past 2^32 ticks the coarse timer (256 ticks a count) says how often the fine one wrapped.
    total = 2 ** 32 + 3200
    assert mcu.instructions_from_ticks(total % 2 ** 32, total // 256, 0) == total * 40 // 128


def test_inputs_are_checked_before_anything_is_built():
    b = GraphBuilder("relu")
    g = b.build(b.op("Relu", b.input("x", (2, 3))))
    program = mcu.generate_mcu(g, None)
    with pytest.raises(InputError, match="'x'"):
        mcu.run_on_qemu(program, {})
    with pytest.raises(InputError, match="shape"):
        mcu.run_on_qemu(program, {"x": np.zeros((3, 2), np.float32)})


def _nop_program(n: int):
    """A stand-in library whose opfuse_run executes exactly ``n`` more instructions per ``n``."""
    source = ('#include "model.h"\n'
              "int opfuse_run(const float *const inputs[], float *const outputs[], uint8_t *arena) {\n"
              f'  (void)inputs; (void)arena;\n  __asm__ volatile(".rept {n}\\n\\tnop\\n\\t.endr");\n'
              "  outputs[0][0] = 1.0f;\n  return 0;\n}\n")
    header = ("#include <stdint.h>\n#define OPFUSE_ARENA_BYTES 16u\n#define OPFUSE_ARENA_ALIGN 8u\n"
              "int opfuse_run(const float *const inputs[], float *const outputs[], uint8_t *arena);\n")
    files = {"model.c": source, "model.h": header, "model_weights.c": "const int opfuse_unused = 0;\n"}
    return SimpleNamespace(source=source, mcu=SimpleNamespace(files=lambda _: files), inputs=[],
                           outputs=[TensorSpec("y", (1,), np.dtype(np.float32))], arena_bytes=16,
                           options=SimpleNamespace(profile=False), kernels=[])


@needs_tools
def test_the_count_is_exact(tmp_path):
    counts = []
    for n in (1000, 5000):
        program = _nop_program(n)
        fw = mcu.build_firmware(program, {}, tmp_path / str(n))
        res = mcu.run_firmware(program, fw)
        assert res.outputs["y"][0] == 1.0
        counts.append(res.instructions)
    assert counts[1] - counts[0] == 4000


@pytest.fixture(scope="module")
def resnet8_run(tmp_path_factory):
    if not mcu.tools_available():
        pytest.skip("Cortex-M7 tests need arm-none-eabi-gcc, newlib and qemu-system-arm: run `make mcu-tools`")
    comp = plan_model("zoo:resnet8", CompileOptions(target="cortex-m7"))
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    feeds = reference.random_inputs(comp.graph, 0)
    result = mcu.run_on_qemu(program, feeds, tmp_path_factory.mktemp("resnet8-m7"))
    return comp, program, feeds, result


@needs_tools
def test_resnet8_on_the_m7_matches_the_host_bit_for_bit(resnet8_run, cache_dir):
    comp, _, feeds, res = resnet8_run
    host = build(comp.graph, comp.plan, memory=comp.memory, cache_dir=cache_dir, options=PORTABLE).run(feeds)
    ref = reference.run(comp.original, feeds)
    for name, want in host.items():
        got = res.outputs[name]
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        np.testing.assert_allclose(got, ref[name], rtol=1e-4, atol=1e-6)


@needs_tools
def test_resnet8_counts_sizes_and_stack(resnet8_run):
    _, program, _, res = resnet8_run
    again = mcu.run_firmware(program, res.firmware)
    assert again.instructions == res.instructions > 1_000_000  # deterministic
    assert 0 < res.stack_bytes < 4096
    lib = res.firmware.library
    assert lib.flash > len(program.weights) and lib.bss == 0  # no static state: everything is in the arena
    assert res.firmware.image.bss >= program.arena_bytes


@needs_tools
def test_a_fault_on_the_m7_is_the_references_input_error(tmp_path):
    """An integer division by zero makes opfuse_run return its fault code on the M7 too."""
    b = GraphBuilder("div")
    g = b.build(b.op("Div", b.input("a", (3,), np.int32), b.input("d", (3,), np.int32), name="the_div"))
    program = mcu.generate_mcu(g, None)
    assert program.faults == ["node 'the_div' (Div): integer division by zero"]
    feeds = {"a": np.array([7, -2 ** 31, 5], np.int32), "d": np.array([2, -1, 1], np.int32)}
    got = mcu.run_on_qemu(program, feeds, tmp_path / "ok").outputs
    np.testing.assert_array_equal(got[g.outputs[0].name], reference.run(g, feeds)[g.outputs[0].name])
    feeds["d"][2] = 0
    with pytest.raises(InputError, match="node 'the_div' \\(Div\\): integer division by zero"):
        mcu.run_on_qemu(program, feeds, tmp_path / "fault")


@needs_tools
def test_roi_align_and_reverse_sequence_faults_on_the_m7(tmp_path):
    """This session's run-time faults in the firmware too: a RoiAlign box that is not finite or too large (two
    flags of one node), a ReverseSequence length past the time axis; good inputs give the reference's values."""
    b = GraphBuilder("faults")
    y = b.op("RoiAlign", b.input("x", (1, 2, 6, 6)), b.input("r", (2, 4)), b.input("i", (2,), np.int64),
             output_height=2, output_width=2, name="the_roi")
    rs = b.op("ReverseSequence", b.input("s", (4, 3, 2)), b.input("l", (3,), np.int64), batch_axis=1, time_axis=0,
              name="the_rev")
    g = b.build(b.op("Relu", y), rs)
    program = mcu.generate_mcu(g, None)
    rng = np.random.default_rng(0)
    good = {"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32), "r": np.array([[0, 0, 3, 3], [1, 1, 5, 4]],
            np.float32), "i": np.zeros(2, np.int64), "s": rng.standard_normal((4, 3, 2)).astype(np.float32),
            "l": np.array([1, 4, 2], np.int64)}
    got = mcu.run_on_qemu(program, good, tmp_path / "ok").outputs
    want = reference.run(g, good)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    bad = [({"r": np.array([[0, 0, 3, 3], [1, 1, np.nan, 4]], np.float32)}, "not finite"),
           ({"r": np.array([[0, 0, 3, 3], [1, 1, 1e12, 4]], np.float32)}, "sampling grid"),
           ({"l": np.array([1, 5, 2], np.int64)}, "sequence_lens must be in")]
    for k, (change, message) in enumerate(bad):
        with pytest.raises(InputError, match=message):
            mcu.run_on_qemu(program, dict(good, **change), tmp_path / f"fault{k}")


@needs_tools
def test_per_kernel_counts_add_up_and_do_not_change_the_bits(tmp_path):
    """A profile build marks every kernel: the per-kernel counts sum to the plain build's total
    (within the marks' call sequence), and the outputs are the same bits."""
    b = GraphBuilder("two")
    x = b.input("x", (1, 8, 8, 8))
    w = b.const("w", np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype(np.float32))
    y = b.op("Relu", b.op("Conv", x, w, pads=[1, 1, 1, 1]))
    g = b.build(b.op("MaxPool", y, kernel_shape=[2, 2], strides=[2, 2]))
    feeds = reference.random_inputs(g, 0)
    plain = mcu.run_on_qemu(mcu.generate_mcu(g, None), feeds, tmp_path / "plain")
    marked_program = mcu.generate_mcu(g, None, marks=True)
    assert "opfuse_kernel_mark" in marked_program.source
    marked = mcu.run_on_qemu(marked_program, feeds, tmp_path / "marked")
    for name, out in plain.outputs.items():
        assert out.tobytes() == marked.outputs[name].tobytes()
    counts = marked.kernel_instructions
    assert sorted(counts) == [i for i, k in enumerate(marked_program.kernels) if k.function]
    assert all(c > 0 for c in counts.values())
    # The plain total adds only the call sequence around opfuse_run to the kernels' sum.
    assert 0 <= plain.instructions - sum(counts.values()) < 40 * (len(counts) + 1)


@needs_tools
def test_integer_convs_on_the_m7_match_the_reference_exactly(tmp_path):
    """A QDQ model's DQ -> Conv -> [Relu] -> Q become int32 Convs with the fixed-point Requantize, and its
    fc's DQ -> Flatten -> Gemm -> Q an int32 MatMul with one (the integer_matmul rule): the plain C, int64
    products included, on the emulated M7."""
    from onnx import TensorProto, helper

    from opfuse.quantization import quantize
    model = quantize("zoo:ds_cnn", calibration_random=2).model
    # every activation's int8 values are outputs too, to compare them and not only the float logits
    quantized = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    model.graph.output.extend(helper.make_tensor_value_info(q, TensorProto.INT8, None) for q in quantized)
    comp = plan_model(model, CompileOptions(target="cortex-m7"))
    assert sum(n.op_type == "Requantize" for n in comp.graph.nodes) == 10  # 9 convs and the fc
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    feeds = reference.random_inputs(comp.graph, 3)
    got = mcu.run_on_qemu(program, feeds, tmp_path).outputs
    want = reference.run(comp.graph, feeds)
    for name in quantized:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    np.testing.assert_allclose(got["output"], want["output"], rtol=1e-5, atol=1e-7)


@needs_tools
def test_int8_resnet8_on_the_m7_int8_between_kernels_exact(tmp_path):
    """The quantized ResNet-8 as `compile --int8` plans it: every Conv an integer kernel (SMLAD), the
    residual blocks' Requantize with its second term, int8 tensors between kernels; the logits equal
    the reference's on the emulated M7."""
    from opfuse.quantization import quantize
    model = quantize("zoo:resnet8", calibration_random=2).model
    comp = plan_model(model, CompileOptions(target="cortex-m7"))
    record = comp.report["int8"]
    assert record["tensors_between_kernels"]["other"] <= 1  # the flattened pool output's dequantization aside
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    # per-channel shifts: opfuse_requantize_hi (all shifts >= 33) or _pc, the residual's product in its argument
    assert "__smlad" in program.source
    assert "opfuse_requantize_hi(" in program.source or "opfuse_requantize_pc(" in program.source
    assert "_residual_multiplier[" in program.source
    feeds = reference.random_inputs(comp.graph, 4)
    got = mcu.run_on_qemu(program, feeds, tmp_path).outputs
    want = reference.run(comp.graph, feeds)
    np.testing.assert_allclose(got["output"], want["output"], rtol=1e-5, atol=1e-7)
