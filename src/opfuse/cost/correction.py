"""Correction factors: ``T_actual = T_pred * (1 + alpha)``, fitted from measured runs.

The seed's dynamic correction ``T_actual = T_fused * (1 + alpha_cache + alpha_conflict +
alpha_divergence)`` lumps everything the roofline misses into one factor. We fit one
``alpha`` per *bucket*, the group's hardest op category (``OUT_ELEMWISE_FUSABLE`` groups
miss the roofline differently from elementwise chains); a group whose bucket has no usable
alpha of its own is not corrected. (``per_bucket=False`` fits one global alpha, bucket
``"*"``, for every group instead.) There is deliberately no pooled fallback for the
buckets left out: the pooled mean is dominated by whichever buckets have most samples and
by the very outliers that got a bucket left out (four pooling samples at 13x moved a
pooled factor from 2.1x to 4x), so it would carry them to the groups they came from.

Fit: least squares on *relative* residuals, so a 1 ms and a 1 us kernel weigh the same:

    alpha = argmin_a  sum_i ((t_i - (1 + a) p_i) / p_i)^2  =  mean_i(t_i / p_i) - 1

(``t_i`` measured, ``p_i`` predicted).

A fitted factor changes every later plan for its target, so it has to earn its place:

* a bucket (the global one included) is used only with at least ``MIN_CORRECTION_SAMPLES``
  samples. Per-kernel times of microsecond kernels on a shared machine vary by 2x from run
  to run; with fewer samples one outlier decides the mean (4 pooling samples once gave
  ``alpha = +22``, turning a 2.2 us pool into a predicted 32 us one);
* ``alpha`` is clamped to ``[ALPHA_MIN, ALPHA_MAX]`` = ``[-0.75, +3.0]``, i.e. the corrected
  prediction stays within 0.25x .. 4x of the roofline's. A bucket that is off by more
  than 4x is not something a multiplicative fudge should paper over: either the profile's
  bandwidth / peak is wrong (recalibrate: ``opfuse profile --target host --calibrate``) or
  the generated kernels miss the execution model (a bug to fix). Clamping keeps such a
  bucket from dominating the plan while the fit still records the raw value.

The fit records, per bucket, the number of samples and the raw and clamped alpha, and
for every bucket not used, why (``Corrections.dropped``). Factors are saved per target as
JSON under the cache directory (``corrections/<target>.json``) by ``opfuse profile --fit``;
they are loaded only when asked for (``plan_fusion(..., corrections=True)``, which
``opfuse compile`` does unless ``--no-corrections``). Loading re-checks every bucket: one
with too few samples or an alpha out of bounds (an old or hand-edited file) is dropped,
and the drop is recorded, never silently applied.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from opfuse.errors import InputError
from opfuse.targets.cache import atomic_write_json, cache_dir, read_json_or_none

GLOBAL_BUCKET = "*"
MIN_CORRECTION_SAMPLES = 8  # fewer samples than this: the bucket's own alpha is not used
ALPHA_MIN = -0.75  # corrected prediction >= 0.25x the roofline's
ALPHA_MAX = 3.0  # corrected prediction <= 4x the roofline's
CORRECTIONS_DIR = "corrections"
CORRECTIONS_FORMAT_VERSION = 2


def profile_digest(profile) -> str:
    """A short digest of a ``HardwareProfile``: corrections are relative to the predictions
    of the profile they were fitted against, and do not carry over to another one."""
    text = json.dumps(profile.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Sample:
    bucket: str  # e.g. the group's max category name
    predicted_s: float
    measured_s: float


@dataclass(frozen=True)
class Corrections:
    """Usable factors for one target, and the record of how they were obtained.

    ``alphas``: bucket -> the (clamped) alpha actually applied (``GLOBAL_BUCKET``, from a
    single-factor fit, applies to every group without its own);
    ``samples``: bucket -> number of samples (every bucket seen); ``raw_alphas``: bucket -> the
    unclamped least-squares fit; ``dropped``: bucket -> why it is not used.
    """

    target: str
    alphas: dict[str, float] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)
    raw_alphas: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    fitted_at: str | None = None  # ISO 8601, UTC
    profile_digest: str | None = None  # of the profile the predictions came from
    path: str | None = field(default=None, compare=False)  # where it was loaded from
    problem: str | None = field(default=None, compare=False)  # why a saved file was ignored entirely

    def alpha(self, bucket: str) -> float:
        if bucket in self.alphas:
            return self.alphas[bucket]
        return self.alphas.get(GLOBAL_BUCKET, 0.0)

    @property
    def active(self) -> bool:
        """Whether any factor is applied (all alphas 0 change nothing)."""
        return any(a != 0.0 for a in self.alphas.values())

    @property
    def clamped(self) -> dict[str, tuple[float, float]]:
        """bucket -> (raw alpha, applied alpha) for the buckets the bounds changed."""
        return {b: (self.raw_alphas[b], a) for b, a in self.alphas.items()
                if b in self.raw_alphas and self.raw_alphas[b] != a}

    @property
    def total_samples(self) -> int:
        if GLOBAL_BUCKET in self.samples:
            return self.samples[GLOBAL_BUCKET]
        return sum(self.samples.values())

    def to_dict(self) -> dict:
        return {"format_version": CORRECTIONS_FORMAT_VERSION, "target": self.target,
                "alphas": dict(sorted(self.alphas.items())), "samples": dict(sorted(self.samples.items())),
                "raw_alphas": dict(sorted(self.raw_alphas.items())), "dropped": dict(sorted(self.dropped.items())),
                "fitted_at": self.fitted_at, "profile_digest": self.profile_digest,
                "min_samples": MIN_CORRECTION_SAMPLES, "alpha_bounds": [ALPHA_MIN, ALPHA_MAX]}

    def summary(self) -> dict:
        """What the report records: the applied factors and what was left out."""
        clamped = {b: {"raw": r, "applied": a} for b, (r, a) in sorted(self.clamped.items())}
        return {"target": self.target, "applied": dict(sorted(self.alphas.items())),
                "samples": dict(sorted(self.samples.items())), "clamped": clamped,
                "dropped": dict(sorted(self.dropped.items())), "fitted_at": self.fitted_at, "path": self.path,
                "problem": self.problem}

    @classmethod
    def from_dict(cls, data: dict) -> "Corrections":
        """Re-check every saved bucket; a bucket that fails is moved to ``dropped``.

        Raises ``KeyError``/``TypeError``/``ValueError`` when the structure itself is broken."""
        target = str(data["target"])
        saved = {str(k): float(v) for k, v in data["alphas"].items()}
        samples = {str(k): int(v) for k, v in (data.get("samples") or {}).items()}
        raw = {str(k): float(v) for k, v in (data.get("raw_alphas") or {}).items()}
        dropped = {str(k): str(v) for k, v in (data.get("dropped") or {}).items()}
        alphas = {}
        for bucket, a in saved.items():
            why = _unusable(a, samples.get(bucket))
            if why is None:
                alphas[bucket] = a
            else:
                dropped[bucket] = why
        fitted_at = data.get("fitted_at")
        digest = data.get("profile_digest")
        return cls(target, alphas, samples, raw, dropped, None if fitted_at is None else str(fitted_at),
                   None if digest is None else str(digest))


def _unusable(alpha: float, n: int | None) -> str | None:
    """Why a saved bucket may not be applied, or ``None`` when it may."""
    if n is None:
        return "no sample count recorded"
    if n < MIN_CORRECTION_SAMPLES:
        return f"{n} samples < {MIN_CORRECTION_SAMPLES}"
    if not math.isfinite(alpha) or not ALPHA_MIN <= alpha <= ALPHA_MAX:
        return f"alpha {alpha:+.3f} outside [{ALPHA_MIN}, {ALPHA_MAX}]"
    return None


def _mean_ratio(samples: list[Sample]) -> float:
    return sum(s.measured_s / s.predicted_s for s in samples) / len(samples) - 1.0


def _clamp(alpha: float) -> float:
    return min(ALPHA_MAX, max(ALPHA_MIN, alpha))


def fit_corrections(target: str, samples: Iterable[Sample], *, per_bucket: bool = True,
                    profile=None, fitted_at: str | None = None) -> Corrections:
    """Fit ``alpha`` per bucket (or one global one) from (predicted, measured) pairs.

    Buckets with fewer than ``MIN_CORRECTION_SAMPLES`` samples are recorded in ``dropped``
    (their groups are not corrected); alphas are clamped to ``[ALPHA_MIN, ALPHA_MAX]`` and the raw fit
    kept in ``raw_alphas``. ``profile``
    (the ``HardwareProfile`` the predictions came from) is recorded as a digest.
    """
    samples = list(samples)
    bad = [s for s in samples if not (s.predicted_s > 0 and s.measured_s > 0)]
    if bad:
        raise InputError(f"correction samples need positive predicted and measured times; "
                         f"got {bad[0]}")
    if not samples:
        raise InputError("no samples to fit correction factors from")
    groups: dict[str, list[Sample]] = {}
    if per_bucket:
        for s in samples:
            groups.setdefault(s.bucket, []).append(s)
    else:
        groups[GLOBAL_BUCKET] = samples
    alphas, counts, raw, dropped = {}, {}, {}, {}
    for name in sorted(groups):
        counts[name] = len(groups[name])
        raw[name] = _mean_ratio(groups[name])
        if counts[name] < MIN_CORRECTION_SAMPLES:
            dropped[name] = f"{counts[name]} samples < {MIN_CORRECTION_SAMPLES}"
        else:
            alphas[name] = _clamp(raw[name])
    when = fitted_at or datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    return Corrections(target, alphas, counts, raw, dropped, when,
                       None if profile is None else profile_digest(profile))


def corrections_path(target: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in target)
    return cache_dir() / CORRECTIONS_DIR / f"{safe}.json"


def save_corrections(corr: Corrections, path: Path | None = None) -> Path:
    path = Path(path) if path is not None else corrections_path(corr.target)
    atomic_write_json(path, corr.to_dict())
    return path


def load_corrections(target: str, path: Path | None = None, *, profile=None) -> Corrections:
    """The saved factors for ``target``, each bucket re-checked (``Corrections.from_dict``).

    None (alpha = 0) when absent; when unreadable, none either, with ``problem`` saying so.
    With ``profile`` given, factors fitted against a different profile (recorded digest
    differs) are all dropped: they correct predictions this profile does not make.
    """
    where = Path(path) if path is not None else corrections_path(target)
    if not where.exists():
        return Corrections(target)
    data = read_json_or_none(where)
    try:
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        corr = Corrections.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return Corrections(target, path=str(where), problem=f"unreadable corrections file ({type(e).__name__})")
    if corr.target != target:
        return Corrections(target, path=str(where), problem=f"the file is for target '{corr.target}'")
    if profile is not None and corr.profile_digest is not None and corr.profile_digest != profile_digest(profile):
        dropped = dict(corr.dropped)
        dropped.update({b: "fitted against another profile of this target (refit: opfuse profile --fit)"
                        for b in corr.alphas})
        corr = Corrections(corr.target, {}, corr.samples, corr.raw_alphas, dropped, corr.fitted_at,
                           corr.profile_digest)
    return Corrections(corr.target, corr.alphas, corr.samples, corr.raw_alphas, corr.dropped, corr.fitted_at,
                       corr.profile_digest, path=str(where))


def _factor(bucket: str) -> str:
    return "all groups" if bucket == GLOBAL_BUCKET else bucket.lower()


def describe_corrections(corr: Corrections) -> str | None:
    """One line naming the applied factors (and any saved ones left out), ``None`` when
    nothing was saved; what ``opfuse compile`` prints."""
    if corr.problem:
        return f"cost model corrections ({corr.target}): none, {corr.problem} at {corr.path}"
    if not corr.alphas and not corr.dropped:
        return None
    when = f"fitted {corr.fitted_at[:10]} " if corr.fitted_at else ""
    head = f"cost model corrections ({corr.target}, {when}from {corr.total_samples} samples)"
    factors = ", ".join(f"{_factor(b)} x{1 + a:.2f}" + (f" (clamped from x{1 + corr.raw_alphas[b]:.2f})"
                                                       if b in corr.clamped else "")
                        for b, a in sorted(corr.alphas.items(), key=lambda kv: (kv[0] == GLOBAL_BUCKET, kv[0])))
    text = f"{head}: {factors or 'none applied'}"
    if corr.dropped:
        text += "; not used: " + ", ".join(f"{_factor(b)} ({why})" for b, why in sorted(corr.dropped.items()))
    return text + "; --no-corrections to ignore"


def format_corrections(corr: Corrections) -> str:
    if not corr.samples and not corr.alphas:
        return f"no corrections for {corr.target}"
    lines = [f"corrections for {corr.target}" + (f" (fitted {corr.fitted_at})" if corr.fitted_at else "")
             + f": buckets need >= {MIN_CORRECTION_SAMPLES} samples, alpha within [{ALPHA_MIN}, {ALPHA_MAX}]"]
    for b in sorted(set(corr.samples) | set(corr.alphas)):
        n = corr.samples.get(b, 0)
        if b in corr.alphas:
            raw = corr.raw_alphas.get(b, corr.alphas[b])
            note = f" (raw fit {raw:+.3f}, clamped)" if raw != corr.alphas[b] else ""
            lines.append(f"{b}: alpha = {corr.alphas[b]:+.3f}{note} ({n} samples)")
        else:
            fit = f", raw fit {corr.raw_alphas[b]:+.3f}" if b in corr.raw_alphas else ""
            lines.append(f"{b}: not used, {corr.dropped.get(b, 'no fit')}{fit}")
    return "\n".join(lines)


__all__ = ["Corrections", "Sample", "fit_corrections", "load_corrections", "save_corrections",
           "format_corrections", "describe_corrections", "profile_digest", "GLOBAL_BUCKET",
           "MIN_CORRECTION_SAMPLES", "ALPHA_MIN", "ALPHA_MAX"]
