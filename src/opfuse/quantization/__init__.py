"""Post-training static INT8 quantization (``opfuse quantize``) and its accuracy report.

    import opfuse
    result = opfuse.quantize("zoo:resnet8", calibration_random=64, method="entropy", report=True)
    result.save("resnet8_int8.onnx")          # QDQ-form ONNX: onnxruntime and opfuse run it
    result.report["outputs"]["output"]["top1_agreement"]
"""
from opfuse.quantization.calibration import DEFAULT_PERCENTILE, METHODS, TensorRange
from opfuse.quantization.params import ACTIVATION_TYPES, DEFAULT_ACTIVATION_TYPE, ActivationParams
from opfuse.quantization.qdq import QuantizeResult, build_qdq_model, quantize, select_tensors

__all__ = ["quantize", "QuantizeResult", "build_qdq_model", "select_tensors", "ActivationParams", "TensorRange",
           "METHODS", "ACTIVATION_TYPES", "DEFAULT_ACTIVATION_TYPE", "DEFAULT_PERCENTILE"]
