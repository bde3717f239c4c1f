"""Every op's C kernel (unfused: one kernel per node) against the reference executor.

Cases are grouped into suites; each suite is one graph with one output per case, compiled
once, so a hundred kernels cost a handful of compiler runs. Each case is its own test.
"""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close
from opfuse.ops import GraphBuilder
from opfuse.ops.registry import REGISTRY
from opfuse.runtime import reference
from opfuse.runtime.native import build

I64 = np.int64


class Suite:
    def __init__(self, name: str, seed: int = 0):
        self.b = GraphBuilder(name)
        self.rng = np.random.default_rng(seed)
        self.cases: dict[str, object] = {}

    def w(self, *shape, scale=0.3):
        data = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.b.const(f"w{len(self.b.graph.values)}", data)

    def c(self, data, dtype=None):
        return self.b.const(f"c{len(self.b.graph.values)}", np.asarray(data, dtype=dtype))

    def case(self, name: str, op: str, *inputs, **attrs):
        self.cases[name] = self.b.op(op, *inputs, name=name, **attrs)
        return self.cases[name]

    def graph(self):
        return self.b.build(*self.cases.values())


def conv_suite() -> Suite:
    s = Suite("conv")
    x = s.b.input("x", (2, 8, 10, 9))
    s.case("conv3x3_pad1_bias", "Conv", x, s.w(16, 8, 3, 3), s.w(16), pads=[1, 1, 1, 1])
    s.case("group2_stride2_asym_pads", "Conv", x, s.w(6, 4, 3, 3), group=2, strides=[2, 2], pads=[0, 1, 2, 0])
    s.case("group4_bias", "Conv", x, s.w(8, 2, 3, 2), s.w(8), group=4, pads=[1, 0, 1, 1])
    s.case("depthwise_bias", "Conv", x, s.w(8, 1, 3, 3), s.w(8), group=8, pads=[1, 1, 1, 1])
    s.case("depthwise_s2_d2", "Conv", x, s.w(8, 1, 3, 3), group=8, strides=[2, 2], dilations=[2, 2],
           pads=[2, 1, 2, 2])
    s.case("depthwise_multiplier2", "Conv", x, s.w(16, 1, 3, 3), group=8, pads=[1, 1, 1, 1])
    s.case("pointwise_1x1", "Conv", x, s.w(12, 8, 1, 1), s.w(12))
    s.case("pointwise_1x1_stride2", "Conv", x, s.w(12, 8, 1, 1), strides=[2, 2])
    s.case("dilated_same_upper", "Conv", x, s.w(5, 8, 2, 3), dilations=[2, 1], strides=[1, 2], auto_pad="SAME_UPPER")
    s.case("same_lower_stride2", "Conv", x, s.w(4, 8, 4, 4), strides=[2, 2], auto_pad="SAME_LOWER")
    s.case("valid_5x5", "Conv", x, s.w(3, 8, 5, 5), auto_pad="VALID")
    s.case("runtime_weights", "Conv", x, s.b.input("wx", (4, 8, 3, 3)), pads=[1, 1, 1, 1])
    x1 = s.b.input("x1d", (1, 4, 17))
    s.case("conv1d_stride2", "Conv", x1, s.w(6, 4, 3), strides=[2], pads=[1, 1])
    x3 = s.b.input("x3d", (1, 3, 5, 6, 7))
    s.case("conv3d", "Conv", x3, s.w(4, 3, 3, 2, 3), pads=[1, 0, 1, 1, 1, 1])
    s.case("convT_s2_outpad", "ConvTranspose", x, s.w(8, 3, 3, 3), s.w(3), strides=[2, 2], pads=[1, 1, 1, 1],
           output_padding=[1, 0])
    s.case("convT_group2_dil", "ConvTranspose", x, s.w(8, 2, 2, 3), group=2, dilations=[2, 1])
    return s


