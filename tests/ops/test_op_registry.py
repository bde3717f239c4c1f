"""The op registry: completeness, fusion categories and canonical attribute forms."""
from __future__ import annotations

import onnx.defs
import pytest

from opfuse.errors import UnsupportedOpError
from opfuse.ops import REGISTRY, Category, Mapping, get_spec
from opfuse.ops.registry import OpSpec

# Every op issues 2 and 12 name, with the fusion category (TVM) and mapping type (DNNFusion) it must have.
EXPECTED = {
    "Relu": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "LeakyRelu": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Clip": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Sigmoid": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "HardSigmoid": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "HardSwish": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Tanh": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Erf": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Gelu": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Softplus": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Exp": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Log": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Sqrt": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Neg": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Abs": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Reciprocal": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Cast": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Identity": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Dropout": (Category.ELEMWISE, Mapping.ONE_TO_ONE),
    "Add": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "Sub": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "Mul": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "Div": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "Pow": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "Max": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "Min": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "Where": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "Equal": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "BatchNormalization": (Category.BROADCAST, Mapping.ONE_TO_ONE),
    "Conv": (Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    "ConvTranspose": (Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    "MatMul": (Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    "Gemm": (Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    "MaxPool": (Category.REDUCTION, Mapping.MANY_TO_MANY),
    "AveragePool": (Category.REDUCTION, Mapping.MANY_TO_MANY),
    "GlobalAveragePool": (Category.REDUCTION, Mapping.MANY_TO_MANY),
    "Softmax": (Category.REDUCTION, Mapping.MANY_TO_MANY),
    "LayerNormalization": (Category.REDUCTION, Mapping.MANY_TO_MANY),
    "ReduceMean": (Category.REDUCTION, Mapping.MANY_TO_MANY),
    "ReduceSum": (Category.REDUCTION, Mapping.MANY_TO_MANY),
    "ReduceMax": (Category.REDUCTION, Mapping.MANY_TO_MANY),
    "Concat": (Category.INJECTIVE, Mapping.ONE_TO_ONE),
    "Split": (Category.INJECTIVE, Mapping.ONE_TO_ONE),
    "Slice": (Category.INJECTIVE, Mapping.ONE_TO_ONE),
    "Gather": (Category.INJECTIVE, Mapping.ONE_TO_MANY),
    "Reshape": (Category.INJECTIVE, Mapping.REORGANIZE),
    "Flatten": (Category.INJECTIVE, Mapping.REORGANIZE),
    "Squeeze": (Category.INJECTIVE, Mapping.REORGANIZE),
    "Unsqueeze": (Category.INJECTIVE, Mapping.REORGANIZE),
    "Transpose": (Category.INJECTIVE, Mapping.SHUFFLE),
    "Expand": (Category.BROADCAST, Mapping.ONE_TO_MANY),
    "Pad": (Category.INJECTIVE, Mapping.ONE_TO_MANY),
    "Resize": (Category.INJECTIVE, Mapping.ONE_TO_MANY),
    "Shape": (Category.OPAQUE, Mapping.MANY_TO_MANY),
    "ConstantOfShape": (Category.OPAQUE, Mapping.MANY_TO_MANY),
    "Constant": (Category.OPAQUE, Mapping.MANY_TO_MANY),
    # Issue 12: elementwise (an epilogue or prologue candidate) ...
    **{op: (Category.ELEMWISE, Mapping.ONE_TO_ONE) for op in (
        "Elu", "Selu", "Celu", "Mish", "ThresholdedRelu", "Softsign", "Floor", "Ceil", "Round", "Sign", "Sin",
        "Cos", "IsNaN", "IsInf", "Not", "Trilu", "BitwiseNot", "BitCast", "Tan", "Asin", "Acos", "Atan", "Sinh",
        "Cosh", "Asinh", "Acosh", "Atanh")},
    **{op: (Category.BROADCAST, Mapping.ONE_TO_ONE) for op in (
        "PRelu", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Mod", "BitShift", "Sum",
        "Mean", "BitwiseAnd", "BitwiseOr", "BitwiseXor")},
    # ... reductions (an anchor with a prologue and an epilogue) ...
    **{op: (Category.REDUCTION, Mapping.MANY_TO_MANY) for op in (
        "GlobalMaxPool", "LogSoftmax", "Hardmax", "ArgMax", "ArgMin", "ReduceMin", "ReduceProd", "ReduceL1",
        "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "CumSum", "CumProd")},
    # ... and data movement.
    "Tile": (Category.INJECTIVE, Mapping.ONE_TO_MANY),
    "DepthToSpace": (Category.INJECTIVE, Mapping.ONE_TO_ONE),
    "SpaceToDepth": (Category.INJECTIVE, Mapping.ONE_TO_ONE),
    "GatherElements": (Category.INJECTIVE, Mapping.ONE_TO_MANY),
    "GatherND": (Category.INJECTIVE, Mapping.ONE_TO_MANY),
    "OneHot": (Category.INJECTIVE, Mapping.ONE_TO_MANY),
    "Range": (Category.INJECTIVE, Mapping.ONE_TO_MANY),
    "ReverseSequence": (Category.INJECTIVE, Mapping.ONE_TO_ONE),
    # Data-dependent writes: never fused.
    **{op: (Category.OPAQUE, Mapping.MANY_TO_MANY) for op in ("TopK", "ScatterND", "ScatterElements")},
    # Spatial sampling: gathers from a whole input are their own kernel (an elementwise epilogue
    # may follow); AffineGrid is elementwise-like over a constant base grid; MaxUnpool scatters.
    **{op: (Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY)
       for op in ("GridSample", "Col2Im", "DeformConv", "RoiAlign")},
    "AffineGrid": (Category.INJECTIVE, Mapping.ONE_TO_MANY),
    "MaxUnpool": (Category.OPAQUE, Mapping.MANY_TO_MANY),
    "Det": (Category.OPAQUE, Mapping.MANY_TO_MANY),  # one LU per matrix, its own kernel
    # Recurrent layers: their own kernel (a time loop), never fused.
    **{op: (Category.OPAQUE, Mapping.MANY_TO_MANY) for op in ("LSTM", "GRU", "RNN")},
}


@pytest.mark.parametrize("op", sorted(EXPECTED))
def test_every_issue_op_is_registered_with_its_category(op):
    spec = get_spec(op)
    assert (spec.category, spec.mapping) == EXPECTED[op]


@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_every_registered_op_is_complete(op):
    spec = REGISTRY[op]
    assert isinstance(spec, OpSpec) and spec.name == op
    assert isinstance(spec.category, Category)
    assert isinstance(spec.mapping, Mapping)
    assert callable(spec.infer) and callable(spec.compute)
    lo, hi = spec.num_inputs
    assert 0 <= lo <= hi
    lo, hi = spec.num_outputs
    assert 1 <= lo <= hi
    assert isinstance(spec.attrs, dict)
    assert spec.flops_fn is not None or spec.flops_per_element >= 0


def test_every_registered_onnx_op_has_a_reviewed_category():
    """A newly registered ONNX op must join the table above; opfuse-internal ops (Silu, fused
    ops) are not ONNX ops and are exempt."""
    onnx_ops = {op for op in REGISTRY if onnx.defs.has(op)}
    assert sorted(onnx_ops - set(EXPECTED)) == []
    assert "Silu" in REGISTRY and not onnx.defs.has("Silu")


@pytest.mark.parametrize("op,defaults", [
    ("Squeeze", {"axes": None}),
    ("Unsqueeze", {"axes": None}),
    ("ReduceMean", {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}),
    ("ReduceSum", {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}),
    ("ReduceMax", {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}),
    ("Split", {"axis": 0, "split": None}),
    ("Softmax", {"axis": -1}),
    ("LayerNormalization", {"axis": -1, "epsilon": 1e-5, "stash_type": 1}),
    ("Conv", {"auto_pad": "NOTSET", "group": 1}),
    ("Gemm", {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}),
    ("Resize", {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                "nearest_mode": "round_prefer_floor"}),
])
def test_canonical_attribute_defaults(op, defaults):
    attrs = get_spec(op).attrs
    for name, value in defaults.items():
        assert attrs[name] == value, f"{op}.{name}"


def test_unknown_op_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):
        get_spec("NoSuchOp")
