"""C code generation: one C99 function per fusion group, one translation unit per model.

    from opfuse.codegen import generate
    program = generate(graph, plan)          # CProgram: .source, .weights, buffer sizes
    print(program.source)

Pipeline (one module each): ``stages`` splits a group into loop nests (pointwise, anchor,
attention, horizontal); ``lowering`` picks the kernel family per anchor (``gemm``, ``conv``,
``pool``, ``reduce``, ``norm``, ``concat``, ``attention``, ``horizontal``, ``pointwise``);
inside every loop the ``evaluator`` computes fused values in registers, one ``rules`` entry per
op, over symbolic ``index`` expressions; ``epilogue`` finishes anchor results; ``program``
assembles the file. The generator sees only the IR, the plan and the memory plan.
"""
from opfuse.codegen.kernel import UnsupportedGroupError
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.program import ABI_VERSION, CProgram, generate

__all__ = ["ABI_VERSION", "CProgram", "CodegenOptions", "UnsupportedGroupError", "generate"]
