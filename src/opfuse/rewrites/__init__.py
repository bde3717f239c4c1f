"""Algebraic rewrites: change the graph (never its outputs) so fusion sees fewer, whole ops.

The pipeline, top to bottom (each stage a named pass; every rule and pass can be disabled by
name through the options):

    recognize_integer  a QDQ model's DQ -> Conv/Gemm/MatMul -> [residual Add] -> [Relu] -> Q as one
                 integer op (``integer_conv``, ``integer_matmul``: int32 accumulator, fixed-point
                 Requantize), a QOperator model's float requantizations as fixed-point Requantize and its
                 QLinearAdds as QDQ residual Adds (``qlinear_fixed_point``, ``qlinear_add_float32``); then the
                 dequantized constants they left are folded (the importer keeps them unfolded for these
                 rules: ``dequantized_constants``)
    simplify     remove Identity/Dropout, constant folding, CSE, data movement before a
                 dequantization (``dequantize_late``), dead-code elimination
    recognize    decomposed LayerNorm, erf/tanh GELU, SiLU, hard-swish -> one op each
    fold_linear  BatchNorm and per-channel Mul/Div/Add/Sub folded into Conv/Gemm/MatMul weights
    merge_matmuls sibling MatMuls on one input -> one MatMul on concatenated weights + Split
    lower_conv_transpose  a ConvTranspose with one tap per output pixel -> 1x1 Conv + DepthToSpace
    float32_compute  float16/bfloat16 ops computed in float32 between Casts (the C backend's
                 16-bit floats are storage only)
    cleanup      simplify again: the rewrites leave dead constants and nodes behind

One sweep suffices: each stage only enables later ones (recognition needs no folding, folding
needs no horizontal merging), and the pattern stages run their rules to a fixpoint.

``recognize`` and ``fold_linear`` are pattern rules (``opfuse.rules.Rule``: pattern, condition,
action, priority) run by the rules engine; ``recognize`` runs the pattern library's
``opfuse.rules.recognition_rules()``. The others are whole-graph passes.
``rewrite(graph, options)`` edits ``graph`` in place and returns decisions and provenance.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from opfuse.rules.decisions import Decision
from opfuse.rules.options import FusionOptions
from opfuse.ir.graph import Graph
from opfuse.rewrites.affine_folding import fold_affine_rule
from opfuse.rewrites.bn_folding import fold_batchnorm_rule
from opfuse.rewrites.constant_folding import fold_constants
from opfuse.rewrites.context import RewriteContext
from opfuse.rewrites.conv_transpose import RULE as CONV_TRANSPOSE_AS_CONV, conv_transpose_as_conv
from opfuse.rewrites.cse import eliminate_common_subexpressions
from opfuse.rewrites.dce import eliminate_dead_code
from opfuse.rewrites.dequantize_late import dequantize_late
from opfuse.rewrites.dequantized_constants import fold_dequantized_constants
from opfuse.rewrites.edit import Provenance
from opfuse.rewrites.engine import run_pattern_rules
from opfuse.rewrites.float32_compute import RULE as FLOAT32_COMPUTE, compute_in_float32
from opfuse.rewrites.identity import remove_identities
from opfuse.rewrites.merge_parallel_matmul import RULE as HORIZONTAL_MATMUL, merge_parallel_matmuls
from opfuse.rules.integer_ops import quantizes
from opfuse.rules.library import integer_rules, recognition_rules
from opfuse.rules.rule import Rule

Pass = Callable[[Graph, RewriteContext], bool]


def folding_rules() -> list[Rule]:
    return [fold_batchnorm_rule(), fold_affine_rule()]


def simplify(graph: Graph, rc: RewriteContext) -> bool:
    changed = remove_identities(graph, rc)
    changed |= fold_constants(graph, rc)
    changed |= eliminate_common_subexpressions(graph, rc)
    changed |= dequantize_late(graph, rc)
    changed |= eliminate_dead_code(graph, rc)
    return changed


SIMPLIFY_RULES = ("remove_identity", "constant_folding", "common_subexpression_elimination", "dequantize_late",
                  "dead_code_elimination")


RECOGNIZE_INTEGER = "recognize_integer"


def recognize_integer(graph: Graph, rc: RewriteContext, rules: list[Rule] | None = None) -> bool:
    """The integer rules on a graph that quantizes somewhere, then the dequantized constants folded. A Split or Slice
    after a dequantization moves before it first (``dequantize_late``, which ``simplify`` runs over all data
    movement later), so that a product reading a part of a dequantized tensor reads a dequantized 8-bit tensor when
    the rules look (a YOLO block's ``DQ -> Split -> Conv``: its weight is folded once they have looked; the rules
    read a Flatten or Reshape before a product themselves)."""
    changed = False
    if quantizes(graph):
        changed = dequantize_late(graph, rc, moves=("Split", "Slice"), clone=False)
        changed |= run_pattern_rules(graph, rules if rules is not None else integer_rules(), rc, RECOGNIZE_INTEGER)
    return fold_dequantized_constants(graph) or changed


def rewrite_passes() -> list[tuple[str, Pass, list[str]]]:
    """The pipeline as (pass name, function, rule names) triples; read it top to bottom."""
    recognize, fold, integer = recognition_rules(), folding_rules(), integer_rules()
    return [
        (RECOGNIZE_INTEGER, lambda g, rc: recognize_integer(g, rc, integer), [r.name for r in integer]),
        ("simplify", simplify, list(SIMPLIFY_RULES)),
        ("recognize", lambda g, rc: run_pattern_rules(g, recognize, rc, "recognize"), [r.name for r in recognize]),
        ("fold_linear", lambda g, rc: run_pattern_rules(g, fold, rc, "fold_linear"), [r.name for r in fold]),
        ("merge_matmuls", merge_parallel_matmuls, [HORIZONTAL_MATMUL]),
        ("lower_conv_transpose", conv_transpose_as_conv, [CONV_TRANSPOSE_AS_CONV]),
        ("float32_compute", compute_in_float32, [FLOAT32_COMPUTE]),
        ("cleanup", simplify, []),
    ]


@dataclass
class RewriteResult:
    graph: Graph
    decisions: list[Decision]
    provenance: Provenance
    timings: dict[str, float] = field(default_factory=dict)
    rule_stats: dict = field(default_factory=dict)


def rewrite(graph: Graph, options: FusionOptions | None = None,
            provenance: Provenance | None = None) -> RewriteResult:
    """Run the rewrite pipeline on ``graph`` in place (``opfuse.passes.fuse`` runs the same
    stages as instrumented passes)."""
    options = options or FusionOptions()
    rc = RewriteContext(options, provenance or Provenance(graph))
    timings: dict[str, float] = {}
    for name, fn, _ in rewrite_passes():
        if options.is_disabled(name):
            continue
        t0 = time.perf_counter()
        rc.pass_name = name
        fn(graph, rc)
        timings[name] = time.perf_counter() - t0
    return RewriteResult(graph, rc.decisions, rc.provenance, timings, rc.rule_stats)


__all__ = ["RewriteResult", "rewrite", "rewrite_passes", "folding_rules", "simplify", "recognize_integer",
           "Provenance", "RewriteContext"]
