"""The op families of the random graph generator, in the order shrinking prefers.

Plain families exercise single ops (unary activations, broadcast arithmetic, Conv, pooling,
MatMul/Gemm, normalisations, reductions, data movement); pattern families build the decomposed
forms the rewrites and fusion rules recognise. See ``family`` for what a family is.
"""
from __future__ import annotations

import math

from opfuse.testing.elementwise_families import (BINARY_OPS, EPILOGUE_OPS, UNARY_OPS, binary_const,
                                                 binary_values, binary_values_choices, guarded, power,
                                                 unary, unary_choices, where)
from opfuse.testing.family import Family, rank_in
from opfuse.testing.graph_draft import MAX_CHANNELS, PRODUCT_LIMIT
from opfuse.testing.layout_families import (concat, concat_input, expand, flatten, gather, pad, reshape,
                                            resize, slice_, split, squeeze_choices, squeeze_unsqueeze,
                                            transpose)
from opfuse.testing.more_families import (COMPARE_OPS, JUMP_OPS, LOGIC_OPS, REDUCE_OPS, SMOOTH_OPS, arg_topk,
                                           compare_logic, compare_logic_choices, cumulative, depth_space,
                                           depth_space_ready, exact, gather_more, grid_sample, inverse_trig,
                                           inverse_trig_choices, jumps, prelu, reduce_choices, reduce_more,
                                           reverse_sequence, scatter, smooth_choices, smooth_unary, sum_mean,
                                           tile, trilu)
from opfuse.testing.nn_families import (MAX_REDUCTION, batch_norm, conv, conv_input, conv_transpose,
                                        gemm, layer_norm, matmul_const, pool, reduce, softmax)
from opfuse.testing.pattern_families import (attention, attention_input, conv_bn_relu, conv_residual,
                                             gelu_pattern, layer_norm_pattern, silu_pattern,
                                             squeeze_excite)

