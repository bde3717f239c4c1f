"""The op registry and every supported op.

Importing this package registers all ops (each module registers its own on import).
"""
from opfuse.ops.registry import (REGISTRY, Category, Mapping, OpSpec, get_spec, infer_node,
                                 infer_shapes, is_supported, register)
from opfuse.ops import elementwise  # noqa: F401  (registers ops)
from opfuse.ops import logic  # noqa: F401
from opfuse.ops import nn  # noqa: F401
from opfuse.ops import linalg  # noqa: F401
from opfuse.ops import reduce  # noqa: F401
from opfuse.ops import shape_ops  # noqa: F401
from opfuse.ops import movement  # noqa: F401
from opfuse.ops import indexing  # noqa: F401
from opfuse.ops import scatter  # noqa: F401
from opfuse.ops import quantized  # noqa: F401
from opfuse.ops import recurrent  # noqa: F401
from opfuse.ops import sampling  # noqa: F401
from opfuse.ops.builder import GraphBuilder

__all__ = ["REGISTRY", "Category", "Mapping", "OpSpec", "get_spec", "infer_node", "infer_shapes",
           "is_supported", "register", "GraphBuilder"]
