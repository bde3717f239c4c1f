"""What ``generate`` tells the runtime besides the C (no compiler): the input and output specs, the header that
names them and lists the fault codes, the graph outputs no kernel writes, the ABI version in the mcu platform's
source, and the profiling build's one slot per kernel call."""
from __future__ import annotations

import re

import numpy as np

from opfuse.codegen.options import CORTEX_M7, CodegenOptions
from opfuse.codegen.program import ABI_VERSION, TensorSpec, generate
from opfuse.ops import GraphBuilder


def _graph():
    """x (2 x 3 float32) -> Relu -> Neg; an int64 division by a run-time divisor (a fault); the input itself
    and a constant returned as they are."""
    b = GraphBuilder("iface")
    x = b.input("x in", (2, 3))
    i, j = b.input("i", (4,), np.int64), b.input("j", (4,), np.int64)
    c = b.const("table", np.arange(3, dtype=np.float32))
    return b.build(b.op("Neg", b.op("Relu", x)), b.op("Div", i, j), x, c)


def test_specs_name_each_input_and_output_with_its_shape_and_dtype():
    g = _graph()
    p = generate(g)
    assert p.inputs == [TensorSpec("x in", (2, 3), np.dtype(np.float32)), TensorSpec("i", (4,), np.dtype(np.int64)),
                        TensorSpec("j", (4,), np.dtype(np.int64))]
    assert [(t.name, t.shape, t.dtype) for t in p.outputs] == [(v.name, v.shape, v.dtype) for v in g.outputs]


def test_header_lists_the_tensors_and_the_fault_codes():
    g = _graph()
    p = generate(g)
    h = p.header()
    assert " *   inputs[0]  in_x_in float32[2, 3]" in h and " *   inputs[2]  in_j int64[4]" in h
    assert p.faults and all(f" *   {k} fault_" in h for k in range(1, len(p.faults) + 1))
    assert f"ABI {ABI_VERSION}" in h and " */\n#include <stddef.h>\nint opfuse_run(" in h
    assert p.fault_message(1) == p.faults[0]


def test_outputs_no_kernel_writes_pass_through():
    g = _graph()
    p = generate(g)
    assert p.passthrough.keys() == {"x in", "table"}
    assert p.passthrough["x in"] == ("input", "x in")
    kind, data = p.passthrough["table"]
    assert kind == "static" and np.array_equal(data, np.arange(3))


def test_mcu_source_states_the_abi_version_and_the_specs():
    b = GraphBuilder("m7")
    g = b.build(b.op("Relu", b.input("x", (2, 3))))
    for options in (CORTEX_M7, CodegenOptions(platform="mcu")):  # the second: vector ISA "host", not this host's
        p = generate(g, options=options)
        assert re.search(rf"ABI {ABI_VERSION}\b", p.source)
        assert p.inputs == [TensorSpec("x", (2, 3), np.dtype(np.float32))] and p.options.vector_isa == "avx2"


def test_profiling_keeps_one_slot_per_kernel_call():
    g = _graph()
    p = generate(g, options=CodegenOptions(profile=True))
    slots = [int(k) for k in re.findall(r"opfuse_profile_ns\[(\d+)\] \+=", p.source)]
    assert slots == list(range(p.num_functions)) and p.num_functions >= 2
    assert f"static uint64_t opfuse_profile_ns[{p.num_functions}];" in p.source