FAMILIES: tuple[Family, ...] = (
    Family("unary", unary, UNARY_OPS, choices=unary_choices),
    Family("binary_const", binary_const, BINARY_OPS),
    Family("binary_values", binary_values, BINARY_OPS, optional=("Abs",), limit=PRODUCT_LIMIT,
           choices=binary_values_choices),
    Family("softmax", softmax, ("Softmax",)),
    Family("reduce", reduce, ("ReduceMean", "ReduceSum", "ReduceMax")),
    Family("layer_norm", layer_norm, ("LayerNormalization",)),
    Family("conv", conv, ("Conv",), optional=("BatchNormalization",) + EPILOGUE_OPS,
           accepts=conv_input, ranks=(3, 4)),
    Family("batch_norm", batch_norm, ("BatchNormalization",), accepts=rank_in(2, 3, 4), ranks=(2, 3, 4)),
    Family("pool", pool, ("MaxPool", "AveragePool", "GlobalAveragePool"), accepts=rank_in(3, 4),
           limit=math.inf, ranks=(3, 4)),
    Family("matmul", matmul_const, ("MatMul",), optional=("Add",) + EPILOGUE_OPS,
           accepts=lambda v: v.shape[-1] <= MAX_REDUCTION),
    Family("gemm", gemm, ("Gemm",), optional=EPILOGUE_OPS,
           accepts=lambda v: len(v.shape) == 2 and max(v.shape) <= MAX_REDUCTION, ranks=(2,)),
    Family("conv_transpose", conv_transpose, ("ConvTranspose",),
           accepts=lambda v: conv_input(v) and v.shape[1] <= MAX_CHANNELS, ranks=(3, 4)),
    Family("guarded", guarded, ("Log", "Sqrt", "Reciprocal"), all_of=("Abs", "Add"),
           limit=math.inf, min_cost=3),
    Family("power", power, ("Pow",), limit=PRODUCT_LIMIT),
    Family("where", where, ("Where",), limit=math.inf),
    Family("reshape", reshape, ("Reshape",), limit=math.inf),
    Family("flatten", flatten, ("Flatten",), limit=math.inf),
    Family("transpose", transpose, ("Transpose",), accepts=lambda v: len(v.shape) >= 2,
           limit=math.inf, ranks=(2, 3, 4)),
    Family("squeeze", squeeze_unsqueeze, ("Unsqueeze", "Squeeze"), limit=math.inf,
           choices=squeeze_choices),
    Family("concat", concat, ("Concat",), accepts=concat_input, limit=math.inf),
    Family("split", split, ("Split",), accepts=lambda v: max(v.shape) >= 2, limit=math.inf),
    Family("slice", slice_, ("Slice",), limit=math.inf),
    Family("gather", gather, ("Gather",), limit=math.inf),
    Family("expand", expand, ("Expand",), limit=math.inf),
    Family("pad", pad, ("Pad",), limit=math.inf),
    Family("resize", resize, ("Resize",), accepts=rank_in(3, 4), limit=math.inf, ranks=(3, 4)),
    # The ops added later (more_families).
    Family("smooth_unary", smooth_unary, SMOOTH_OPS, limit=math.inf, choices=smooth_choices),
    Family("inverse_trig", inverse_trig, ("Asin", "Acos", "Atanh", "Acosh"), optional=("Mul", "Abs", "Add"),
           limit=math.inf, min_cost=3, choices=inverse_trig_choices),
    Family("jumps", jumps, JUMP_OPS, accepts=exact, limit=math.inf),
    Family("prelu", prelu, ("PRelu",)),
    Family("sum_mean", sum_mean, ("Sum", "Mean")),
    Family("compare_logic", compare_logic, COMPARE_OPS + ("IsNaN", "IsInf"), optional=LOGIC_OPS + ("Not", "Where"),
           limit=math.inf, choices=compare_logic_choices),
    Family("reduce_more", reduce_more, REDUCE_OPS, optional=("Abs", "Add"), limit=math.inf, choices=reduce_choices),
    Family("arg_topk", arg_topk, ("ArgMax", "ArgMin", "TopK"), optional=("OneHot",), accepts=exact,
           limit=math.inf),
    Family("cumulative", cumulative, ("CumSum",)),
    Family("tile", tile, ("Tile",), limit=math.inf),
    Family("depth_space", depth_space, ("DepthToSpace", "SpaceToDepth"), accepts=depth_space_ready,
           limit=math.inf, ranks=(4,)),
    Family("trilu", trilu, ("Trilu",), accepts=lambda v: len(v.shape) >= 2, limit=math.inf, ranks=(2, 3, 4)),
    Family("gather_more", gather_more, ("GatherElements", "GatherND"), limit=math.inf),
    Family("scatter", scatter, ("ScatterElements", "ScatterND"), limit=math.inf),
    Family("reverse_sequence", reverse_sequence, ("ReverseSequence",), accepts=lambda v: len(v.shape) >= 2,
           limit=math.inf, ranks=(2, 3, 4)),
    Family("grid_sample", grid_sample, ("GridSample",), optional=("AffineGrid",), accepts=rank_in(4),
           limit=math.inf, ranks=(4,)),
    # Patterns.
    Family("silu_pattern", silu_pattern, ("Mul",), all_of=("Sigmoid",), min_cost=2, pattern=True),
    Family("gelu_pattern", gelu_pattern, ("Mul",), all_of=("Erf", "Add"), optional=("Div",),
           min_cost=5, pattern=True),
    Family("layer_norm_pattern", layer_norm_pattern, ("Sub",),
           all_of=("ReduceMean", "Mul", "Add", "Sqrt", "Div"), optional=("Pow",), min_cost=7,
           pattern=True),
    Family("conv_bn_relu", conv_bn_relu, ("Conv",), all_of=("BatchNormalization", "Relu"),
           accepts=conv_input, min_cost=3, ranks=(3, 4), pattern=True),
    Family("conv_residual", conv_residual, ("Conv",), all_of=("Add",),
           optional=("BatchNormalization", "Relu"),
           accepts=lambda v: conv_input(v) and v.shape[1] <= MAX_CHANNELS, min_cost=2, ranks=(3, 4),
           pattern=True),
    Family("attention", attention, ("MatMul",), optional=("Transpose", "Softmax", "Mul"),
           accepts=attention_input, limit=PRODUCT_LIMIT, min_cost=3, ranks=(3,), pattern=True),
    Family("squeeze_excite", squeeze_excite, ("Mul",),
           all_of=("GlobalAveragePool", "Conv", "Relu", "Sigmoid"),
           accepts=lambda v: len(v.shape) == 4 and v.shape[1] <= MAX_CHANNELS, min_cost=6, ranks=(4,),
           pattern=True),
)
