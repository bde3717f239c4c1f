"""The microcontroller flavour of the program (``CodegenOptions(platform="mcu")``).

The kernels are the host's portable C99 ones (``CORTEX_M7`` in ``options.py`` sizes their
register and cache blocks); what changes is the program around them:

* one entry point, declared in ``model.h`` with ``OPFUSE_ARENA_BYTES``:
  ``int opfuse_run(const float *const inputs[], float *const outputs[], uint8_t *arena)``
  (``void`` pointers when an input or output is not float32);
* the weights are one ``const`` array in their own file (``model_weights.c``): the linker
  keeps it in flash, and the kernels read it in place;
* every byte a kernel touches is in the arena or on its stack frame: each kernel's scratch
  (GEMM panels and tiles, padded planes) is placed inside the arena between the tensors
  live while it runs (``memory.scratch``), and ``OPFUSE_ARENA_BYTES`` counts it;
* no OS, no threads, no allocation: ``OPFUSE_TID()`` is 0 and the parallel pragma expands
  to nothing; graph outputs no kernel writes are copied with ``memcpy``; of libc only
  ``math.h`` and ``string.h`` (``stddef.h`` and ``stdint.h`` are freestanding headers).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opfuse.codegen.kernel import KERNEL_ATTRIBUTE
from opfuse.codegen.names import c_ident
from opfuse.memory.scratch import ScratchPlacement, place_scratch

WEIGHTS_SYMBOL = "opfuse_weights"
HEADER_NAME = "model.h"
SOURCE_NAME = "model.c"
WEIGHTS_NAME = "model_weights.c"
ARENA_ALIGN = 8  # bytes: the widest scalar the kernels load (double); no vector loads on this path

_PREAMBLE = """\
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "model.h"
/* One thread, no OpenMP: the host's per-thread scratch index is 0, its pragmas vanish. */
#define OPFUSE_TID() 0
#define OPFUSE_PRAGMA(x)
#define OPFUSE_SCRATCH_STRIDE ((size_t)0)
"""


# The GEMM core's micro-kernel (``gemm._microkernel``): its name and signature are the contract.


@dataclass(frozen=True)
class McuSources:
    """The files besides ``model.c`` (``CProgram.source``) and where scratch went."""

    header: str
    weights_source: str
    scratch: ScratchPlacement

    def files(self, source: str) -> dict[str, str]:
        return {SOURCE_NAME: source, HEADER_NAME: self.header, WEIGHTS_NAME: self.weights_source}


def _pointer_types(builder) -> tuple[str, str]:
    """``(input element type, output element type)`` of the entry point's arrays."""
    g = builder.graph
    all_float = all(v.dtype == np.float32 for v in list(g.inputs) + list(g.outputs))
    return ("float", "float") if all_float else ("void", "void")


def _passthrough_copies(builder) -> list[str]:
    """``memcpy`` lines for graph outputs no kernel writes (an input, a constant, or the same
    value listed again)."""
    g = builder.graph
    inputs = {v.name: i for i, v in enumerate(g.inputs)}
    first: dict[int, int] = {}
    lines = []
    for j, v in enumerate(g.outputs):
        n = v.nbytes
        if builder.memory.is_static(v):
            arr = np.ascontiguousarray(builder.memory.static[id(v)], dtype=v.dtype)
            off = builder.weights.add(("passthrough", v.name), arr)
            lines.append(f"  memcpy(outputs[{j}], weights + {off}, {n});")
        elif v.producer is None:
            lines.append(f"  memcpy(outputs[{j}], inputs[{inputs[v.name]}], {n});")
        elif id(v) in first:
            lines.append(f"  memcpy(outputs[{j}], outputs[{first[id(v)]}], {n});")
        first.setdefault(id(v), j)
    return lines


