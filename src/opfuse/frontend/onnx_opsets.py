"""Where ONNX changed an op's form between opsets 11 and 21, for the ops opfuse supports.

The importer reads these to bring every opset to the canonical IR form (constant operands as
attributes), and the exporter reads them to write the canonical form back for a target opset.
Each number is the op *version* (``OpSchema.since_version``) that introduced the change.

Checked against the ONNX operator changelog for every op in the opfuse registry; the ops
not listed here kept their semantics from opset 11 to 21 (later versions only widened the
accepted types, or added attributes whose default keeps the old meaning, e.g. Reshape's
``allowzero`` (14), Shape's ``start``/``end`` (15), Resize's ``antialias``/``axes``/
``keep_aspect_ratio_policy`` (18), AveragePool's ``dilations`` (19), Cast's ``saturate`` (19)
and Pad's optional ``axes`` input (18)).
"""
from __future__ import annotations

# The supported range of the default ONNX domain ("" or "ai.onnx").
MIN_OPSET = 11
MAX_OPSET = 21
DEFAULT_DOMAINS = ("", "ai.onnx")

# ``axes`` moved from an attribute to the second input.
AXES_INPUT_SINCE = {
    "Squeeze": 13,
    "Unsqueeze": 13,
    "ReduceSum": 13,
    "ReduceMean": 18,
    "ReduceMax": 18,
}

# ``noop_with_empty_axes`` exists from the version where ``axes`` became an input.
NOOP_WITH_EMPTY_AXES_SINCE = {op: v for op, v in AXES_INPUT_SINCE.items() if op.startswith("Reduce")}

# Split: ``split`` sizes moved to the second input at 13; ``num_outputs`` appeared at 18 (with
# "the last chunk may be smaller" semantics when the axis does not divide evenly).
SPLIT_INPUT_SINCE = 13
SPLIT_NUM_OUTPUTS_SINCE = 18

# Softmax: before 13 the input is coerced to 2-D at ``axis`` (default 1) and normalised over
# the flattened trailing block; from 13 it normalises along the single ``axis`` (default -1).
SOFTMAX_SINGLE_AXIS_SINCE = 13
SOFTMAX_LEGACY_DEFAULT_AXIS = 1

# Resize: before 13 ``roi`` and ``scales`` are required inputs, "absent" is an empty tensor.
RESIZE_OPTIONAL_INPUTS_SINCE = 13

# Pad: the optional 4th input ``axes`` (pads given for those axes only) appeared at 18.
PAD_AXES_INPUT_SINCE = 18

# Dropout: ``ratio`` and ``training_mode`` became inputs at 12.
DROPOUT_INPUTS_SINCE = 12

# Ops of the default domain first defined after opset 11: the exporter expands them into older
# standard ops below their opset (as it always expands opfuse-internal ops such as Silu).
INTRODUCED_AT = {
    "HardSwish": 14,
    "LayerNormalization": 17,
    "Gelu": 20,
}
