"""The ONNX frontend: import ONNX models into opfuse graphs and export graphs back to ONNX.

    graph = load_model("model.onnx", input_shapes=parse_input_shapes(["input=1x3x224x224"]))
    save_model(graph, "out.onnx")            # opset 17 (or the graph's, when newer)
"""
from opfuse.frontend.input_shapes import parse_input_shapes, shapes_from_arrays, unbound_inputs
from opfuse.frontend.onnx_export import DEFAULT_EXPORT_OPSET, export_model, save_model
from opfuse.frontend.onnx_files import parse_model, read_model, read_model_with_data
from opfuse.frontend.onnx_import import declared_inputs, import_model, load_model
from opfuse.frontend.onnx_import_context import FOLD_MAX_ELEMENTS
from opfuse.frontend.onnx_opsets import EXPORT_MAX_OPSET, EXPORT_MIN_OPSET, MAX_OPSET, MIN_OPSET

__all__ = ["import_model", "load_model", "export_model", "save_model", "parse_input_shapes",
           "declared_inputs", "unbound_inputs", "shapes_from_arrays",
           "read_model", "read_model_with_data", "parse_model", "FOLD_MAX_ELEMENTS",
           "DEFAULT_EXPORT_OPSET", "MIN_OPSET", "MAX_OPSET", "EXPORT_MIN_OPSET", "EXPORT_MAX_OPSET"]