def _header(builder, arena_bytes: int, in_t: str, out_t: str) -> str:
    g = builder.graph
    doc = [f" *   inputs[{i}]  {c_ident(v.name, 'in')}: {v.dtype.name}{list(v.shape)}" for i, v in enumerate(g.inputs)]
    doc += [f" *   outputs[{i}] {c_ident(v.name, 'out')}: {v.dtype.name}{list(v.shape)}"
            for i, v in enumerate(g.outputs)]
    sizes = [f"#define OPFUSE_INPUT{i}_ELEMENTS {v.size}u" for i, v in enumerate(g.inputs)]
    sizes += [f"#define OPFUSE_OUTPUT{i}_ELEMENTS {v.size}u" for i, v in enumerate(g.outputs)]
    return "\n".join([
        f"/* opfuse generated model {c_ident(g.name, 'm')} for a microcontroller. Do not edit.",
        " *",
        " * opfuse_run(inputs, outputs, arena) runs the model once and returns 0. It reads the",
        " * inputs, writes the outputs (contiguous, row-major), and uses no memory but the arena",
        " * (OPFUSE_ARENA_BYTES, aligned to OPFUSE_ARENA_ALIGN; contents need not survive between",
        " * calls), the read-only weights (opfuse_weights, in flash) and a bounded stack.",
        *doc,
        " */",
        "#ifndef OPFUSE_MODEL_H",
        "#define OPFUSE_MODEL_H",
        "#include <stdint.h>",
        f"#define OPFUSE_ARENA_BYTES {arena_bytes}u",
        f"#define OPFUSE_ARENA_ALIGN {ARENA_ALIGN}u",
        f"#define OPFUSE_WEIGHTS_BYTES {builder.weights.size}u",
        f"#define OPFUSE_NUM_INPUTS {len(g.inputs)}",
        f"#define OPFUSE_NUM_OUTPUTS {len(g.outputs)}",
        *sizes,
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        f"extern const uint32_t {WEIGHTS_SYMBOL}[];",
        f"int opfuse_run(const {in_t} *const inputs[], {out_t} *const outputs[], uint8_t *arena);",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "#endif\n",
    ])


def _weights_source(builder) -> str:
    n, body = builder.weights.c_words()
    return (f"/* opfuse weights of model {c_ident(builder.graph.name, 'm')}: {builder.weights.size} bytes, "
            f"read-only (flash). Generated; do not edit. */\n"
            "#include <stdint.h>\n"
            f'#include "{HEADER_NAME}"\n'
            "#if defined(__GNUC__)\n"
            f"__attribute__((aligned({ARENA_ALIGN})))\n"
            "#endif\n"
            f"const uint32_t {WEIGHTS_SYMBOL}[{n}] = {{\n{body}\n}};\n")


def finish_mcu(builder, abi_version: int) -> tuple[str, McuSources]:
    """``model.c`` and the other files of a ``ProgramBuilder`` whose kernels are generated
    (``program.ProgramBuilder.finish`` makes the ``CProgram`` of them)."""
    g = builder.graph
    placement = place_scratch(builder.memory, [k.scratch_bytes if k.function else 0 for k in builder.kernels])
    for info, off in zip(builder.kernels, placement.offsets, strict=True):
        info.scratch_offset = off
    in_t, out_t = _pointer_types(builder)
    copies = _passthrough_copies(builder)  # before the weights are rendered: may add constants
    run = [f"int opfuse_run(const {in_t} *const inputs[], {out_t} *const outputs[], uint8_t *arena) {{",
           f"  const char* const weights = (const char*){WEIGHTS_SYMBOL};",
           "  (void)inputs; (void)outputs; (void)arena; (void)weights;"]
    if builder.options.profile:  # per-kernel instruction counts: the test firmware defines the mark
        run.append("  opfuse_kernel_mark(-1);")
    for launch in builder.launches:
        off = placement.offsets[launch.group_index]
        scratch = f"(char*)(arena + {off})" if off is not None else "(char*)0"
        call = f"{launch.function}({', '.join(launch.args + [scratch, '1'])})"
        run.append(f"  {{ const int fault_ = {call}; if (fault_) return fault_; }}" if launch.faults else f"  {call};")
        if builder.options.profile:
            run.append(f"  opfuse_kernel_mark({launch.group_index});")
    run += copies + ["  return 0;", "}\n"]
    parts = [f"/* Generated by opfuse (ABI {abi_version}, mcu): model {c_ident(g.name, 'm')}, "
             f"{len(builder.plan.groups)} groups, layout {builder.options.layout}, arena {placement.arena_bytes} bytes "
             f"(tensors {placement.tensor_bytes}, kernel scratch inside). Do not edit. */\n",
             _PREAMBLE, KERNEL_ATTRIBUTE]
    if builder.options.profile:
        parts.append("void opfuse_kernel_mark(int group);\n")
    parts.extend(builder.helpers[k] for k in builder.helpers)
    parts.extend(builder.functions)
    parts.append("\n".join(run))
    sources = McuSources(_header(builder, placement.arena_bytes, in_t, out_t), _weights_source(builder), placement)
    return "\n".join(parts), sources