def pool_suite() -> Suite:
    s = Suite("pool")
    x = s.b.input("x", (2, 3, 11, 10))
    s.case("max3_s2_p1", "MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    s.case("max2_s2_ceil", "MaxPool", x, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    s.case("max_dilated", "MaxPool", x, kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 0, 1])
    s.case("avg3_pad_exclude", "AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    s.case("avg3_pad_include", "AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
           count_include_pad=1)
    s.case("avg_include_ceil", "AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 0],
           count_include_pad=1, ceil_mode=1)
    s.case("avg_same_upper", "AveragePool", x, kernel_shape=[2, 3], auto_pad="SAME_UPPER")
    s.case("global_avg", "GlobalAveragePool", x)
    x1 = s.b.input("x1d", (1, 2, 9))
    s.case("max1d", "MaxPool", x1, kernel_shape=[3], strides=[2])
    s.case("global_avg_1d", "GlobalAveragePool", x1)
    return s


def linalg_suite() -> Suite:
    s = Suite("linalg")
    a = s.b.input("a", (2, 3, 5, 7))
    s.case("matmul_const_folds_batch", "MatMul", a, s.w(7, 9))
    s.case("matmul_runtime_broadcast", "MatMul", s.b.input("a2", (2, 1, 5, 7)), s.b.input("b2", (3, 7, 4)))
    s.case("matmul_const_batched", "MatMul", s.b.input("a3", (3, 5, 7)), s.w(3, 7, 6))
    s.case("matmul_vec_mat", "MatMul", s.b.input("v", (7,)), s.w(7, 5))
    s.case("matmul_mat_vec", "MatMul", a, s.w(7))
    s.case("matmul_vec_vec", "MatMul", s.b.input("v2", (7,)), s.w(7))
    s.case("matmul_big", "MatMul", s.b.input("big", (130, 300)), s.w(300, 50))
    s.case("matmul_int64", "MatMul", s.b.input("ia", (3, 4), I64), s.b.input("ib", (4, 2), I64))
    g = s.b.input("g", (6, 5))
    s.case("gemm_transB_alpha_beta", "Gemm", g, s.w(7, 5), s.w(7), transB=1, alpha=0.5, beta=2.0)
    s.case("gemm_transA", "Gemm", s.b.input("gt", (5, 6)), s.w(5, 4), transA=1)
    s.case("gemm_both_trans_C_col", "Gemm", s.b.input("gt2", (5, 6)), s.w(3, 5), s.w(6, 1), transA=1, transB=1)
    s.case("gemm_C_full_runtime_B", "Gemm", g, s.b.input("gb", (5, 3)), s.b.input("gc", (6, 3)))
    s.case("gemm_C_scalar", "Gemm", g, s.w(5, 3), s.c(np.float32(0.25)))
    s.case("det_batched", "Det", s.b.input("dm", (2, 3, 4, 4)))  # LU with partial pivoting per matrix
    s.case("det_one_matrix", "Det", s.b.input("d2", (6, 6)))
    return s


def reduce_suite() -> Suite:
    s = Suite("reduce")
    x = s.b.input("x", (2, 3, 5, 7))
    s.case("softmax_last", "Softmax", x)
    s.case("softmax_axis1", "Softmax", x, axis=1)
    s.case("softmax_axis0", "Softmax", x, axis=0)
    s.case("softmax_long_row", "Softmax", s.b.input("long", (2, 300)))
    s.case("layernorm_last", "LayerNormalization", x, s.w(7), s.w(7))
    s.case("layernorm_axis1_nobias", "LayerNormalization", x, s.w(3, 5, 7), axis=1, epsilon=1e-3)
    s.case("layernorm_bcast_scale", "LayerNormalization", x, s.w(5, 1), s.w(7), axis=2)
    ln = s.b.op("LayerNormalization", x, s.w(5, 7), axis=2, num_outputs=3, name="layernorm_stats")
    s.cases["layernorm_stats_y"], s.cases["layernorm_stats_mean"], s.cases["layernorm_stats_inv_std"] = ln
    s.case("mean_axes13", "ReduceMean", x, axes=[1, 3], keepdims=0)
    s.case("mean_last_keep", "ReduceMean", x, axes=[-1])
    s.case("mean_all", "ReduceMean", x)
    s.case("sum_axis0", "ReduceSum", x, axes=[0])
    s.case("sum_trailing_long", "ReduceSum", s.b.input("long2", (3, 40, 20)), axes=[1, 2])
    s.case("max_axes02", "ReduceMax", x, axes=[0, 2], keepdims=0)
    s.case("max_noop", "ReduceMax", x, axes=[], noop_with_empty_axes=1)
    # Issue 12's reductions.
    for op in ("ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"):
        s.case(f"{op}_trailing", op, x, axes=[2, 3], keepdims=0)
        s.case(f"{op}_middle", op, x, axes=[1])
    s.case("ReduceLogSum_all", "ReduceLogSum", s.b.op("Abs", x))
    s.case("ReduceLogSumExp_long", "ReduceLogSumExp", s.b.input("long3", (3, 70)), axes=[-1])
    s.case("ReduceL2_int", "ReduceL2", s.b.input("ri", (3, 4), I64), axes=[1])
    s.case("ReduceMin_noop", "ReduceMin", x, axes=[], noop_with_empty_axes=1)
    s.case("global_max_pool", "GlobalMaxPool", x)
    s.case("log_softmax_last", "LogSoftmax", x)
    s.case("log_softmax_axis1", "LogSoftmax", x, axis=1)
    s.case("hardmax_last", "Hardmax", x)
    s.case("argmax_axis1", "ArgMax", x, axis=1)
    s.case("argmin_last_nokeep", "ArgMin", x, axis=-1, keepdims=0)
    s.case("argmax_select_last", "ArgMax", s.b.input("ties", (4, 6), I64), axis=1, select_last_index=1)
    s.case("argmin_first_tie", "ArgMin", s.b.input("ties2", (4, 6), I64), axis=0)
    s.case("cumsum_axis2", "CumSum", x, s.c(np.array(2, I64)))
    s.case("cumsum_exclusive_reverse", "CumSum", x, s.c(np.array([-1], np.int32)), exclusive=1, reverse=1)
    return s


UNARY = ["Relu", "Sigmoid", "Tanh", "Gelu", "Softplus", "Silu", "Erf", "Exp", "Neg", "Abs", "HardSigmoid",
         "HardSwish", "LeakyRelu", "Identity", "Reciprocal"]


def elementwise_suite() -> Suite:
    s = Suite("elementwise")
    x = s.b.input("x", (2, 6, 4, 5))
    for op in UNARY:
        s.case(f"unary_{op}", op, x)
    s.case("gelu_tanh", "Gelu", x, approximate="tanh")
    s.case("leaky_alpha", "LeakyRelu", x, alpha=0.3)
    s.case("hardsigmoid_attrs", "HardSigmoid", x, alpha=0.4, beta=0.3)
    ax = s.b.op("Abs", x)
    s.case("log_abs", "Log", ax)
    s.case("sqrt_abs", "Sqrt", ax)
    for shape in [(6, 1, 5), (5,), (), (2, 1, 1, 1), (2, 6, 4, 5)]:
        y = s.b.input(f"y{len(shape)}_{'x'.join(map(str, shape))}", shape)
        tag = "x".join(map(str, shape)) or "scalar"
        for op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
            s.case(f"{op}_{tag}", op, x, y)
    s.case("add_reversed_bcast", "Add", s.b.input("yb", (6, 1, 5)), x)
    s.case("pow_const2", "Pow", x, s.c(np.float32(2)))
    s.case("pow_const_half", "Pow", ax, s.c(np.float32(0.5)))
    s.case("pow_const3", "Pow", x, s.c(np.float32(3)))
    s.case("pow_runtime", "Pow", ax, s.b.input("pe", (5,)))
    s.case("max3", "Max", x, s.w(5), s.w(4, 1))
    s.case("sum3", "Sum", x, s.w(5), s.w(4, 1))
    s.case("mean2", "Mean", x, s.w(6, 1, 1))
    s.case("sum1", "Sum", x)
    s.case("where_equal", "Where", s.b.op("Equal", s.b.op("Relu", x), s.c(np.float32(0))), x, s.w(5))
    s.case("clip_inputs", "Clip", x, s.c(np.float32(-0.5)), s.c(np.float32(0.7)))
    s.case("clip_max_only", "Clip", x, None, s.c(np.float32(0.2)))
    s.case("clip_none", "Clip", x)
    s.case("cast_roundtrip", "Cast", s.b.op("Cast", s.b.op("Mul", x, s.c(np.float32(3))), to=7), to=1)
    s.case("cast_to_bool", "Cast", x, to=9)
    s.case("bn_const", "BatchNormalization", x, s.w(6), s.w(6), s.w(6), s.c(np.abs(s.rng.standard_normal(6)) + 0.5,
                                                                         np.float32))
    s.case("bn_runtime_params", "BatchNormalization", x, s.b.input("bs", (6,)), s.b.input("bb", (6,)),
           s.b.input("bm", (6,)), s.c(np.full(6, 0.8, np.float32)))
    i = s.b.input("i", (3, 4), I64)
    j = s.b.input("j", (4,), I64)
    s.case("int_add", "Add", i, j)
    s.case("int_mul", "Mul", i, s.c(np.array(-3, I64)))
    s.case("int_div", "Div", s.b.op("Sub", i, s.c(np.array(7, I64))), s.c(np.array([2, -3, 5, 1], I64)))
    s.case("int_relu", "Relu", s.b.op("Sub", i, s.c(np.array(2, I64))))
    s.case("bool_where", "Where", s.b.op("Equal", i, j), s.c(np.float32(1.5)), s.c(np.float32(-1)))
    # Issue 12's elementwise and logic ops.
    for op in ("Elu", "Selu", "Celu", "Mish", "ThresholdedRelu", "Softsign", "Floor", "Ceil", "Round", "Sign",
               "Sin", "Cos"):
        s.case(f"unary_{op}", op, s.b.op("Mul", x, s.c(np.float32(2.5))))
    t = s.b.op("Tanh", x)
    for op in ("Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Atanh"):
        s.case(f"unary_{op}", op, t)
    s.case("unary_Acosh", "Acosh", s.b.op("Add", s.b.op("Abs", x), s.c(np.float32(1))))
    s.case("elu_alpha", "Elu", x, alpha=0.3)
    s.case("selu_attrs", "Selu", x, alpha=1.5, gamma=2.0)
    s.case("thresholded_relu_alpha", "ThresholdedRelu", x, alpha=0.2)
    s.case("round_halves", "Round", s.c(np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 1e9], np.float32)))
    s.case("isnan", "IsNaN", s.b.op("Log", x))
    s.case("isinf_pos", "IsInf", s.b.op("Exp", s.b.op("Mul", x, s.c(np.float32(100)))), detect_negative=0)
    s.case("isinf_both", "IsInf", s.b.op("Log", s.b.op("Relu", x)))
    s.case("int_sign", "Sign", s.b.op("Sub", i, s.c(np.array(2, I64))))
    y = s.b.input("cmp", (6, 1, 5))
    for op in ("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"):
        s.case(f"cmp_{op}", op, x, y)
    s.case("cmp_int", "GreaterOrEqual", i, j)
    p, q = s.b.op("Greater", x, s.c(np.float32(0))), s.b.op("Less", y, s.c(np.float32(0.3)))
    for op in ("And", "Or", "Xor"):
        s.case(f"logic_{op}", op, p, q)
    s.case("logic_not", "Not", p)
    s.case("prelu_channel", "PRelu", x, s.w(6, 1, 1))
    s.case("prelu_scalar", "PRelu", x, s.c(np.float32(0.25)))
    s.case("mod_float_floored", "Mod", x, s.c(np.array([0.7, -0.4, 1.3, -2.0, 0.9], np.float32)))
    s.case("mod_float_fmod", "Mod", x, s.c(np.array([0.7, -0.4, 1.3, -2.0, 0.9], np.float32)), fmod=1)
    m = s.b.op("Sub", i, s.c(np.array(5, I64)))
    s.case("mod_int_floored", "Mod", m, s.c(np.array([3, -3, 2, -1], I64)))
    s.case("mod_int_fmod", "Mod", m, s.c(np.array([3, -3, 2, -1], I64)), fmod=1)
    u = s.b.input("u", (3, 4), np.uint32)
    s.case("bitshift_left_u32", "BitShift", u, s.c(np.array([1, 3, 31, 32], np.uint32)), direction="LEFT")
    s.case("bitshift_right_i64", "BitShift", m, s.c(np.array([1, 0, 64, -1], I64)), direction="RIGHT")
    s.case("trilu_upper_k1", "Trilu", x, s.c(np.array(1, I64)))
    s.case("trilu_lower_runtime_k", "Trilu", x, s.b.input("tk", (), I64), upper=0)
    return s


