"""The seed's pattern library as rule sets (plain lists; compose them with ``+``).

* ``recognition_rules()``: rewrites that turn decomposed formulas into single ops
  (LayerNorm, erf- and tanh-GELU, SiLU, hard-swish), so later rules and codegen see one op
  each (the compile pipeline's ``recognize`` stage runs these very rules);
* ``fusion_rules()``: group rules, highest priority first: attention, conv and matmul
  epilogues, Conv* -> Concat, parallel MatMuls on a shared input, elementwise chains.

Rule names are what ``--disable`` takes.
"""
from __future__ import annotations

from opfuse.rules.activations import HARD_SWISH, SILU
from opfuse.rules.attention import ATTENTION
from opfuse.rules.conv import CONV_ACT, CONV_BN_ACT, CONV_CONCAT, CONV_RESIDUAL
from opfuse.rules.elementwise import ELEMENTWISE_CHAIN
from opfuse.rules.gelu import ERF_GELU, TANH_GELU
from opfuse.rules.horizontal import MATMUL_EPILOGUE, PARALLEL_MATMUL
from opfuse.rules.normalization import LAYERNORM
from opfuse.rules.rule import Rule


def recognition_rules() -> list[Rule]:
    return [LAYERNORM, ERF_GELU, TANH_GELU, SILU, HARD_SWISH]


def fusion_rules() -> list[Rule]:
    return [ATTENTION, CONV_BN_ACT, CONV_RESIDUAL, CONV_ACT, MATMUL_EPILOGUE, CONV_CONCAT, PARALLEL_MATMUL,
            ELEMENTWISE_CHAIN]


def default_rules() -> list[Rule]:
    return recognition_rules() + fusion_rules()


def rule_by_name(name: str, rules: list[Rule] | None = None) -> Rule:
    for r in (rules if rules is not None else default_rules()):
        if r.name == name:
            return r
    raise KeyError(name)


__all__ = ["recognition_rules", "fusion_rules", "default_rules", "rule_by_name"]
