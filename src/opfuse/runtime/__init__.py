"""Executors: the NumPy reference (the oracle) and the native C runtime."""
