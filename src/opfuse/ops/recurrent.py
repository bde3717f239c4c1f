"""The recurrent ops LSTM, GRU and RNN (ONNX opsets 7, 14 and 22: one semantics, ``layout`` from 14).

Shapes (``layout=0``; ``layout=1`` swaps the first two axes of X, Y, initial_h/c, Y_h/c so the
batch comes first: X [B, T, I], Y [B, T, D, H], Y_h [B, D, H]):

    X [T, B, I]   W [D, G*H, I]   R [D, G*H, H]   B [D, 2*G*H]   sequence_lens [B] (int32)
    initial_h, initial_c [D, B, H]   P [D, 3*H] (LSTM)   ->   Y [T, D, B, H], Y_h, Y_c [D, B, H]

``D`` is 2 for ``direction="bidirectional"`` else 1, ``G`` the gates (LSTM 4: i, o, f, c; GRU 3:
z, r, h; RNN 1). With ``x = X[t, b]``, ``h`` and ``c`` the state, ``Wb``/``Rb`` the two halves of B
and every gate pre-activation clipped to ``[-clip, clip]`` when ``clip`` is given:

    LSTM  i = f(x Wi^T + h Ri^T + Pi * c + Wbi + Rbi)        (f, g, h default Sigmoid, Tanh, Tanh)
          f = f(x Wf^T + h Rf^T + Pf * c + Wbf + Rbf)        (input_forget=1: f = 1 - i)
          c' = g(x Wc^T + h Rc^T + Wbc + Rbc)
          C = f * c + i * c';   o = f(x Wo^T + h Ro^T + Po * C + Wbo + Rbo);   H = o * h(C)
    GRU   z = f(x Wz^T + h Rz^T + Wbz + Rbz);   r = f(x Wr^T + h Rr^T + Wbr + Rbr)  (f, g: Sigmoid, Tanh)
          h' = g(x Wh^T + (r * h) Rh^T + Rbh + Wbh)          (linear_before_reset=0)
          h' = g(x Wh^T + r * (h Rh^T + Rbh) + Wbh)          (linear_before_reset=1)
          H = (1 - z) * h' + z * h
    RNN   H = f(x Wi^T + h Ri^T + Wbi + Rbi)                 (f: Tanh)

The reverse direction walks t from ``sequence_lens[b] - 1`` down to 0. Batch entry ``b`` runs
``sequence_lens[b]`` steps (default T): its Y rows at ``t >= sequence_lens[b]`` are 0 and Y_h/Y_c
hold the state after its last step (zeros when it runs none), as onnxruntime does.
Both directions write Y interleaved along its direction axis.

``activations`` lists the per-direction functions (forward's, then reverse's); ``activation_alpha``
and ``activation_beta`` are consumed in that order by the functions that take the parameter
(Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu), each falling back to the
default of its ONNX op when the list is exhausted (onnxruntime's reading of the standard).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opfuse.errors import InputError, UnsupportedOpError
from opfuse.ir.graph import Node, TensorType
from opfuse.ops.common import shape_error
from opfuse.ops.registry import Category, Mapping, OpSpec, register

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
# Inputs: X, W, R, B, sequence_lens, initial_h, then initial_c and P (LSTM only).
INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
DIRECTIONS = ("forward", "reverse", "bidirectional")

# Which parameters each activation takes, with its ONNX op's defaults (alpha, beta).
ACTIVATION_PARAMS: dict[str, tuple[float | None, float | None]] = {
    "Relu": (None, None), "Tanh": (None, None), "Sigmoid": (None, None), "Softsign": (None, None),
    "Softplus": (None, None), "Affine": (1.0, 0.0), "LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None),
    "ScaledTanh": (1.0, 1.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, None),
}
_CANONICAL_NAME = {k.lower(): k for k in ACTIVATION_PARAMS}


@dataclass(frozen=True)
class Activation:
    """One activation function with its parameters (``None`` where it takes none)."""

    name: str
    alpha: float | None = None
    beta: float | None = None

    def apply(self, x: np.ndarray) -> np.ndarray:
        a, b, n = self.alpha, self.beta, self.name
        one = x.dtype.type(1)
        if n == "Sigmoid":
            with np.errstate(over="ignore"):
                return one / (one + np.exp(-x))
        if n == "Tanh":
            return np.tanh(x)
        if n == "Relu":
            return np.maximum(x, 0)
        if n == "Affine":
            return x * x.dtype.type(a) + x.dtype.type(b)
        if n == "LeakyRelu":
            return np.where(x >= 0, x, x * x.dtype.type(a))
        if n == "ThresholdedRelu":
            return np.where(x > x.dtype.type(a), x, 0).astype(x.dtype)
        if n == "ScaledTanh":
            return x.dtype.type(a) * np.tanh(x.dtype.type(b) * x)
        if n == "HardSigmoid":
            return np.clip(x * x.dtype.type(a) + x.dtype.type(b), 0, 1).astype(x.dtype)
        if n == "Elu":
            return np.where(x >= 0, x, x.dtype.type(a) * np.expm1(np.minimum(x, 0))).astype(x.dtype)
        if n == "Softsign":
            return x / (one + np.abs(x))
        if n == "Softplus":
            return (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))).astype(x.dtype)
        raise AssertionError(n)


@dataclass(frozen=True)
class RecurrentConfig:
    """A recurrent node's static description: sizes, direction, activations per direction."""

    op: str
    seq: int            # T
    batch: int          # B
    input_size: int     # I
    hidden: int         # H
    directions: int     # D
    reverse_only: bool  # direction="reverse"
    layout: int
    clip: float | None
    activations: tuple[tuple[Activation, ...], ...]  # per direction: (f, g, h) / (f, g) / (f,)
    input_forget: bool = False
    linear_before_reset: bool = False

    @property
    def gates(self) -> int:
        return GATES[self.op]

    def is_reverse(self, d: int) -> bool:
        return d == 1 or self.reverse_only


