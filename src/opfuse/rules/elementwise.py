"""Elementwise chains, the seed's ``EW+ ::= (Add | Mul | Activation)+``.

A chain y = f_k(... f_2(f_1(x, c_1), c_2) ..., c_k) of one-to-one ops over one iteration space
becomes one loop ``for i: y[i] = f_k(...f_1(x[i], c_1[i])...)``: each intermediate lives in a
register instead of a round trip through memory.

Legality: every op of the chain must produce the shape of the chain's last op (one iteration
space). A smaller intermediate that is broadcast into a larger one would be recomputed for
every element it is broadcast to; whether that pays is the planner's question, so the rule
refuses it and names the shapes.
"""
from __future__ import annotations

from opfuse.patterns import Op
from opfuse.rules.rule import Rule, refuse

EW_ARITH = ("Add", "Sub", "Mul", "Div")
# A single op is not a fusion.
MIN_CHAIN = 2
PRIORITY_ELEMENTWISE = 1.0


def elementwise_op():
    """Add | Sub | Mul | Div | any activation."""
    return Op(*EW_ARITH) | Op(tag="activation")


def elementwise_chain_pattern():
    return elementwise_op().repeat(MIN_CHAIN, None).named("chain")


def one_iteration_space(m):
    end = m.nodes[-1]
    last = end.outputs[0].shape
    for n in m.nodes:
        if n.outputs[0].shape != last:
            # any chain holding both ends of the disagreement is refused; its other parts are not
            return refuse(f"output {n.outputs[0].shape} of '{n.name}' differs from the chain's iteration "
                          f"space {last}", n, end)
    return None


ELEMENTWISE_CHAIN = Rule(
    "elementwise_chain", elementwise_chain_pattern(), condition=one_iteration_space,
    priority=PRIORITY_ELEMENTWISE, kind="elementwise",
    description="(Add|Sub|Mul|Div|Activation)+ over one iteration space -> one loop")

__all__ = ["ELEMENTWISE_CHAIN", "elementwise_op", "elementwise_chain_pattern", "one_iteration_space",
           "EW_ARITH", "MIN_CHAIN"]
