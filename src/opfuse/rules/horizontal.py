"""Horizontal fusion: ``(MatMul || MatMul || MatMul)`` on a shared input (BERT's Q/K/V).

Siblings ``y_i = x W_i`` that read the same ``x`` become one product ``x [W_1 | W_2 | W_3]``:
``x`` is read once instead of three times and one larger GEMM keeps the machine busier. The
weights must be constants (they are concatenated at compile time) and every sibling must read
``x`` the same way (Gemm ``transA`` equal). Also ``MatMul -> Add(bias) -> Activation?``, the
epilogue of a linear layer.
"""
from __future__ import annotations

from opfuse.patterns import Const, Op, Var, par
from opfuse.rules.rule import Rule, default_benefit, refuse

PRIORITY_HORIZONTAL = 2.0
PRIORITY_MATMUL_EPILOGUE = 3.0
QKV_BRANCHES = 3


def parallel_matmul_pattern(branches: int = QKV_BRANCHES):
    x = Var("x")
    return par(*[Op("MatMul", "Gemm")(x, Const()) for _ in range(branches)]).named("branches")


def matmul_epilogue_pattern():
    mm = Op("MatMul", "Gemm").named("matmul")
    return Op("Add")(mm, Const(name="bias")).named("bias_add") >> Op(tag="activation").at(0).named("act").opt()


def same_input_use(m) -> str | None:
    trans = {n.attrs.get("transA", 0) for n in m["branches"] if n.op_type == "Gemm"}
    if len(trans) > 1:
        return "the Gemm siblings read the shared input with different transA"
    for n in m["branches"]:
        if n.inputs[0] is not m["x"]:
            return refuse(f"'{n.name}' reads the shared input '{m['x'].name}' as its weight, not its data", n)
    return None


def shared_read_saving(m) -> float:
    """Bytes of the shared input not read again: (siblings - 1) reads."""
    return float((len(m["branches"]) - 1) * m["x"].nbytes) + default_benefit(m)


def bias_along_last_axis(m) -> str | None:
    add, mm = m["bias_add"], m["matmul"]
    if add.outputs[0].shape != mm.outputs[0].shape:
        return refuse(f"bias '{m['bias'].name}' {m['bias'].shape} broadcasts the product {mm.outputs[0].shape} "
                      f"to {add.outputs[0].shape}", add)
    return None


PARALLEL_MATMUL = Rule("parallel_matmul", parallel_matmul_pattern(), condition=same_input_use,
                       priority=PRIORITY_HORIZONTAL, benefit=shared_read_saving, kind="horizontal",
                       description="(MatMul || MatMul || MatMul) on a shared input -> one wider product")
MATMUL_EPILOGUE = Rule("matmul_epilogue", matmul_epilogue_pattern(), condition=bias_along_last_axis,
                       priority=PRIORITY_MATMUL_EPILOGUE, kind="matmul_epilogue", anchor="matmul",
                       description="MatMul -> Add(bias) -> Activation? as one product with an epilogue")

__all__ = ["PARALLEL_MATMUL", "MATMUL_EPILOGUE", "parallel_matmul_pattern", "matmul_epilogue_pattern"]