def _activations(node: Node, a: dict, directions: int) -> tuple[tuple[Activation, ...], ...]:
    per = len(DEFAULT_ACTIVATIONS[node.op_type])
    names = a.get("activations")
    if names is None:
        names = list(DEFAULT_ACTIVATIONS[node.op_type]) * directions
    names = [str(n) for n in names]
    if len(names) != per * directions:
        raise shape_error(node, f"activations lists {len(names)} functions, {node.op_type} with "
                                f"{directions} direction(s) takes {per * directions}")
    alphas = [float(x) for x in (a.get("activation_alpha") or [])]
    betas = [float(x) for x in (a.get("activation_beta") or [])]
    acts = []
    for name in names:
        canon = _CANONICAL_NAME.get(name.lower())
        if canon is None:
            raise UnsupportedOpError(node.op_type, node.name,
                                     detail=f"activation '{name}' (known: {', '.join(ACTIVATION_PARAMS)})")
        da, db = ACTIVATION_PARAMS[canon]
        alpha = (alphas.pop(0) if alphas else da) if da is not None else None
        beta = (betas.pop(0) if betas else db) if db is not None else None
        acts.append(Activation(canon, alpha, beta))
    return tuple(tuple(acts[d * per:(d + 1) * per]) for d in range(directions))


