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
