"""Invalid models are refused when the graph is built (import or compile), with one line naming the node."""
from __future__ import annotations

import re

import numpy as np
import pytest

from opfuse.errors import ModelError, ShapeError
from opfuse.ops import GraphBuilder


def test_batchnorm_parameters_of_the_wrong_length():
    b = GraphBuilder()
    x = b.input("x", (1, 2, 4, 4))
    ones = {n: b.const(n, np.ones(k, np.float32)) for n, k in (("s", 3), ("bb", 2), ("m", 2), ("v", 2))}
    with pytest.raises(ShapeError, match=r"'bn'.*scale has shape \(3,\), expected \(2,\)"):
        b.op("BatchNormalization", x, *ones.values(), name="bn")
    b = GraphBuilder()
    x = b.input("x", (1, 2, 4, 4))
    args = [b.const(n, np.ones(2, np.float32)) for n in ("s", "bb", "m")] + [b.const("v", np.ones((2, 1), np.float32))]
    with pytest.raises(ShapeError, match=r"'bn'.*input_var has shape \(2, 1\)"):
        b.op("BatchNormalization", x, *args, name="bn")


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
@pytest.mark.parametrize("pads", [[2, 0, 0, 0], [0, 0, 0, 2], [3, 3, 3, 3]])
def test_pool_pads_must_be_smaller_than_the_kernel(op, pads):
    b = GraphBuilder()
    x = b.input("x", (1, 2, 4, 4))
    with pytest.raises(ShapeError, match=f"'p'.*pads {re.escape(str(pads))}.*smaller than kernel_shape"):
        b.op(op, x, kernel_shape=[2, 2], pads=pads, name="p")


def test_pool_pads_just_below_the_kernel_are_fine():
    from opfuse.runtime.reference import run
    b = GraphBuilder()
    x = b.input("x", (1, 1, 3, 3))
    g = b.build(b.op("AveragePool", x, kernel_shape=[2, 2], pads=[1, 1, 1, 1], name="p"))
    assert not np.isnan(run(g, {"x": np.ones((1, 1, 3, 3), np.float32)})["p"]).any()


@pytest.mark.parametrize("op,dtype", [("Relu", "uint8"), ("Relu", "bool"), ("Sigmoid", "int32"),
                                      ("Exp", "int64"), ("Neg", "uint16")])
def test_element_types_outside_the_op_constraint(op, dtype):
    b = GraphBuilder()
    x = b.input("x", (4,), dtype)
    with pytest.raises(ModelError, match=f"'n'.*{op}.*element type {dtype} is not allowed"):
        b.op(op, x, name="n")


@pytest.mark.parametrize("op,dtype", [("Relu", "int8"), ("Relu", "float16"), ("Abs", "uint8"), ("Neg", "int32")])
def test_element_types_inside_the_op_constraint(op, dtype):
    b = GraphBuilder()
    b.build(b.op(op, b.input("x", (4,), dtype), name="n"))


@pytest.mark.parametrize("op,dtypes", [("Div", ("int32", "float32")), ("Div", ("float32", "int32")),
                                       ("Add", ("float32", "float64")), ("Mul", ("int64", "int32")),
                                       ("Sub", ("uint8", "int8")), ("Mod", ("int32", "float32")),
                                       ("Sum", ("float32", "float32", "int32")), ("Max", ("float32", "float16"))])
def test_binary_operands_of_different_types(op, dtypes):
    """ONNX binds one type T to every operand of these ops; onnxruntime refuses ``Div(int32, float32)``
    when it loads the model ("Type parameter (T) of Optype (Div) bound to different types"). opfuse
    used to accept it (an int32 quotient of a float divisor), and its C code guarded only the integer
    dividend's zero check (codegen.checks mutant ``check_of__mutmut_13`` looked at the divisor's type)."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", (4,), dt) for i, dt in enumerate(dtypes)]
    with pytest.raises(ShapeError, match=f"'n' \\({op}\\): operand dtypes differ: {', '.join(dtypes)}"):
        b.op(op, *xs, name="n")


@pytest.mark.parametrize("dtypes", [("float32", "int32"), ("int32", "int64"), ("float64", "float32")])
def test_pow_exponent_has_its_own_type(dtypes):
    """Pow's exponent has its own type parameter T1: mixed operands stay valid."""
    b = GraphBuilder()
    b.build(b.op("Pow", b.input("x", (4,), dtypes[0]), b.input("e", (4,), dtypes[1]), name="n"))