def recurrent_config(node: Node, a: dict) -> RecurrentConfig:
    """Check a recurrent node's inputs and attributes; its ``RecurrentConfig``."""
    op = node.op_type
    ins = list(node.inputs) + [None] * (len(INPUT_NAMES) - len(node.inputs))
    x, w, r = ins[0], ins[1], ins[2]
    if x is None or w is None or r is None:
        raise shape_error(node, "X, W and R are required")
    direction = str(a["direction"])
    if direction not in DIRECTIONS:
        raise shape_error(node, f"direction '{direction}' is not one of {', '.join(DIRECTIONS)}")
    D = 2 if direction == "bidirectional" else 1
    layout = int(a["layout"])
    if layout not in (0, 1):
        raise shape_error(node, f"layout must be 0 or 1, got {layout}")
    if len(x.shape) != 3:
        raise shape_error(node, f"X must be 3-D, has shape {x.shape}")
    T, B, I_ = x.shape if layout == 0 else (x.shape[1], x.shape[0], x.shape[2])
    G = GATES[op]
    if len(r.shape) != 3:
        raise shape_error(node, f"R must be 3-D [num_directions, {G}*hidden_size, hidden_size], has shape {r.shape}")
    H = int(r.shape[2])
    if a.get("hidden_size") is not None and int(a["hidden_size"]) != H:
        raise shape_error(node, f"hidden_size={a['hidden_size']} but R has shape {r.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise shape_error(node, f"X must be a floating-point tensor, is {x.dtype}")

    def want(v, shape, what):
        if v is not None and (tuple(v.shape) != tuple(shape) or v.dtype != x.dtype and what != "sequence_lens"):
            raise shape_error(node, f"{what} must be {x.dtype}{list(shape)}, is {v.dtype}{list(v.shape)}")

    want(w, (D, G * H, I_), "W")
    want(r, (D, G * H, H), "R")
    want(ins[3], (D, 2 * G * H), "B")
    state = (D, B, H) if layout == 0 else (B, D, H)
    want(ins[5], state, "initial_h")
    s = ins[4]
    if s is not None and (tuple(s.shape) != (B,) or s.dtype != np.int32):
        raise shape_error(node, f"sequence_lens must be int32[{B}], is {s.dtype}{list(s.shape)}")
    if op == "LSTM":
        want(ins[6], state, "initial_c")
        want(ins[7], (D, 3 * H), "P")
    elif any(v is not None for v in ins[6:]):
        raise shape_error(node, f"{op} takes at most 6 inputs")
    clip = a.get("clip")
    if clip is not None and not float(clip) > 0:
        raise shape_error(node, f"clip must be positive, got {clip}")
    return RecurrentConfig(op, T, B, I_, H, D, direction == "reverse", layout,
                           None if clip is None else float(clip), _activations(node, a, D),
                           input_forget=bool(int(a.get("input_forget", 0))),
                           linear_before_reset=bool(int(a.get("linear_before_reset", 0))))


def output_shapes(cfg: RecurrentConfig) -> list[tuple[int, ...]]:
    """Y, Y_h (and Y_c) shapes."""
    T, B, D, H = cfg.seq, cfg.batch, cfg.directions, cfg.hidden
    y = (T, D, B, H) if cfg.layout == 0 else (B, T, D, H)
    state = (D, B, H) if cfg.layout == 0 else (B, D, H)
    return [y, state] + ([state] if cfg.op == "LSTM" else [])


def _infer(node: Node, a: dict):
    cfg = recurrent_config(node, a)
    shapes = output_shapes(cfg)
    if len(node.outputs) > len(shapes):
        raise shape_error(node, f"{node.op_type} has at most {len(shapes)} outputs")
    return [TensorType(s, node.input(0).dtype) for s in shapes[:len(node.outputs)]]


# The reference ----------------------------------------------------------------------------------

def _clip(x: np.ndarray, clip: float | None) -> np.ndarray:
    return x if clip is None else np.clip(x, -clip, clip)


def sequence_lens_message(node: Node, seq: int) -> str:
    """The ``InputError`` of a ``sequence_lens`` value outside ``[0, seq]`` (the C code's fault too)."""
    return f"{node.op_type} node '{node.name}': a sequence_lens value lies outside [0, {seq}]"


def _lengths(cfg: RecurrentConfig, seq_lens: np.ndarray | None, node: Node) -> np.ndarray:
    if seq_lens is None:
        return np.full(cfg.batch, cfg.seq, np.int64)
    lens = np.asarray(seq_lens).astype(np.int64).reshape(-1)
    if np.any(lens < 0) or np.any(lens > cfg.seq):  # a run-time value: the input's fault, as in C
        raise InputError(sequence_lens_message(node, cfg.seq))
    return lens


def _cell(cfg: RecurrentConfig, d: int, xw: np.ndarray, h: np.ndarray, c: np.ndarray | None,
          Rt: np.ndarray, rb: np.ndarray, p: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """One step of direction ``d`` for every batch row: ``xw`` = x W^T + Wb (+ Rb where it is
    added outside the reset gate)."""
    H, acts, clip = cfg.hidden, cfg.activations[d], cfg.clip
    one = xw.dtype.type(1)
    if cfg.op == "RNN":
        return acts[0].apply(_clip(xw + h @ Rt, clip)), None
    if cfg.op == "GRU":
        zr = xw[:, :2 * H] + h @ Rt[:, :2 * H]
        z = acts[0].apply(_clip(zr[:, :H], clip))
        r = acts[0].apply(_clip(zr[:, H:], clip))
        if cfg.linear_before_reset:
            pre = xw[:, 2 * H:] + r * (h @ Rt[:, 2 * H:] + rb)
        else:
            pre = xw[:, 2 * H:] + (r * h) @ Rt[:, 2 * H:]
        hh = acts[1].apply(_clip(pre, clip))
        return (one - z) * hh + z * h, None
    assert c is not None and p is not None
    g = xw + h @ Rt
    i = acts[0].apply(_clip(g[:, :H] + p[:H] * c, clip))
    if cfg.input_forget:
        f = one - i
    else:
        f = acts[0].apply(_clip(g[:, 2 * H:3 * H] + p[2 * H:] * c, clip))
    cc = acts[1].apply(_clip(g[:, 3 * H:], clip))
    c_new = f * c + i * cc
    o = acts[0].apply(_clip(g[:, H:2 * H] + p[H:2 * H] * c_new, clip))
    return o * acts[2].apply(c_new), c_new


def _recurrent(ins, a, node):
    cfg = recurrent_config(node, a)
    ins = list(ins) + [None] * (len(INPUT_NAMES) - len(ins))
    x, w, r, bias, seq_lens, h0, c0, peep = ins[:8]
    dt = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    T, B, H, D, G = cfg.seq, cfg.batch, cfg.hidden, cfg.directions, cfg.gates
    x = np.asarray(x, dt)
    if cfg.layout:
        x = x.swapaxes(0, 1)
        h0 = None if h0 is None else np.asarray(h0).swapaxes(0, 1)
        c0 = None if c0 is None else np.asarray(c0).swapaxes(0, 1)
    lens = _lengths(cfg, seq_lens, node)
    y = np.zeros((T, D, B, H), dt)
    yh = np.zeros((D, B, H), dt)
    yc = np.zeros((D, B, H), dt)
    for d in range(D):
        Wt = np.asarray(w[d], dt).T
        Rt = np.asarray(r[d], dt).T
        bd = np.zeros(2 * G * H, dt) if bias is None else np.asarray(bias[d], dt)
        wb, rb = bd[:G * H], bd[G * H:]
        outside = wb + rb
        if cfg.op == "GRU" and cfg.linear_before_reset:
            outside = np.concatenate([wb[:2 * H] + rb[:2 * H], wb[2 * H:]])
        h = np.zeros((B, H), dt) if h0 is None else np.array(h0[d], dt)
        c = np.zeros((B, H), dt) if c0 is None else np.array(c0[d], dt)
        p = np.zeros(3 * H, dt) if peep is None else np.asarray(peep[d], dt)
        for s in range(T):
            t = T - 1 - s if cfg.is_reverse(d) else s
            # Row b runs the steps t < lens[b]: forward it stops there, reverse it starts there.
            live = t < lens
            if not live.any():
                continue
            xw = x[t] @ Wt + outside
            hn, cn = _cell(cfg, d, xw, h, c, Rt, rb[2 * H:] if cfg.op == "GRU" else rb, p)
            h = np.where(live[:, None], hn, h)
            if cn is not None:
                c = np.where(live[:, None], cn, c)
            y[t, d] = np.where(live[:, None], hn, 0)
        ran = (lens > 0)[:, None]  # a row that runs no step ends with a zero state (onnxruntime)
        yh[d], yc[d] = np.where(ran, h, 0), np.where(ran, c, 0)
    outs = [y, yh, yc]
    if cfg.layout:
        outs = [y.transpose(2, 0, 1, 3), yh.swapaxes(0, 1), yc.swapaxes(0, 1)]
    return [np.ascontiguousarray(o).astype(node.input(0).dtype) for o in outs[:len(node.outputs)]]


def _flops(node: Node, a: dict) -> int:
    cfg = recurrent_config(node, a)
    per_step = 2 * cfg.gates * cfg.hidden * (cfg.input_size + cfg.hidden) + 8 * cfg.gates * cfg.hidden
    return cfg.directions * cfg.seq * cfg.batch * per_step


_COMMON_ATTRS = {"activation_alpha": None, "activation_beta": None, "activations": None, "clip": None,
                 "direction": "forward", "hidden_size": None, "layout": 0}

register(OpSpec("LSTM", Category.OPAQUE, Mapping.MANY_TO_MANY, _infer, _recurrent, num_inputs=(3, 8),
                num_outputs=(1, 3), attrs={**_COMMON_ATTRS, "input_forget": 0}, flops_fn=_flops,
                dtypes=frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})))
register(OpSpec("GRU", Category.OPAQUE, Mapping.MANY_TO_MANY, _infer, _recurrent, num_inputs=(3, 6),
                num_outputs=(1, 2), attrs={**_COMMON_ATTRS, "linear_before_reset": 0}, flops_fn=_flops,
                dtypes=frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})))
register(OpSpec("RNN", Category.OPAQUE, Mapping.MANY_TO_MANY, _infer, _recurrent, num_inputs=(3, 6),
                num_outputs=(1, 2), attrs=_COMMON_ATTRS, flops_fn=_flops,
                dtypes=frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})))
