"""The reference executor: runs any Graph node by node with each op's NumPy reference.

This is the oracle every fusion is checked against, so it is deliberately simple:
no fusion, no reuse, float64 internally where an op's reference chooses to.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from opfuse.errors import InputError
from opfuse.ir.dtypes import is_floating
from opfuse.ir.graph import Graph
from opfuse.ops.limits import check_tensor_size
from opfuse.ops.registry import run_node


def cast_input(name: str, a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` converted to ``dtype`` when every value fits; ``InputError`` naming the input otherwise.

    A value fits when the conversion keeps it: integers (and integral floats) inside the target
    integer range, finite floats below the target float's maximum (rounding to the nearest float
    is expected; overflowing to infinity is not), 0 and 1 for bool. NaN and infinities convert
    between float types only."""
    dtype = np.dtype(dtype)
    a = np.asarray(a)
    kinds = "biuf"
    src_kind, dst_kind = _kind(a.dtype), _kind(dtype)
    if src_kind not in kinds or dst_kind not in kinds:
        raise InputError(f"input '{name}' has dtype {a.dtype}, which cannot be converted to {dtype}")
    bad: np.ndarray | None = None
    if a.size == 0 or src_kind == "b":
        pass
    elif dst_kind == "b":
        bad = (a != 0) & (a != 1)
    elif dst_kind in "iu":
        info = np.iinfo(dtype)
        if src_kind == "f":
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(a) | (a != np.trunc(a)) | (a < float(info.min)) | (a >= float(info.max) + 1.0)
        else:  # a value fits when it survives the round trip with its sign
            b = a.astype(dtype)
            bad = (b.astype(a.dtype) != a) | ((a < 0) != (b < 0))
    elif src_kind == "f":  # float to float: only finite values that overflow
        with np.errstate(over="ignore", invalid="ignore"):
            bad = np.isfinite(a) & ~np.isfinite(a.astype(dtype))
    if bad is not None and np.any(bad):
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        at = f" at index {list(where)}" if where else ""
        raise InputError(f"input '{name}': value {a[where].item()!r}{at} does not fit the model's dtype {dtype}")
    return a.astype(dtype)


def _kind(dtype: np.dtype) -> str:
    """NumPy's kind letter, ``"f"`` for bfloat16 too (ml_dtypes' types are kind ``"V"``)."""
    return "f" if is_floating(dtype) else dtype.kind


def check_inputs(graph: Graph, feeds: Mapping[str, np.ndarray], *, cast: bool = False) -> dict[str, np.ndarray]:
    """Validate run-time inputs against the graph's inputs: names, shapes and dtypes.

    An input of another dtype is an ``InputError``, unless ``cast=True``: then it is converted
    when every value fits the model's dtype (``cast_input``). A byte-order difference alone is
    always converted (no value changes)."""
    if not isinstance(feeds, Mapping):
        raise InputError(f"the inputs must be a mapping from input names to arrays (a dict), not "
                         f"{type(feeds).__name__}")
    known = {v.name for v in graph.inputs}
    extra = sorted(set(feeds) - known, key=str)
    if extra:
        fixed = sorted({v.name for v in graph.constants} & set(extra))
        note = (f" ({', '.join(repr(n) for n in fixed)}: an initializer the ONNX file also lists as an input, which "
                f"opfuse takes as the constant it stores)") if fixed else ""
        raise InputError(f"unknown input(s) {extra}; the model's inputs are {sorted(known)}{note}")
    out = {}
    for v in graph.inputs:
        if v.name not in feeds:
            raise InputError(f"missing input '{v.name}' (expected {v.type})")
        given = feeds[v.name]
        a = np.asarray(given)
        if a.dtype == object or a.dtype.kind in "US":  # None, a dict, text: np.asarray takes anything
            what = f"text ({a.dtype})" if a.dtype.kind in "US" else \
                "an object array" if isinstance(given, np.ndarray) else f"a {type(given).__name__}"
            raise InputError(f"input '{v.name}' is {what}, not an array of numbers (expected {v.type})")
        if tuple(a.shape) != v.shape:
            raise InputError(f"input '{v.name}' has shape {tuple(a.shape)}, the model expects {v.shape}")
        if a.dtype != v.dtype:
            if a.dtype.newbyteorder("=") == v.dtype:
                a = a.astype(v.dtype)
            elif cast:
                a = cast_input(v.name, a, v.dtype)
            else:
                raise InputError(f"input '{v.name}' has dtype {a.dtype}, the model expects {v.dtype} "
                                 f"(convert it, or opt in to converting values that fit: run(..., cast=True), "
                                 f"--cast-inputs)")
        out[v.name] = a
    return out


def run(graph: Graph, feeds: Mapping[str, np.ndarray], *, keep: bool = False,
        cast: bool = False) -> dict[str, np.ndarray]:
    """Run the graph; returns the graph outputs by name (every value with ``keep=True``).

    ``cast=True`` converts inputs of another dtype when their values fit (``check_inputs``)."""
    env: dict[int, np.ndarray] = {}
    for name, a in check_inputs(graph, feeds, cast=cast).items():
        env[id(graph.values[name])] = a
    for v in graph.constants:
        assert v.const is not None  # graph.constants are the values with data
        env[id(v)] = v.const
    remaining = {id(v): len(v.uses) for v in graph.values.values()}
    pinned = {id(v) for v in graph.outputs}
    for node in graph.nodes:
        args = [env[id(v)] if v is not None else None for v in node.inputs]
        results = run_node(node, args)
        for v, r in zip(node.outputs, results, strict=False):
            r = np.asarray(r)
            if v.type is not None and r.dtype != v.dtype:
                r = r.astype(v.dtype)
            env[id(v)] = r
        if not keep:  # free intermediates at their last use
            for v in node.input_values():
                remaining[id(v)] -= 1
                if remaining[id(v)] == 0 and id(v) not in pinned and v.producer is not None:
                    env.pop(id(v), None)
    if keep:
        return {v.name: env[id(v)] for v in graph.values.values() if id(v) in env}
    return {v.name: env[id(v)] for v in graph.outputs}


class ReferenceExecutor:
    """Object form of ``run`` for symmetry with the native executor."""

    def __init__(self, graph: Graph):
        self.graph = graph

    def run(self, feeds: Mapping[str, np.ndarray], *, cast: bool = False) -> dict[str, np.ndarray]:
        return run(self.graph, feeds, cast=cast)


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for every graph input (normal floats, small non-negative ints)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"the seed of random inputs must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        check_tensor_size(v.shape, np.float64 if is_floating(v.dtype) else v.dtype,
                          f"random input '{v.name}'")  # floats are drawn in float64, then converted
        if is_floating(v.dtype):
            feeds[v.name] = rng.standard_normal(v.shape).astype(v.dtype)
        elif v.dtype == np.bool_:
            feeds[v.name] = rng.integers(0, 2, v.shape).astype(np.bool_)
        else:
            feeds[v.name] = rng.integers(0, 4, v.shape).astype(v.dtype)
    return feeds
