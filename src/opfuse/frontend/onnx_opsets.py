"""Where ONNX changed an op's form between opsets 7 and 28, for the ops opfuse supports.

The importer reads these to bring every opset to the canonical IR form (constant operands as
attributes), and the exporter reads them to write the canonical form back for a target opset.
Each number is the op *version* (``OpSchema.since_version``) that introduced the change.

Checked against the ONNX operator changelog (onnx 1.23, opset 28) for every op in the opfuse
registry; the ops not listed here kept their semantics from opset 7 to 28: later versions only
widened the accepted types (bfloat16, float8, int4... from 19 to 28), allowed negative axes (11),
or added attributes whose default keeps the old meaning, e.g. MaxPool's ``storage_order`` (8),
``ceil_mode`` and ``dilations`` (10), AveragePool's ``count_include_pad`` (7), Reshape's
``allowzero`` (14), Shape's ``start``/``end`` (15), Resize's ``antialias``/``axes``/
``keep_aspect_ratio_policy`` (18), AveragePool's ``dilations`` (19), LSTM/GRU/RNN's ``layout``
(14; the exporter writes a batch-first node below 14 between Transposes), Cast's ``saturate`` (19)
and ``round_mode`` (24, float8e8m0 only), Pad's optional ``axes`` input (18), Range's
``stash_type`` (27, float16 only) and SpaceToDepth's ``mode`` (28, default DCR as before).
BatchNormalization-7's ``spatial=0`` (per-activation statistics) is refused.

Import covers opsets ``MIN_OPSET`` to the newest the installed onnx defines; an op version
newer than ``REVIEWED_OPSET`` (which this table was checked against) is refused by name, since
its semantics have not been reviewed. Export writes opsets ``EXPORT_MIN_OPSET`` to
``EXPORT_MAX_OPSET``.
"""
from __future__ import annotations

import onnx.defs

# The newest opset whose changes are reviewed here (onnx 1.23).
REVIEWED_OPSET = 28
# The imported range of the default ONNX domain ("" or "ai.onnx").
MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()
# The range the exporter writes.
EXPORT_MIN_OPSET = 11
EXPORT_MAX_OPSET = 21
DEFAULT_DOMAINS = ("", "ai.onnx")

# ``axes`` moved from an attribute to the second input.
AXES_INPUT_SINCE = {
    "Squeeze": 13,
    "Unsqueeze": 13,
    "ReduceSum": 13,
    "ReduceMean": 18,
    "ReduceMax": 18,
    "ReduceMin": 18,
    "ReduceProd": 18,
    "ReduceL1": 18,
    "ReduceL2": 18,
    "ReduceLogSum": 18,
    "ReduceLogSumExp": 18,
    "ReduceSumSquare": 18,
}

# ``noop_with_empty_axes`` exists from the version where ``axes`` became an input.
NOOP_WITH_EMPTY_AXES_SINCE = {op: v for op, v in AXES_INPUT_SINCE.items() if op.startswith("Reduce")}

# Split: ``split`` sizes moved to the second input at 13; ``num_outputs`` appeared at 18 (with
# "the last chunk may be smaller" semantics when the axis does not divide evenly).
SPLIT_INPUT_SINCE = 13
SPLIT_NUM_OUTPUTS_SINCE = 18

# Softmax, LogSoftmax and Hardmax: before 13 the input is coerced to 2-D at ``axis`` (default 1) and normalised over
# the flattened trailing block; from 13 it normalises along the single ``axis`` (default -1).
SOFTMAX_SINGLE_AXIS_SINCE = 13
SOFTMAX_LEGACY_DEFAULT_AXIS = 1

# Resize: before 13 ``roi`` and ``scales`` are required inputs, "absent" is an empty tensor.
RESIZE_OPTIONAL_INPUTS_SINCE = 13
# Resize-10 (like Upsample) has inputs (X, scales) and one attribute, ``mode``; it maps output
# coordinate x to x / scale ("asymmetric") and, in nearest mode, takes the floor when enlarging
# and the ceiling when shrinking (onnxruntime's "simple" rounding). Resize-11 added roi and sizes.
RESIZE_ROI_SINCE = 11
# Upsample-9 takes ``scales`` as an input; Upsample-7 as an attribute.
UPSAMPLE_SCALES_INPUT_SINCE = 9

# Pad: before 11 ``pads`` and ``value`` are attributes (inputs from 11).
PAD_INPUTS_SINCE = 11

# Slice: before 10 ``starts``/``ends``/``axes`` are attributes (inputs from 10, with ``steps``).
SLICE_INPUTS_SINCE = 10

# TopK: before 10 ``k`` is an attribute.
TOPK_K_INPUT_SINCE = 10

# LSTM, GRU, RNN: ``layout`` (1: batch-first X, Y and states) appeared at 14 (22 widened the types).
RECURRENT_LAYOUT_SINCE = 14

# Pad: the optional 4th input ``axes`` (pads given for those axes only) appeared at 18.
PAD_AXES_INPUT_SINCE = 18

# Scan: before 9 axis 0 of every input is a batch axis and axis 1 the scanned one (with an optional
# ``sequence_lens`` first input and per-input ``directions``); from 9 no batch, and per-input and
# per-output ``scan_input_axes``/``scan_input_directions``/``scan_output_axes``/``scan_output_directions``.
SCAN_AXES_SINCE = 9
# Dropout: ``ratio`` and ``training_mode`` became inputs at 12.
DROPOUT_INPUTS_SINCE = 12

# Ops of the default domain first defined after opset 11: the exporter expands them into older
# standard ops below their opset (as it always expands opfuse-internal ops such as Silu).
INTRODUCED_AT = {
    "HardSwish": 14,
    "Mish": 18,
    "LayerNormalization": 17,
    "Gelu": 20,
    "AffineGrid": 20,
    # No expansion below these: exporting them at an older opset is refused.
    "GridSample": 16,
    "Col2Im": 18,
    "DeformConv": 19,
}

# GridSample: opset 16 takes 4-D input only and names its modes bilinear/nearest/bicubic; 20 made it
# N-D and renamed them linear/nearest/cubic (same meaning).
GRID_SAMPLE_ND_SINCE = 20
GRID_SAMPLE_OLD_MODES = {"linear": "bilinear", "cubic": "bicubic", "nearest": "nearest"}

# RoiAlign: ``coordinate_transformation_mode`` appeared at 16 (default half_pixel); RoiAlign-10 has
# none and means ``output_half_pixel`` (no half-pixel shift).
ROI_ALIGN_CTM_SINCE = 16
