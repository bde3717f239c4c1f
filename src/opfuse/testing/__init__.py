"""Test support for opfuse and its users: Hypothesis strategies for random valid graphs, and
the fuzzer built on them (``opfuse.testing.fuzz``, ``opfuse fuzz``).

    from opfuse.testing import graphs, graph_and_inputs, property_settings

``hypothesis`` is a dependency of opfuse for this package (the fuzzer is a user command).
"""
from opfuse.testing.graph_draft import INPUT_BOUND, MAX_ELEMENTS
from opfuse.testing.random_graphs import (ALL_OPS, DEFAULT_OPS, INTERNAL_OPS, enabled_families,
                                          focused_ops, graph_and_inputs, graphs, magnitude_bounds,
                                          property_settings, random_feeds)

__all__ = ["graphs", "graph_and_inputs", "random_feeds", "property_settings", "enabled_families",
           "focused_ops", "magnitude_bounds",
           "DEFAULT_OPS", "ALL_OPS", "INTERNAL_OPS", "INPUT_BOUND", "MAX_ELEMENTS"]
