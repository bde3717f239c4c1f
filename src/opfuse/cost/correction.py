"""Correction factors: ``T_actual = T_pred * (1 + alpha)``, fitted from measured runs.

The seed's dynamic correction ``T_actual = T_fused * (1 + alpha_cache + alpha_conflict +
alpha_divergence)`` lumps everything the roofline misses into one factor. We fit one
``alpha`` per *bucket*, the group's hardest op category (``OUT_ELEMWISE_FUSABLE`` groups
miss the roofline differently from elementwise chains), plus a global one used for
buckets with too few samples.

Fit: least squares on *relative* residuals, so a 1 ms and a 1 us kernel weigh the same:

    alpha = argmin_a  sum_i ((t_i - (1 + a) p_i) / p_i)^2  =  mean_i(t_i / p_i) - 1

(``t_i`` measured, ``p_i`` predicted). Factors are saved per target as JSON under the
cache directory (``corrections/<target>.json``) and loaded by ``CostModel``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from opfuse.errors import InputError
from opfuse.targets.cache import atomic_write_json, cache_dir, read_json_or_none

GLOBAL_BUCKET = "*"
MIN_SAMPLES_PER_BUCKET = 3  # fewer samples than this: the bucket uses the global alpha
CORRECTIONS_DIR = "corrections"


@dataclass(frozen=True)
class Sample:
    bucket: str  # e.g. the group's max category name
    predicted_s: float
    measured_s: float


@dataclass(frozen=True)
class Corrections:
    target: str
    alphas: dict[str, float] = field(default_factory=dict)  # bucket -> alpha, GLOBAL_BUCKET included
    samples: dict[str, int] = field(default_factory=dict)  # bucket -> number of samples

    def alpha(self, bucket: str) -> float:
        if bucket in self.alphas:
            return self.alphas[bucket]
        return self.alphas.get(GLOBAL_BUCKET, 0.0)

    def to_dict(self) -> dict:
        return {"target": self.target, "alphas": dict(sorted(self.alphas.items())),
                "samples": dict(sorted(self.samples.items()))}

    @classmethod
    def from_dict(cls, data: dict) -> "Corrections":
        alphas = {str(k): float(v) for k, v in data["alphas"].items()}
        if any(not math.isfinite(a) or a <= -1.0 for a in alphas.values()):
            raise ValueError("alpha must be finite and > -1")
        return cls(str(data["target"]), alphas, {str(k): int(v) for k, v in data.get("samples", {}).items()})


def _mean_ratio(samples: list[Sample]) -> float:
    return sum(s.measured_s / s.predicted_s for s in samples) / len(samples) - 1.0


def fit_corrections(target: str, samples: Iterable[Sample], *, per_bucket: bool = True) -> Corrections:
    """Fit ``alpha`` per bucket (and globally) from (predicted, measured) pairs."""
    samples = list(samples)
    bad = [s for s in samples if not (s.predicted_s > 0 and s.measured_s > 0)]
    if bad:
        raise InputError(f"correction samples need positive predicted and measured times; "
                         f"got {bad[0]}")
    if not samples:
        raise InputError("no samples to fit correction factors from")
    alphas = {GLOBAL_BUCKET: _mean_ratio(samples)}
    counts = {GLOBAL_BUCKET: len(samples)}
    if per_bucket:
        buckets: dict[str, list[Sample]] = {}
        for s in samples:
            buckets.setdefault(s.bucket, []).append(s)
        for name in sorted(buckets):
            counts[name] = len(buckets[name])
            if len(buckets[name]) >= MIN_SAMPLES_PER_BUCKET:
                alphas[name] = _mean_ratio(buckets[name])
    return Corrections(target, alphas, counts)


def corrections_path(target: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in target)
    return cache_dir() / CORRECTIONS_DIR / f"{safe}.json"


def save_corrections(corr: Corrections, path: Path | None = None) -> Path:
    path = Path(path) if path is not None else corrections_path(corr.target)
    atomic_write_json(path, corr.to_dict())
    return path


def load_corrections(target: str, path: Path | None = None) -> Corrections:
    """The saved factors for ``target``; none (alpha = 0) when absent or unreadable."""
    data = read_json_or_none(Path(path) if path is not None else corrections_path(target))
    if isinstance(data, dict):
        try:
            return Corrections.from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass
    return Corrections(target)


def format_corrections(corr: Corrections) -> str:
    rows = [f"{b}: alpha = {a:+.3f} ({corr.samples.get(b, 0)} samples)" for b, a in sorted(corr.alphas.items())]
    return "\n".join([f"corrections for {corr.target}"] + rows) if rows else f"no corrections for {corr.target}"


__all__ = ["Corrections", "Sample", "fit_corrections", "load_corrections", "save_corrections",
           "format_corrections", "GLOBAL_BUCKET"]
