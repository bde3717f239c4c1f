"""The graph IR: ``Graph``, ``Node``, ``Value``; its text form and verifier.

The IR imports nothing above it (no file formats, no op registry): ops are looked up by
name at the layers that need them.
"""
from opfuse.ir.graph import Graph, Node, Value, TensorType
from opfuse.ir.verify import verify
from opfuse.ir.text import format_graph

__all__ = ["Graph", "Node", "Value", "TensorType", "verify", "format_graph"]
