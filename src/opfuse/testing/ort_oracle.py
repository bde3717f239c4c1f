"""onnxruntime as an exact oracle of 8-bit integer products, on any x86 CPU.

Where an x86 CPU has no VNNI (AVX512-VNNI or AVX-VNNI), onnxruntime's kernels multiply uint8 by int8 with
``vpmaddubsw``, which adds each pair of products in int16 with saturation: a QLinearConv, QLinearMatMul,
MatMulInteger, ConvInteger or QGemm of full-range int8 weights can be off by thousands in its accumulator (a
64-deep MatMulInteger was off by 12327 on an AMD EPYC with AVX2 only), and its 8-bit output by tens of steps.
Its uint8 x uint8 kernels widen both operands to int16 first and are exact on every CPU.

``u8_weights(model)`` is the same model with each int8 weight of such a product, where the other operand is
uint8, made uint8: ``w + 128`` with its zero point ``+ 128``, so every difference ``w - zero_point`` the product
multiplies is unchanged; onnxruntime computes it exactly on every CPU. A product of two int8 operands
(onnxruntime's S8S8) cannot be moved so: ``products_saturate()`` says whether this CPU's onnxruntime may
saturate it, and such a comparison runs a model in QDQ form unfused instead (``session(model, fused=False)``:
DequantizeLinear, the float product, QuantizeLinear).
"""
from __future__ import annotations

import functools
import platform

import numpy as np

from opfuse.targets.calibrate import cpu_flags

# (op type, domain): (weight input, weight zero point input, the other operand's zero point input)
_PRODUCTS = {("QLinearConv", ""): (3, 5, 2), ("QLinearMatMul", ""): (3, 5, 2), ("MatMulInteger", ""): (1, 3, 2),
             ("ConvInteger", ""): (1, 3, 2), ("QGemm", "com.microsoft"): (3, 5, 2)}
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni")


@functools.lru_cache(maxsize=None)
def products_saturate() -> bool:
    """Whether onnxruntime's 8-bit products may saturate on this CPU: x86-64 without VNNI."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return not cpu_flags() & set(_VNNI_FLAGS)


def u8_weights(model):
    """A copy of ``model`` whose int8 weight initializers of 8-bit products with a uint8 operand (and their zero
    points) are uint8 (``w + 128``, ``zero_point + 128``): the same products, which onnxruntime computes exactly.
    The model itself is unchanged; a weight without a zero point gets one (128)."""
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    made: dict[str, str] = {}

    def shifted(name: str, fallback_shape: tuple[int, ...] = ()) -> str:
        """The uint8 initializer of the int8 one ``name`` (or of a zero point of 0, when ``name`` is empty)."""
        if name in made:
            return made[name]
        values = numpy_helper.to_array(inits[name]) if name else np.zeros(fallback_shape, np.int8)
        new = f"{name or 'zero_point'}__u8_{len(made)}"
        graph.initializer.append(numpy_helper.from_array((values.astype(np.int16) + 128).astype(np.uint8), new))
        made[name] = new
        return new

    def dtype(name: str):
        return numpy_helper.to_array(inits[name]).dtype if name in inits else None

    for node in graph.node:
        spec = _PRODUCTS.get((node.op_type, node.domain or ""))
        if spec is None:
            continue
        w, wz, az = spec
        if len(node.input) <= w or dtype(node.input[w]) != np.int8:
            continue
        if len(node.input) <= az or dtype(node.input[az]) != np.uint8:
            continue  # the other operand's type is not known to be uint8 (an int8 one has no exact form)
        has_zero_point = len(node.input) > wz and node.input[wz]
        if has_zero_point and dtype(node.input[wz]) != np.int8:
            continue
        while len(node.input) <= wz:
            node.input.append("")
        node.input[wz] = shifted(node.input[wz]) if has_zero_point else shifted("")
        node.input[w] = shifted(node.input[w])
    return out


def session(model, *, fused: bool = True):
    """An onnxruntime CPU session of ``model``; ``fused=False`` disables its graph optimizations (a QDQ model runs
    as DequantizeLinear, the float op and QuantizeLinear, not as an 8-bit product)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not fused:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run(model, feeds: dict, *, exact: bool = True, fused: bool = True) -> dict[str, np.ndarray]:
    """onnxruntime's outputs of ``model`` by name; ``exact``: computed on ``u8_weights(model)``."""
    sess = session(u8_weights(model) if exact else model, fused=fused)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))
