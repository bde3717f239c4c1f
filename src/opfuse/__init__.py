"""opfuse: an operator-fusion compiler for neural networks.

    import opfuse
    graph = opfuse.load("zoo:resnet8")                       # or a path to an .onnx file
    model = opfuse.compile("zoo:resnet8", target="host")     # fused C, built and loaded
    outputs = model.run({"input": x})
    print(model.report["kernels_before"], "->", model.report["kernels_after"])
"""
from opfuse.version import __version__


def load(model, input_shapes=None, input_values=None):
    """A verified, shape-inferred Graph from ``zoo:NAME``, an ``.onnx`` path or a ModelProto
    (``input_values``: graph inputs bound to values, see ``opfuse.api.load``)."""
    from opfuse.api import load as _load
    return _load(model, input_shapes, input_values)


def compile(model, target: str = "host", fuse: bool = True, **kwargs):  # noqa: A001 (the API's name)
    """Compile a model to native code; see ``opfuse.compiler.compile``."""
    from opfuse.compiler import compile as _compile
    return _compile(model, target=target, fuse=fuse, **kwargs)


def quantize(model, calibration=None, **kwargs):
    """Post-training static INT8 quantization to QDQ ONNX; see ``opfuse.quantization.quantize``."""
    from opfuse.quantization import quantize as _quantize
    return _quantize(model, calibration, **kwargs)


__all__ = ["__version__", "load", "compile", "quantize"]
