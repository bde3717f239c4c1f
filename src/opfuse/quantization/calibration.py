"""Calibration: sample inputs, the activations they produce, and each tensor's clipping range.

Three ways to pick the range ``[lo, hi]`` a tensor is quantized over (the methods onnxruntime's
quantizer offers, written here from their definitions):

* ``minmax``:     ``lo = min(x)``, ``hi = max(x)`` over every calibration sample;
* ``percentile``: the ``(100 - p) / 2`` and ``100 - (100 - p) / 2`` percentiles of the values (``p``
  = ``DEFAULT_PERCENTILE``; a non-negative tensor keeps ``lo = 0`` and cuts ``100 - p`` on top),
  read from a histogram of ``HISTOGRAM_BINS`` bins over ``[min, max]``;
* ``entropy``:    the threshold ``t`` that minimizes the KL divergence ``KL(P || Q)`` between the
  histogram ``P`` of the values clipped to ``t`` and ``Q``, that histogram merged into the
  quantized levels and spread back uniformly over the bins that were non-zero (TensorRT's method,
  as onnxruntime's ``get_entropy_threshold``). A non-negative tensor is searched one-sided
  (``[0, t]``, 256 levels), a signed one on ``|x|`` (``[-t, t]``, 128 levels a side), then
  intersected with ``[min, max]``. Exact zeros are left out (``without_zeros``), and the histogram is
  coarsened until its bins are populated (``coarsen``): with few values per bin the divergence cannot
  see what clipping loses.

Every range is widened to hold 0 (so 0 is exact), as every int8 runtime requires.

Histograms need the range first, so ``percentile`` and ``entropy`` run the calibration inputs twice
(min/max, then histograms): memory stays one sample's activations, whatever the sample count.
"""
from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from opfuse.errors import InputError
from opfuse.ir.graph import Graph

METHODS = ("minmax", "percentile", "entropy")
DEFAULT_PERCENTILE = 99.999  # as onnxruntime's percentile calibrator
HISTOGRAM_BINS = 2048  # bins of the value histogram for percentile and entropy
ENTROPY_MIN_BIN_COUNT = 8  # entropy: coarsen the histogram until its median non-empty bin holds this many
CALIBRATION_SEED = 1_000_000  # random calibration sample i is random_inputs(graph, CALIBRATION_SEED + i)


@dataclass(frozen=True)
class TensorRange:
    """The calibrated clipping range of one tensor and the statistics it came from."""

    name: str
    lo: float
    hi: float
    min: float  # observed over the calibration set
    max: float


# Calibration samples ------------------------------------------------------------------------------

def random_samples(graph: Graph, count: int) -> list[dict[str, np.ndarray]]:
    """``count`` seeded random samples (``random_inputs`` with seeds from ``CALIBRATION_SEED``)."""
    from opfuse.runtime.reference import random_inputs
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise InputError(f"--calibration-random needs a positive number of samples, got {count!r}")
    return [random_inputs(graph, CALIBRATION_SEED + i) for i in range(int(count))]


def load_samples(path: str, graph: Graph) -> list[dict[str, np.ndarray]]:
    """Samples from an ``.npz`` file keyed by the model's input names.

    Each array holds ``S`` samples of its input of shape ``(B, ...)``: shaped ``(S, B, ...)``, or
    ``(S * B, ...)`` (samples stacked along the batch axis). Every input must have the same ``S``."""
    if not os.path.isfile(path):
        raise InputError(f"calibration file '{path}' not found")
    if not zipfile.is_zipfile(path):
        raise InputError(f"calibration file '{path}' is not an .npz archive (write one with "
                         f"numpy.savez(path, input_name=samples))")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise InputError(f"cannot read calibration file '{path}': {e}") from None
    return split_samples(arrays, graph, f"calibration file '{path}'")


