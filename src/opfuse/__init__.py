"""opfuse: an operator-fusion compiler for neural networks."""
__version__ = "0.1.0"
