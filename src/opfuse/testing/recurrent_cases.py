"""Random LSTM / GRU / RNN configurations for the tests: inputs and attributes of one node.

``random_case(rng, op)`` draws sizes, a direction, a layout, optional inputs (B, sequence_lens,
initial_h/c, P), a clip, non-default activations and the op's own flags; ``onnx_model(case)``
writes the node as a one-node ONNX model (every present input a graph input) for the
references (``onnx.reference`` and onnxruntime) and for opfuse's importer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

# Activation lists the random cases draw from (per direction): the defaults first.
ACTIVATION_CHOICES = {
    "LSTM": [["Sigmoid", "Tanh", "Tanh"], ["HardSigmoid", "Softsign", "Elu"], ["Sigmoid", "Relu", "ScaledTanh"],
             ["Sigmoid", "LeakyRelu", "Softplus"]],
    "GRU": [["Sigmoid", "Tanh"], ["HardSigmoid", "Affine"], ["Sigmoid", "ThresholdedRelu"], ["Sigmoid", "Softsign"]],
    "RNN": [["Tanh"], ["Relu"], ["Sigmoid"], ["LeakyRelu"], ["Affine"], ["Elu"], ["ScaledTanh"], ["Softplus"]],
}
TAKES_ALPHA = {"Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu"}
TAKES_BETA = {"Affine", "ScaledTanh", "HardSigmoid"}
INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


@dataclass
class RecurrentCase:
    op: str
    inputs: list            # np.ndarray or None, in ONNX input order (trailing Nones dropped)
    attrs: dict = field(default_factory=dict)
    num_outputs: int = 1
    opset: int = 14

    def feeds(self) -> dict[str, np.ndarray]:
        return {n: x for n, x in zip(INPUT_NAMES, self.inputs, strict=False) if x is not None}


def random_case(rng: np.random.Generator, op: str, *, layout: int | None = None, seq_lens: bool | None = None,
                activations: bool | None = None, clip: bool | None = None, direction: str | None = None,
                sizes: tuple[int, int, int, int] | None = None) -> RecurrentCase:
    """One random configuration of ``op``; the keyword arguments pin a feature on or off."""
    T, B, I_, H = sizes or (int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(1, 7)),
                            int(rng.integers(1, 9)))
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    direction = direction or str(rng.choice(["forward", "reverse", "bidirectional"]))
    D = 2 if direction == "bidirectional" else 1
    layout = int(rng.integers(0, 2)) if layout is None else layout

    def randn(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    x = randn(T, B, I_) if layout == 0 else randn(B, T, I_)
    w = randn(D, G * H, I_, scale=0.5)
    r = randn(D, G * H, H, scale=0.5)
    state = (D, B, H) if layout == 0 else (B, D, H)
    b = randn(D, 2 * G * H) if rng.random() < 0.7 else None
    lens = None
    if seq_lens if seq_lens is not None else rng.random() < 0.4:
        lens = rng.integers(1, T + 1, size=B).astype(np.int32)
        lens[rng.integers(0, B)] = T
    h0 = randn(*state) if rng.random() < 0.5 else None
    inputs = [x, w, r, b, lens, h0]
    if op == "LSTM":
        inputs += [randn(*state) if rng.random() < 0.5 else None, randn(D, 3 * H) if rng.random() < 0.5 else None]
    while inputs[-1] is None:
        inputs.pop()
    attrs: dict = {"direction": direction, "hidden_size": H}
    if layout:
        attrs["layout"] = 1
    if clip if clip is not None else rng.random() < 0.3:
        attrs["clip"] = float(rng.uniform(0.5, 3.0))
    if activations if activations is not None else rng.random() < 0.4:
        choices = ACTIVATION_CHOICES[op]
        acts = [a for _ in range(D) for a in choices[int(rng.integers(0, len(choices)))]]
        attrs["activations"] = acts
        n_alpha = sum(a in TAKES_ALPHA for a in acts)
        n_beta = sum(a in TAKES_BETA for a in acts)
        if n_alpha:
            attrs["activation_alpha"] = [float(rng.uniform(0.1, 0.9)) for _ in range(n_alpha)]
        if n_beta:
            attrs["activation_beta"] = [float(rng.uniform(0.1, 0.9)) for _ in range(n_beta)]
    if op == "LSTM" and rng.random() < 0.3:
        attrs["input_forget"] = 1
    if op == "GRU" and rng.random() < 0.5:
        attrs["linear_before_reset"] = 1
    num_outputs = int(rng.integers(1, 4 if op == "LSTM" else 3))
    return RecurrentCase(op, inputs, attrs, num_outputs, opset=14 if layout or rng.random() < 0.5 else 7)


def onnx_model(case: RecurrentCase, *, opset: int | None = None) -> onnx.ModelProto:
    """The case as a one-node ONNX model: present inputs are graph inputs, outputs ``Y``, ``Y_h``, ``Y_c``."""
    names = [n if x is not None else "" for n, x in zip(INPUT_NAMES, case.inputs, strict=False)]
    outputs = ["Y", "Y_h", "Y_c"][:case.num_outputs]
    node = helper.make_node(case.op, names, outputs, name="rnn0", **case.attrs)
    graph = helper.make_graph(
        [node], f"{case.op.lower()}_case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
         for n, x in zip(INPUT_NAMES, case.inputs, strict=False) if x is not None],
        [helper.make_empty_tensor_value_info(o) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset or case.opset)])
