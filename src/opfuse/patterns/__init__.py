"""Patterns: the declarative language fusion rules are written in, and the matcher that finds them.

    from opfuse.patterns import Op, Var, Const, par, many, find_matches
    x = Var("x")
    silu = Op("Mul")(x, Op("Sigmoid")(x))
    for m in find_matches(graph, silu):
        print(m.nodes, m["x"])
"""
from opfuse.patterns.pattern import (CONST_RTOL, Alt, Any, AnyOp, Const, Constraint, Many, Op, OpAlternative,
                                     OpPattern, Par, Pattern, PatternError, Repeat, Seq, Var, check,
                                     const_inputs, has_attr, has_dtype, has_rank, has_shape, many, num_inputs,
                                     par)
from opfuse.patterns.template import CompiledPattern, compile_pattern
from opfuse.patterns.match import Match
from opfuse.patterns.index import FeatureIndex
from opfuse.patterns.matcher import MAX_REPEAT, Matcher, PatternStats, compiled, find_matches

__all__ = ["Pattern", "PatternError", "Op", "AnyOp", "OpPattern", "OpAlternative", "Var", "Const", "Any",
           "Seq", "Par", "Alt", "Repeat", "Many", "par", "many", "Constraint", "has_attr", "has_dtype",
           "has_shape", "has_rank", "const_inputs", "num_inputs", "check", "CONST_RTOL", "CompiledPattern",
           "compile_pattern", "Match", "FeatureIndex", "Matcher", "PatternStats", "compiled", "find_matches",
           "MAX_REPEAT"]
