"""``Pass``: one graph-to-graph step. ``run(graph, ctx) -> (graph, modified)``.

A pass may edit the graph in place and return it, or return a new one; ``modified`` says
whether anything changed (instruments and fixed-point drivers read it). Analyses that produce
something other than a graph (the fusion plan) leave it on the context.
"""
from __future__ import annotations

from typing import Callable


class Pass:
    name: str = "pass"

    def run(self, graph, ctx) -> tuple[object, bool]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class FunctionPass(Pass):
    """A pass from a plain function ``fn(graph, ctx) -> (graph, modified)``."""

    def __init__(self, name: str, fn: Callable):
        self.name = name
        self.fn = fn

    def run(self, graph, ctx):
        return self.fn(graph, ctx)


class VerifyPass(Pass):
    """Check the IR invariants (structure and shapes); never modifies."""

    def __init__(self, name: str = "verify"):
        self.name = name

    def run(self, graph, ctx):
        graph.verify()
        return graph, False


__all__ = ["Pass", "FunctionPass", "VerifyPass"]
