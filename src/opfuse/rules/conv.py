"""Convolution epilogues: Conv -> BatchNorm -> Activation, Conv -> Activation, residual Add, Concat.

A Conv produces each output element once, at the end of its reduction loop; an epilogue applied
right there (per-channel affine, activation, adding the residual) saves a full write and read of
the Conv output. Inference BatchNorm is the per-channel affine
``y = (x - mean) * gamma / sqrt(var + eps) + beta``, so its statistics must be constants.

``Conv* -> Concat``: each Conv writes its slice of the concatenation directly (channel-axis
Concat in NCHW is a plain offset), so the Concat copy disappears.
"""
from __future__ import annotations

from opfuse.patterns import Op, Var, many
from opfuse.rules.rule import Rule, refuse

PRIORITY_CONV_EPILOGUE = 3.0
PRIORITY_CONCAT = 2.0
CHANNEL_AXIS = 1  # NCHW


def conv_bn_act_pattern():
    return (Op("Conv").named("conv") >> Op("BatchNormalization").at(0).named("bn")
            >> Op(tag="activation").at(0).named("act"))


def conv_act_pattern():
    return Op("Conv").named("conv") >> Op(tag="activation").at(0).named("act")


def conv_residual_pattern():
    """Conv -> BatchNorm? -> Add(residual) -> Activation?"""
    conv = Op("Conv").named("conv")
    pre = conv | (conv >> Op("BatchNormalization").at(0).named("bn"))
    add = Op("Add")(pre, Var("residual")).named("add")
    return add >> Op(tag="activation").at(0).named("act").opt()


def conv_concat_pattern():
    return many(Op("Conv").named("convs")) >> Op("Concat").named("concat")


# Conditions ---------------------------------------------------------------------------------------

def _bn_constant(bn) -> str | None:
    for i, role in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")):
        v = bn.inputs[i] if i < len(bn.inputs) else None
        if v is None or not v.is_const:
            return refuse(f"BatchNormalization '{bn.name}' {role} is not a constant", bn)
    return None


def _act_operands_constant(act) -> str | None:
    for v in act.inputs[1:]:
        if v is not None and not v.is_const:
            return refuse(f"{act.op_type} '{act.name}' operand '{v.name}' is not a constant", act)
    return None


def _first(x):
    if isinstance(x, list):
        return x[0] if x else None
    return x


def conv_bn_act_ok(m) -> str | None:
    return _bn_constant(m["bn"]) or _act_operands_constant(m["act"])


def conv_act_ok(m) -> str | None:
    return _act_operands_constant(m["act"])


def conv_residual_ok(m) -> str | None:
    bn = m.get("bn")
    if bn is not None:
        reason = _bn_constant(bn)
        if reason:
            return reason
    res, add = m["residual"], m["add"]
    if res.is_const:
        return refuse(f"'{res.name}' is a constant: '{add.name}' is a bias add, not a residual", add)
    if res.shape != add.outputs[0].shape:
        return refuse(f"residual '{res.name}' {res.shape} is broadcast to {add.outputs[0].shape}", add)
    act = _first(m.get("act"))
    return _act_operands_constant(act) if act is not None else None


def conv_concat_ok(m) -> str | None:
    concat = m["concat"]
    axis = concat.attrs.get("axis", CHANNEL_AXIS)
    rank = len(concat.outputs[0].shape)
    if axis % rank != CHANNEL_AXIS:
        return refuse(f"Concat '{concat.name}' joins axis {axis}, not the channel axis: slices are not contiguous",
                      concat)
    return None


CONV_BN_ACT = Rule("conv_bn_act", conv_bn_act_pattern(), condition=conv_bn_act_ok,
                   priority=PRIORITY_CONV_EPILOGUE, kind="conv_epilogue", anchor="conv",
                   description="Conv -> BatchNorm -> Activation as one Conv with an epilogue")
CONV_ACT = Rule("conv_act", conv_act_pattern(), condition=conv_act_ok,
                priority=PRIORITY_CONV_EPILOGUE, kind="conv_epilogue", anchor="conv",
                description="Conv -> Activation")
CONV_RESIDUAL = Rule("conv_residual_add", conv_residual_pattern(), condition=conv_residual_ok,
                     priority=PRIORITY_CONV_EPILOGUE, kind="conv_epilogue", anchor="conv",
                     description="Conv -> BatchNorm? -> Add(residual) -> Activation?")
CONV_CONCAT = Rule("conv_concat", conv_concat_pattern(), condition=conv_concat_ok,
                   priority=PRIORITY_CONCAT, kind="concat", anchor="concat",
                   description="Conv* -> Concat: convs write their slices of the concatenation")

__all__ = ["CONV_BN_ACT", "CONV_ACT", "CONV_RESIDUAL", "CONV_CONCAT", "conv_bn_act_pattern", "conv_act_pattern",
           "conv_residual_pattern", "conv_concat_pattern"]
