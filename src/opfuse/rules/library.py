"""The seed's pattern library as rule sets (plain lists; compose them with ``+``).

* ``fusion_rules()``: the fusion families, highest priority first (earlier rules win the ops
  they take), run by the one driver (``opfuse.rules.driver.form_groups``):

      attention               MatMul -> scale/mask -> Softmax -> MatMul (+ head split/merge)
      normalization_prologue  bias/residual Adds -> into the LayerNorm/Softmax that follows
      dequantize_prologue     int8 tensor -> Cast/Sub/Mul -> into the Conv/MatMul/Gemm reading it
      epilogue                Conv/MatMul/Gemm/reduction + the elementwise ops after it
                              (BatchNorm is folded into the Conv first, so Conv+BN+act is one)
      concat_alias            Concat inputs written in place by their producers
      elementwise_chain       elementwise chains (and prologues of reductions, data movement)
      injective               data movement into data-movement/elementwise consumers
      horizontal              siblings on one input with one iteration domain -> one pass

* ``integer_rules()``: a QDQ model's DQ -> Conv / Gemm / MatMul -> [Add] -> [Relu] -> Q rewritten into
  the integer op it stands for (``integer_conv``, ``integer_matmul``: int32 accumulator, fixed-point
  Requantize), several ops each (a ``Subgraph``), and ``qlinear_fixed_point`` / ``qlinear_add_float32``, a
  QOperator model's float requantization of an int32 accumulator as one fixed-point Requantize and its
  QLinearAdd as a QDQ residual Add (``rules/qlinear_fixed``); the pipeline's first stage,
  ``recognize_integer``;

* ``recognition_rules()``: rewrites that turn decomposed formulas into single ops
  (LayerNorm, erf- and tanh-GELU, SiLU, hard-swish), so the fusion rules and codegen see one
  op each (the pipeline's ``recognize`` stage runs these very rules); and ``int8_concat``, a
  dequantize -> Concat -> quantize at one scale rewritten to a Concat of the 8-bit tensors.

Rule names are what ``--disable`` takes.
"""
from __future__ import annotations

from opfuse.rules.activations import HARD_SWISH, SILU
from opfuse.rules.aliasing import CONCAT_ALIAS
from opfuse.rules.attention import ATTENTION
from opfuse.rules.gelu import ERF_GELU, TANH_GELU
from opfuse.rules.horizontal import HORIZONTAL
from opfuse.rules.integer_ops import integer_rules as _qdq_integer_rules
from opfuse.rules.normalization import LAYERNORM
from opfuse.rules.qlinear_fixed import QLINEAR_ADD_FLOAT32_RULE, QLINEAR_FIXED_POINT_RULE
from opfuse.rules.qconcat import INT8_CONCAT
from opfuse.rules.quantized import DEQUANTIZE_PROLOGUE
from opfuse.rules.rule import Rule
from opfuse.rules.vertical import ELEMENTWISE_CHAIN, EPILOGUE, INJECTIVE, NORMALIZATION_PROLOGUE


def integer_rules() -> list[Rule]:
    return _qdq_integer_rules() + [QLINEAR_FIXED_POINT_RULE, QLINEAR_ADD_FLOAT32_RULE]


def recognition_rules() -> list[Rule]:
    return [LAYERNORM, ERF_GELU, TANH_GELU, SILU, HARD_SWISH, INT8_CONCAT]


def fusion_rules() -> list[Rule]:
    return [ATTENTION, NORMALIZATION_PROLOGUE, DEQUANTIZE_PROLOGUE, EPILOGUE,
            CONCAT_ALIAS, ELEMENTWISE_CHAIN, INJECTIVE, HORIZONTAL]


def fusion_rule_names() -> list[str]:
    return [r.name for r in fusion_rules()]


def default_rules() -> list[Rule]:
    return integer_rules() + recognition_rules() + fusion_rules()


def rule_by_name(name: str, rules: list[Rule] | None = None) -> Rule:
    for r in (rules if rules is not None else default_rules()):
        if r.name == name:
            return r
    raise KeyError(name)


__all__ = ["integer_rules", "recognition_rules", "fusion_rules", "fusion_rule_names", "default_rules", "rule_by_name"]