def movement_suite() -> Suite:
    s = Suite("movement")
    x = s.b.input("x", (2, 6, 4, 5))
    s.case("transpose_0231", "Transpose", x, perm=[0, 2, 3, 1])
    s.case("transpose_default", "Transpose", x)
    s.case("reshape_zero_minus1", "Reshape", x, s.c([0, -1, 5], I64))
    s.case("reshape_split_dim", "Reshape", x, s.c([2, 3, 2, 20], I64))
    s.case("flatten_axis0", "Flatten", x, axis=0)
    s.case("flatten_axis3", "Flatten", x, axis=3)
    s.case("unsqueeze_squeeze", "Squeeze", s.b.op("Unsqueeze", x, axes=[0, 3]), axes=[0])
    sp = s.b.op("Split", x, axis=1, split=[1, 5], num_outputs=2, name="split_unequal")
    s.cases["split_unequal_0"], s.cases["split_unequal_1"] = sp
    sp2 = s.b.op("Split", x, axis=3, num_outputs=3, name="split_axis3")
    for k, v in enumerate(sp2):
        s.cases[f"split_axis3_{k}"] = v
    s.case("slice_steps", "Slice", x, s.c([1, -1], I64), s.c([4, -5], I64), s.c([1, 3], I64), s.c([2, -1], I64))
    s.case("slice_clamped", "Slice", x, s.c([-100, 2], I64), s.c([100, 4], I64), s.c([0, 2], I64))
    s.case("gather_2d_neg", "Gather", x, s.c([[0, -1], [2, 3]], I64), axis=1)
    s.case("gather_scalar", "Gather", x, s.c(np.array(3, I64)), axis=3)
    s.case("gather_runtime_idx", "Gather", x, s.b.input("gi", (3,), I64), axis=2)
    s.case("concat_axis1_three", "Concat", x, s.b.op("Neg", x), s.b.input("cx", (2, 2, 4, 5)), axis=1)
    s.case("concat_axis_last", "Concat", x, x, axis=-1)
    s.case("expand_runtime", "Expand", s.b.input("ex", (6, 1, 1)), s.c([2, 1, 4, 5], I64))
    for mode in ("constant", "reflect", "edge", "wrap"):
        s.case(f"pad_{mode}", "Pad", x, s.c([0, 0, 2, -1, 0, 1, 1, 3], I64), mode=mode)
    s.case("pad_value_axes", "Pad", x, s.c([1, 2, 0, 1], I64), s.c(np.float32(-2.5)), s.c([1, 3], I64))
    s.case("resize_nearest_scales", "Resize", x, None, s.c([1, 1, 2, 1.5], np.float32))
    s.case("resize_nearest_floor_asym", "Resize", x, None, s.c([1, 1, 0.6, 2.3], np.float32),
           coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    s.case("resize_linear_align", "Resize", x, None, s.c([1, 1, 1.7, 0.6], np.float32), mode="linear",
           coordinate_transformation_mode="align_corners")
    s.case("resize_linear_sizes", "Resize", x, None, None, s.c([2, 6, 7, 3], I64), mode="linear")
    s.case("resize_crop", "Resize", x, s.c([0.2, 0.1, 0.9, 1.2], np.float32), s.c([1.5, 2], np.float32),
           mode="linear", coordinate_transformation_mode="tf_crop_and_resize", axes=[2, 3],
           extrapolation_value=-1.0)
    s.case("dropout", "Dropout", x)
    # Issue 12's data movement.
    s.case("tile", "Tile", x, s.c([1, 2, 1, 3], I64))
    s.case("depth_to_space_dcr", "DepthToSpace", s.b.input("d2s", (2, 8, 3, 2)), blocksize=2)
    s.case("depth_to_space_crd", "DepthToSpace", s.b.input("d2s2", (1, 18, 2, 3)), blocksize=3, mode="CRD")
    s.case("space_to_depth", "SpaceToDepth", s.b.input("s2d1", (2, 3, 4, 6)), blocksize=2)
    s.case("space_to_depth_crd", "SpaceToDepth", s.b.input("s2d", (1, 3, 6, 9)), blocksize=3, mode="CRD")
    ge_idx = np.random.default_rng(1).integers(-6, 6, (2, 3, 4, 5))
    s.case("gather_elements_axis1", "GatherElements", x, s.c(ge_idx, I64), axis=1)
    s.case("gather_elements_runtime", "GatherElements", x, s.b.input("ge", (2, 6, 4, 2), I64), axis=-1)
    s.case("gather_nd", "GatherND", x, s.c([[0, 1], [1, -1], [0, 5]], I64))
    s.case("gather_nd_batch", "GatherND", x, s.b.input("gnd", (2, 3, 1), I64), batch_dims=1)
    s.case("onehot", "OneHot", s.b.input("oh", (3, 4), I64), s.c(np.array(5, I64)), s.c(np.array([-1, 2], np.float32)),
           axis=1)
    s.case("onehot_negative", "OneHot", s.c(np.array([[-1, 2], [7, -5]], I64)), s.c(np.array([5], np.float32)),
           s.c(np.array([0, 1], I64)))
    t = s.b.input("topk_x", (3, 9))
    for name, attrs in (("topk_largest", {}), ("topk_smallest_axis0", {"largest": 0, "axis": 0})):
        vals, idx = s.b.op("TopK", t, s.c(np.array([2], I64)), num_outputs=2, name=name, **attrs)
        s.cases[f"{name}_values"], s.cases[f"{name}_indices"] = vals, idx
    ties = s.b.op("Floor", s.b.op("Mul", t, s.c(np.float32(0.7))))
    s.cases["topk_ties_values"], s.cases["topk_ties_indices"] = s.b.op("TopK", ties, s.c(np.array([5], I64)),
                                                                        num_outputs=2, name="topk_ties")
    s.case("scatter_nd", "ScatterND", x, s.c([[1, 2], [0, -1], [1, 2]], I64), s.b.input("snd_u", (3, 4, 5)))
    s.case("scatter_nd_add", "ScatterND", x, s.c([[1, 2], [0, -1], [1, 2]], I64), s.b.input("snd_u2", (3, 4, 5)),
           reduction="add")
    s.case("scatter_elements_max", "ScatterElements", x, s.c(np.random.default_rng(2).integers(-4, 4, (2, 6, 3, 5)),
                                                              I64), s.b.input("se_u", (2, 6, 3, 5)), axis=2,
           reduction="max")
    s.case("reverse_sequence", "ReverseSequence", s.b.input("rs", (4, 3, 5)), s.b.input("rs_lens", (3,), I64),
           batch_axis=1, time_axis=0)
    s.case("bitcast_f32_i32", "BitCast", x, to=6)
    s.case("bitwise_and", "BitwiseAnd", s.b.input("bw1", (3, 4), np.int32), s.c(np.array([1, 3, -2, 7], np.int32)))
    s.case("bitwise_not", "BitwiseNot", s.b.input("bw2", (3, 4), np.uint8))
    s.case("cumprod_reverse", "CumProd", x, s.c(np.array(1, I64)), reverse=1)
    s.case("range_float", "Range", s.c(np.float32(-1.5)), s.c(np.float32(2.0)), s.c(np.float32(0.25)))
    s.case("range_int_down", "Range", s.c(np.array(10, I64)), s.c(np.array(-3, I64)), s.c(np.array(-4, I64)))
    s.case("shape_static", "Shape", x)
    s.case("constant_of_shape", "ConstantOfShape", s.c([2, 3], I64), value=np.array([1.5], np.float32))
    return s


SUITES = {f.__name__.replace("_suite", ""): f for f in
          (conv_suite, pool_suite, linalg_suite, reduce_suite, elementwise_suite, movement_suite)}
_CASES = {name: list(f().cases) for name, f in SUITES.items()}


@pytest.fixture(scope="module")
def suite_results(cache_dir):
    done = {}

    def get(name):
        if name not in done:
            s = SUITES[name]()
            g = s.graph()
            feeds = reference.random_inputs(g, 0)
            model = build(g, None, cache_dir=cache_dir)
            done[name] = (s, model.run(feeds), reference.run(g, feeds), model)
        return done[name]
    return get


@pytest.mark.parametrize("suite,case", [(s, c) for s, cases in _CASES.items() for c in cases])
def test_op_matches_reference(suite_results, suite, case):
    s, got, want, _ = suite_results(suite)
    name = s.cases[case].name
    assert_close({name: got[name]}, {name: want[name]})


def test_unfused_build_has_one_group_per_node(suite_results):
    s, _, _, model = suite_results("conv")
    assert model.report["kernels"] == len(model.graph.nodes)
    assert all(k["function"] for k in model.report["c_kernels"])


def test_every_registered_op_has_a_c_implementation():
    from opfuse.codegen.lowering import anchor_lowerings
    from opfuse.codegen.rules import RULES
    from opfuse.memory.static import SHAPE_ONLY_OPS
    covered = set(RULES) | set(anchor_lowerings()) | SHAPE_ONLY_OPS
    assert sorted(set(REGISTRY) - covered) == []


def test_float16_computes_in_float32_between_casts(cache_dir):
    """float16 is stored 16-bit and computed in float32 (``rewrites.float32_compute``, ``codegen.half``)."""
    b = GraphBuilder("f16")
    x = b.input("half_input", (2, 2), np.float16)
    g = b.build(b.op("Relu", x))
    feed = np.array([[-1.0, 0.5], [np.nan, 65504.0]], np.float16)
    got = list(build(g, None, cache_dir=cache_dir).run({"half_input": feed}).values())[0]
    np.testing.assert_array_equal(got, np.maximum(feed, np.float16(0)))
