"""The opfuse version, importable from anywhere in the package without importing its root."""
__version__ = "0.1.0"
