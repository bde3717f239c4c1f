"""Frontends: model formats in and out of the opfuse IR (``opfuse.frontend.onnx``)."""
from opfuse.frontend.onnx import (export_model, import_model, load_model, parse_input_shapes,
                                  save_model)

__all__ = ["import_model", "load_model", "export_model", "save_model", "parse_input_shapes"]