def split_samples(arrays: Mapping[str, np.ndarray], graph: Graph, where: str) -> list[dict[str, np.ndarray]]:
    """Per-input sample stacks (see ``load_samples``) as a list of feeds."""
    names = [v.name for v in graph.inputs]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(f"{where}: no samples for input(s) {missing} (it has {sorted(arrays)}; the model's "
                         f"inputs are {names})")
    extra = sorted(set(arrays) - set(names))
    if extra:
        raise InputError(f"{where}: unknown input(s) {extra}; the model's inputs are {names}")
    stacks: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        a = np.asarray(arrays[v.name])
        shape = tuple(v.shape)
        if a.dtype.kind not in "biuf":
            raise InputError(f"{where}: input '{v.name}' has dtype {a.dtype}, not a number type")
        if a.ndim == len(shape) + 1 and a.shape[1:] == shape:
            stack = a
        elif shape and a.ndim == len(shape) and a.shape[1:] == shape[1:] and shape[0] > 0 \
                and a.shape[0] % shape[0] == 0:
            stack = a.reshape((a.shape[0] // shape[0],) + shape)
        else:
            dims = ", ".join(map(str, shape))
            raise InputError(f"{where}: input '{v.name}' has shape {a.shape}; expected (S, {dims})"
                             + (f" or (S*{shape[0]}, {', '.join(map(str, shape[1:]))})" if shape else ""))
        if stack.shape[0] == 0:
            raise InputError(f"{where}: input '{v.name}' has no samples")
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise InputError(f"{where}: input '{v.name}' holds NaN or infinite values")
        stacks[v.name] = stack
    counts = {n: s.shape[0] for n, s in stacks.items()}
    if len(set(counts.values())) > 1:
        raise InputError(f"{where}: inputs have different sample counts {counts}")
    from opfuse.runtime.reference import check_inputs
    count = next(iter(counts.values()))
    return [check_inputs(graph, {n: s[i] for n, s in stacks.items()}, cast=True) for i in range(count)]


# Collecting statistics ----------------------------------------------------------------------------

Runner = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]


def collect_ranges(run: Runner, samples: Sequence[dict[str, np.ndarray]], tensors: Sequence[str],
                   method: str = "minmax", percentile: float = DEFAULT_PERCENTILE) -> dict[str, TensorRange]:
    """The clipping range of each of ``tensors`` (``run(feeds)`` gives every value by name)."""
    if method not in METHODS:
        raise InputError(f"unknown calibration method '{method}'; choose one of {', '.join(METHODS)}")
    if not 0.0 < percentile <= 100.0:
        raise InputError(f"percentile must be in (0, 100], got {percentile}")
    lo: dict[str, float] = {t: float("inf") for t in tensors}
    hi: dict[str, float] = {t: float("-inf") for t in tensors}
    for feeds in samples:
        values = run(feeds)
        for t in tensors:
            a = values[t]
            if a.size:
                lo[t] = min(lo[t], float(np.min(a)))
                hi[t] = max(hi[t], float(np.max(a)))
    for t in tensors:
        if not (np.isfinite(lo[t]) and np.isfinite(hi[t])):
            raise InputError(f"calibration: tensor '{t}' is NaN, infinite or empty on the calibration samples")
    if method == "minmax":
        return {t: TensorRange(t, min(lo[t], 0.0), max(hi[t], 0.0), lo[t], hi[t]) for t in tensors}
    hists = _histograms(run, samples, tensors, lo, hi)
    out = {}
    for t in tensors:
        hist, edges, zeros = hists[t]
        if method == "percentile":
            cut_lo, cut_hi = percentile_range(hist, edges, percentile, nonnegative=lo[t] >= 0)
        else:
            cut_lo, cut_hi = entropy_range(without_zeros(hist, edges, zeros), edges, nonnegative=lo[t] >= 0)
        cut_lo, cut_hi = max(cut_lo, lo[t]), min(cut_hi, hi[t])
        out[t] = TensorRange(t, min(cut_lo, 0.0), max(cut_hi, 0.0), lo[t], hi[t])
    return out


def _histograms(run: Runner, samples: Iterable[dict[str, np.ndarray]], tensors: Sequence[str],
                lo: dict[str, float], hi: dict[str, float]) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    """Per tensor: the histogram of ``x`` over ``[min(lo, 0), max(hi, 0)]`` and of ``|x|`` over
    ``[0, max(|lo|, |hi|)]``, ``HISTOGRAM_BINS`` bins each, concatenated (and so their edges), and the
    count of exact zeros."""
    edges = {}
    for t in tensors:
        top = max(abs(lo[t]), abs(hi[t])) or 1.0
        edges[t] = (np.linspace(min(lo[t], 0.0), max(hi[t], 0.0) or 1.0, HISTOGRAM_BINS + 1),
                    np.linspace(0.0, top, HISTOGRAM_BINS + 1))
    hists = {t: np.zeros(2 * HISTOGRAM_BINS, np.int64) for t in tensors}
    zeros = dict.fromkeys(tensors, 0)
    for feeds in samples:
        values = run(feeds)
        for t in tensors:
            a = np.asarray(values[t], np.float64).ravel()
            signed, absolute = edges[t]
            hists[t][:HISTOGRAM_BINS] += np.histogram(a, bins=signed)[0]
            hists[t][HISTOGRAM_BINS:] += np.histogram(np.abs(a), bins=absolute)[0]
            zeros[t] += int(np.count_nonzero(a == 0))
    return {t: (hists[t], np.concatenate([edges[t][0], edges[t][1]]), zeros[t]) for t in tensors}


# Ranges from histograms ---------------------------------------------------------------------------

def _split(hist: np.ndarray, edges: np.ndarray):
    n = HISTOGRAM_BINS
    return hist[:n], edges[:n + 1], hist[n:], edges[n + 1:]


def percentile_range(hist: np.ndarray, edges: np.ndarray, percentile: float,
                     nonnegative: bool) -> tuple[float, float]:
    """Cut ``100 - percentile`` percent of the values: on top for a non-negative tensor, half on
    each side otherwise (edges of the bins where the cumulative count crosses the cut)."""
    h, e, _, _ = _split(hist, edges)
    cdf = np.cumsum(h) / max(int(h.sum()), 1)
    cut = (100.0 - percentile) / 100.0
    if nonnegative:
        right = int(np.searchsorted(cdf, 1.0 - cut))
        return 0.0, float(e[min(right + 1, len(e) - 1)])
    left = int(np.searchsorted(cdf, cut / 2))
    right = int(np.searchsorted(cdf, 1.0 - cut / 2))
    return float(e[left]), float(e[min(right + 1, len(e) - 1)])


def kl_divergence_of_clip(p_hist: np.ndarray, stop: int, levels: int) -> float:
    """``KL(P || Q)``: ``P`` the first ``stop`` bins with the mass beyond added to the last one,
    ``Q`` those bins merged into ``levels`` groups, each group's mass spread over its non-zero bins."""
    p = p_hist[:stop].astype(np.float64).copy()
    p[-1] += float(p_hist[stop:].sum())
    nonzero = p_hist[:stop] != 0
    group = (np.arange(stop) * levels) // stop
    mass = np.bincount(group, weights=p_hist[:stop].astype(np.float64), minlength=levels)
    count = np.bincount(group, weights=nonzero.astype(np.float64), minlength=levels)
    q = np.where(nonzero, mass[group] / np.maximum(count[group], 1.0), 0.0)
    p_sum, q_sum = p.sum(), q.sum()
    if p_sum == 0 or q_sum == 0:
        return float("inf")
    p, q = p / p_sum, q / q_sum
    keep = p > 0
    with np.errstate(divide="ignore"):
        terms = p[keep] * np.log(p[keep] / q[keep])
    return float(np.sum(terms)) if np.all(q[keep] > 0) else float("inf")


def without_zeros(hist: np.ndarray, edges: np.ndarray, zeros: int) -> np.ndarray:
    """``hist`` without its exact zeros (a ReLU output's half): 0 is exact at every threshold, so it
    costs nothing; left in, its spike is smeared over the bins merged with it and the divergence
    blames every wide range for it, clipping ReLU outputs far too hard."""
    out = hist.copy()
    n = HISTOGRAM_BINS
    zero_bin = min(int(np.searchsorted(edges[:n + 1], 0.0, side="right")) - 1, n - 1)
    out[zero_bin] -= zeros
    out[n] -= zeros  # the first bin of |x|
    return out


def coarsen(hist: np.ndarray, edges: np.ndarray, floor: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge neighbouring bins in pairs until the median non-empty bin holds ``ENTROPY_MIN_BIN_COUNT``
    values or ``floor`` bins remain: KL(P || Q) on a sparse histogram sees no cost in clipping (each
    merged level holds one non-empty bin, so ``Q = P``), and picks a threshold far too small."""
    while len(hist) >= 2 * floor and len(hist) % 2 == 0:
        nonzero = hist[hist > 0]
        if nonzero.size and np.median(nonzero) >= ENTROPY_MIN_BIN_COUNT:
            break
        hist, edges = hist.reshape(-1, 2).sum(axis=1), edges[::2]
    return hist, edges


def entropy_range(hist: np.ndarray, edges: np.ndarray, nonnegative: bool) -> tuple[float, float]:
    """The KL-optimal clipping range (see the module docstring)."""
    h, e, ha, ea = _split(hist, edges)
    src, src_edges, levels = (h, e, 256) if nonnegative else (ha, ea, 128)
    src, src_edges = coarsen(src, src_edges, levels)
    best, best_stop = float("inf"), len(src)
    for stop in range(levels, len(src) + 1):
        kl = kl_divergence_of_clip(src, stop, levels)
        if kl < best:
            best, best_stop = kl, stop
    t = float(src_edges[best_stop])
    return (0.0, t) if nonnegative else (-t, t)
