"""``ModelBuilder``: emit an ONNX graph node by node with seeded, scale-preserving weights.

Every zoo model is written against this one helper so that the Conv/BatchNorm/activation idioms
and the weight scaling that keeps activations O(1) live in one place.

Weight scaling. The builder tracks the mean and second moment ``m(t) = E[t^2]`` of every
activation tensor (``Stats``; graph inputs are N(0, 1)). For a weighted layer ``y = W x`` with
``fan_in`` inputs per output and weights ``w ~ N(0, s^2)`` drawn independently of ``x``,

    E[y] = 0,    E[y^2] = fan_in * s^2 * m(x),

so ``s^2 = TARGET_MOMENT / (fan_in * m(x))`` puts every layer's output at ``TARGET_MOMENT``.
This is He et al. (2015) initialisation (``s^2 = 2 / fan_in`` after a ReLU of a zero-mean
input, where ``m(x) = 1/2``) generalised to any input, so residual sums and max pooling do not
make activations grow layer after layer. Element-wise maps treat their input as Gaussian with
the tracked mean and variance and take ``E[f(z)]``, ``E[f(z)^2]`` by quadrature; a sum of
independent tensors has ``m(a + b) = m(a) + m(b) + 2 E[a] E[b]``.

BatchNorm with random inference statistics maps a zero-mean input's moment ``m`` to
``E[gamma^2] E[1 / (var + eps)] (m + E[mean^2]) + E[beta^2]``; a Conv feeding it divides its
weight variance by the leading factor so the normalised activations stay near 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# ONNX IR version 8 is the one that introduced opset 17 (onnx 1.12); every runtime that reads
# opset 17 reads it, unlike the newest IR the installed onnx package would stamp by default.
IR_VERSION = 8
PRODUCER = "opfuse.zoo"

# BatchNorm inference statistics: non-trivial, so folding BN into Conv is a real rewrite.
BN_GAMMA_RANGE = (0.5, 1.5)   # gamma ~ U(lo, hi)
BN_BETA_STD = 0.1             # beta ~ N(0, std)
BN_MEAN_STD = 0.1             # running mean ~ N(0, std)
BN_VAR_RANGE = (0.5, 1.5)     # running var ~ U(lo, hi)
BN_EPSILON = 1e-5             # PyTorch's default
# Conv/Gemm/MatMul biases: small, so they shift but do not dominate.
BIAS_STD = 0.1
# Second moment every weighted layer aims its (normalised) output at.
TARGET_MOMENT = 1.0
# Quadrature grid for Gaussian expectations: +-12 standard deviations, uniform.
_QUADRATURE_POINTS = 4001
_QUADRATURE_HALF_WIDTH = 12.0

ACTIVATIONS = ("relu", "silu", None)


@dataclass(frozen=True)
class Stats:
    """Per-element mean and second moment ``E[t^2]`` of an activation tensor."""

    mean: float
    moment: float

    @property
    def var(self) -> float:
        return max(self.moment - self.mean * self.mean, 0.0)


UNIT = Stats(0.0, 1.0)


def _uniform_square_mean(lo: float, hi: float) -> float:
    """E[g^2] for g ~ U(lo, hi)."""
    return (lo * lo + lo * hi + hi * hi) / 3.0


def _uniform_inverse_mean(lo: float, hi: float, eps: float) -> float:
    """E[1 / (v + eps)] for v ~ U(lo, hi)."""
    return math.log((hi + eps) / (lo + eps)) / (hi - lo)


# E[gamma^2] E[1 / (var + eps)]: how much a random-statistics BatchNorm scales a second moment.
BN_MOMENT_GAIN = _uniform_square_mean(*BN_GAMMA_RANGE) * _uniform_inverse_mean(*BN_VAR_RANGE, BN_EPSILON)


def batchnorm_stats(x: Stats) -> Stats:
    """Stats of ``gamma (x - mean) / sqrt(var + eps) + beta`` over the random BN parameters."""
    return Stats(0.0, BN_MOMENT_GAIN * (x.moment + BN_MEAN_STD ** 2) + BN_BETA_STD ** 2)


def relu(z: np.ndarray) -> np.ndarray:
    return np.maximum(z, 0.0)


def silu(z: np.ndarray) -> np.ndarray:
    return z / (1.0 + np.exp(-z))


def gelu(z: np.ndarray) -> np.ndarray:
    return 0.5 * z * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))


def gaussian_stats(f: Callable[[np.ndarray], np.ndarray], x: Stats, count: int = 1) -> Stats:
    """Stats of ``f(max(z_1..z_count))`` for iid ``z_i ~ N(x.mean, x.var)`` (``count = 1``:
    of ``f(z)``), by a Riemann sum on a wide uniform grid; the density of the maximum of
    ``count`` iid draws is ``count * pdf * cdf^(count - 1)``."""
    u, du = np.linspace(-_QUADRATURE_HALF_WIDTH, _QUADRATURE_HALF_WIDTH, _QUADRATURE_POINTS,
                        retstep=True)
    pdf = np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
    density = count * pdf * np.minimum(np.cumsum(pdf) * du, 1.0) ** (count - 1)
    y = f(x.mean + u * math.sqrt(x.var))
    return Stats(float(np.sum(y * density) * du), float(np.sum(y * y * density) * du))


class ModelBuilder:
    """Collects nodes and initializers; every helper returns the name of its output tensor.

    Each node's (first) output tensor is named after the node, so ``conv1`` produces ``conv1``;
    initializers are ``<node>.<role>`` (``conv1.weight``, ``conv1_bn.mean``). ``stats`` maps
    activation tensors to their ``Stats`` (see the module docstring).
    """

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.stats: dict[str, Stats] = {}
        self._names: set[str] = set()        # tensor names
        self._node_names: set[str] = set()

    # Plumbing ---------------------------------------------------------------------------
    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"zoo model '{self.name}': tensor name '{name}' used twice")
        self._names.add(name)
        return name

    def input(self, name: str, shape: Sequence[int]) -> str:
        """A float32 graph input, assumed N(0, 1) like ``random_inputs`` feeds it."""
        self.inputs.append(helper.make_tensor_value_info(self._claim(name), TensorProto.FLOAT,
                                                         list(shape)))
        self.stats[name] = UNIT
        return name

    def const(self, name: str, data, dtype=np.float32) -> str:
        """An initializer (float32 unless ``dtype`` says otherwise; int64 for shapes)."""
        arr = np.array(data, dtype=dtype, order="C")  # a copy; keeps 0-d scalars 0-d
        self.initializers.append(numpy_helper.from_array(arr, self._claim(name)))
        return name

    def node(self, op_type: str, inputs: Sequence[str], name: str, output: str | None = None,
             stats: Stats | None = None, **attrs) -> str:
        """Add a one-output node named ``name``; its output is named ``output`` (default: ``name``).

        ``stats`` are the output's statistics; by default those of the activation input with
        the largest second moment, right for shape ops, average pooling and concatenation
        (which cannot raise it beyond their largest input) and an upper bound the callers
        override where an op changes it.
        """
        return self._add_node(op_type, inputs, name, [output or name], stats, attrs)[0]

    def multi_output_node(self, op_type: str, inputs: Sequence[str], name: str, num_outputs: int,
                          stats: Stats | None = None, **attrs) -> list[str]:
        """Add a node named ``name`` with outputs ``name_0``, ``name_1``, ... (``stats`` as in
        ``node``)."""
        return self._add_node(op_type, inputs, name, [f"{name}_{i}" for i in range(num_outputs)], stats, attrs)

    def _add_node(self, op_type: str, inputs: Sequence[str], name: str, output_names: list[str],
                  stats: Stats | None, attrs: dict) -> list[str]:
        if name in self._node_names:
            raise ValueError(f"zoo model '{self.name}': node name '{name}' used twice")
        self._node_names.add(name)
        outputs = [self._claim(o) for o in output_names]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        if stats is None:
            known = [self.stats[i] for i in inputs if i in self.stats]
            stats = max(known, key=lambda s: s.moment) if known else None
        if stats is not None:
            self.stats.update((o, stats) for o in outputs)
        return outputs

    def build(self, outputs: Sequence[tuple[str, Sequence[int]]], doc: str = "") -> onnx.ModelProto:
        """The finished model; ``outputs`` are ``(tensor name, shape)`` pairs."""
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs],
            initializer=self.initializers, doc_string=doc)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                 producer_name=PRODUCER, ir_version=IR_VERSION)

    # Weights ----------------------------------------------------------------------------
    def scaled_normal(self, shape: Sequence[int], fan_in: int, x: str, out_moment: float) -> np.ndarray:
        """``w ~ N(0, out_moment / (fan_in * m(x)))``: ``W x`` then has second moment ``out_moment``."""
        std = math.sqrt(out_moment / (fan_in * self.stats[x].moment))
        return (self.rng.standard_normal(tuple(shape)) * std).astype(np.float32)

    def bias(self, n: int) -> np.ndarray:
        return (self.rng.standard_normal(n) * BIAS_STD).astype(np.float32)

    # Layers -----------------------------------------------------------------------------
    def conv(self, x: str, name: str, cin: int, cout: int, kernel: int | tuple[int, int],
             stride: int | tuple[int, int] = 1, pads: Sequence[int] | None = None, group: int = 1,
             bias: bool = False, bn_follows: bool = False) -> str:
        """Conv2d. ``pads`` default to ``k // 2`` on every side ("same" at stride 1 for odd k);
        ``bn_follows`` pre-divides by the BatchNorm's moment gain."""
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        if pads is None:
            pads = [kh // 2, kw // 2, kh // 2, kw // 2]
        fan_in = cin // group * kh * kw
        target = TARGET_MOMENT / BN_MOMENT_GAIN if bn_follows else TARGET_MOMENT
        w = self.scaled_normal((cout, cin // group, kh, kw), fan_in, x, target)
        inputs = [x, self.const(f"{name}.weight", w)]
        if bias:
            inputs.append(self.const(f"{name}.bias", self.bias(cout)))
        return self.node("Conv", inputs, name, kernel_shape=[kh, kw], strides=[sh, sw],
                         pads=list(pads), group=group, dilations=[1, 1],
                         stats=Stats(0.0, target + (BIAS_STD ** 2 if bias else 0.0)))

    def batchnorm(self, x: str, name: str, channels: int, output: str | None = None) -> str:
        """Inference BatchNormalization with random (non-trivial) statistics."""
        r = self.rng
        gamma = r.uniform(*BN_GAMMA_RANGE, channels)
        beta = r.standard_normal(channels) * BN_BETA_STD
        mean = r.standard_normal(channels) * BN_MEAN_STD
        var = r.uniform(*BN_VAR_RANGE, channels)
        ins = [x] + [self.const(f"{name}.{role}", a)
                     for role, a in (("scale", gamma), ("bias", beta), ("mean", mean), ("var", var))]
        return self.node("BatchNormalization", ins, name, output=output, epsilon=BN_EPSILON,
                         stats=batchnorm_stats(self.stats[x]))

    def relu(self, x: str, name: str, output: str | None = None) -> str:
        return self.node("Relu", [x], name, output=output, stats=gaussian_stats(relu, self.stats[x]))

    def silu(self, x: str, name: str, output: str | None = None) -> str:
        """SiLU as PyTorch exports ``nn.SiLU`` at opset 17: ``Mul(x, Sigmoid(x))``."""
        sig = self.node("Sigmoid", [x], f"{name}_sigmoid")
        return self.node("Mul", [x, sig], name, output=output, stats=gaussian_stats(silu, self.stats[x]))

    def add(self, a: str, b: str, name: str) -> str:
        """Residual sum of two independent activations."""
        sa, sb = self.stats[a], self.stats[b]
        return self.node("Add", [a, b], name,
                         stats=Stats(sa.mean + sb.mean, sa.moment + sb.moment + 2 * sa.mean * sb.mean))

    def maxpool(self, x: str, name: str, kernel: int, stride: int, pads: Sequence[int]) -> str:
        """MaxPool2d; the statistics are those of the maximum of ``kernel^2`` iid elements."""
        return self.node("MaxPool", [x], name, kernel_shape=[kernel, kernel], strides=[stride, stride],
                         pads=list(pads), stats=gaussian_stats(lambda z: z, self.stats[x], kernel * kernel))

    def conv_bn_act(self, x: str, name: str, cin: int, cout: int, kernel, stride=1, pads=None,
                    group: int = 1, bias: bool = False, act: str | None = "relu",
                    output: str | None = None) -> str:
        """Conv -> BatchNormalization -> activation, unfolded: nodes ``name``, ``name_bn``,
        ``name_relu`` (or ``name_silu``); ``act=None`` stops after the BatchNorm."""
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown activation '{act}'; expected one of {ACTIVATIONS}")
        y = self.conv(x, name, cin, cout, kernel, stride, pads, group, bias, bn_follows=True)
        if act is None:
            return self.batchnorm(y, f"{name}_bn", cout, output=output)
        y = self.batchnorm(y, f"{name}_bn", cout)
        if act == "relu":
            return self.relu(y, f"{name}_relu", output)
        return self.silu(y, f"{name}_silu", output)

    def gemm(self, x: str, name: str, fin: int, fout: int, output: str | None = None) -> str:
        """Fully connected ``y = x W^T + b`` as PyTorch exports ``nn.Linear`` on 2-D input."""
        w = self.const(f"{name}.weight", self.scaled_normal((fout, fin), fin, x, TARGET_MOMENT))
        b = self.const(f"{name}.bias", self.bias(fout))
        return self.node("Gemm", [x, w, b], name, output=output, transB=1,
                         stats=Stats(0.0, TARGET_MOMENT + BIAS_STD ** 2))

    def linear(self, x: str, name: str, fin: int, fout: int) -> str:
        """``nn.Linear`` on a 3-D input as PyTorch exports it: ``MatMul(x, W[fin, fout])``
        (node ``name_matmul``) then ``Add(b)`` (node ``name_add``)."""
        w = self.const(f"{name}.weight", self.scaled_normal((fin, fout), fin, x, TARGET_MOMENT))
        y = self.node("MatMul", [x, w], f"{name}_matmul", stats=Stats(0.0, TARGET_MOMENT))
        return self.node("Add", [y, self.const(f"{name}.bias", self.bias(fout))], f"{name}_add",
                         stats=Stats(0.0, TARGET_MOMENT + BIAS_STD ** 2))

    def classifier(self, x: str, name: str, fin: int, fout: int, output: str | None = None) -> str:
        """Flatten the pooled ``[1, fin, 1, 1]`` features, then Gemm to ``fout`` logits."""
        flat = self.node("Flatten", [x], f"{name}_flatten", axis=1)
        return self.gemm(flat, name, fin, fout, output)
