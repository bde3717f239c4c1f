"""A/B test of two compile configurations of one model (``opfuse ab``).

    result = ab_test("zoo:resnet8", CompileOptions(fuse=False), CompileOptions(), repeat=100)
    result["verdict"]["text"], result["a"]["median_ms"], result["outputs"]["agree"]

Both configurations are planned (any target: a plan made for another target's profile is a
partition of the same graph, built and timed here on the host), built, run on the same inputs
and compared: with each other and with the reference executor, within ``AGREE_RTOL * max(1,
max |reference|)``. The timed runs are interleaved A B, B A, A B, ... after ``warmup`` untimed
pairs, so a change of load on a shared machine hits both alike and neither always runs second.

The verdict compares the two samples of per-run times:

* Mann-Whitney U, two-sided, normal approximation with the tie correction:
  ``U = R_B - n_B (n_B + 1) / 2``, ``z = (U - n_A n_B / 2) / sigma``,
  ``sigma^2 = n_A n_B / 12 * ((n + 1) - sum(t^3 - t) / (n (n - 1)))``, ``p = erfc(|z| / sqrt 2)``;
* the ratio of medians ``B / A`` with a 95% percentile bootstrap interval (``BOOTSTRAP``
  resamples of each side, seeded).

B is called faster (or slower) when ``p < ALPHA`` and the interval excludes 1; the confidence
printed is ``1 - p``. Otherwise: no difference at this sample size.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Mapping

import numpy as np

from opfuse.bench import max_abs_difference
from opfuse.compiler import CompileOptions, plan_model
from opfuse.errors import OpfuseError

AGREE_RTOL = 1e-4
ALPHA = 0.05
BOOTSTRAP = 2000
DEFAULT_REPEAT = 50
DEFAULT_WARMUP = 3


def percentiles_ms(seconds: np.ndarray) -> dict:
    ms = np.asarray(seconds) * 1e3
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()), "min_ms": float(ms.min()),
            "runs": int(ms.size)}


def mann_whitney(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """``(U of b, two-sided p)`` by the normal approximation with the tie correction."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    na, nb = a.size, b.size
    n = na + nb
    both = np.concatenate([a, b])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(n)
    sorted_vals = both[order]
    i = 0
    ties = 0.0
    while i < n:  # average ranks over runs of equal values
        j = i
        while j + 1 < n and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    u = float(ranks[na:].sum() - nb * (nb + 1) / 2)
    var = na * nb / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return u, 1.0
    z = (u - na * nb / 2) / math.sqrt(var)
    return u, math.erfc(abs(z) / math.sqrt(2))


def bootstrap_ratio(a: np.ndarray, b: np.ndarray, resamples: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of ``median(b) / median(a)``."""
    rng = np.random.default_rng(seed)
    ma = np.median(rng.choice(a, (resamples, a.size)), axis=1)
    mb = np.median(rng.choice(b, (resamples, b.size)), axis=1)
    lo, hi = np.percentile(mb / ma, [2.5, 97.5])
    return float(lo), float(hi)


def verdict(a_s: np.ndarray, b_s: np.ndarray) -> dict:
    """Which side is faster, by how much, and how sure (module docstring)."""
    _, p = mann_whitney(a_s, b_s)
    ratio = float(np.median(b_s) / np.median(a_s))
    lo, hi = bootstrap_ratio(a_s, b_s)
    change = f"{(ratio - 1) * 100:+.1f}% (95% CI {(lo - 1) * 100:+.1f}% to {(hi - 1) * 100:+.1f}%)"
    if p < ALPHA and (hi < 1 or lo > 1):
        winner = "b" if ratio < 1 else "a"
        text = (f"{'B' if winner == 'b' else 'A'} is faster: B/A median time {change}, "
                f"Mann-Whitney p = {p:.2g} (confidence {(1 - p) * 100:.2f}%)")
    else:
        winner = None
        text = f"no significant difference: B/A median time {change}, Mann-Whitney p = {p:.2g}"
    return {"winner": winner, "ratio_b_over_a": ratio, "ratio_ci95": [lo, hi], "p_value": p,
            "confidence": 1 - p, "text": text}


def _max_error(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> tuple[float, float, bool]:
    """(max abs difference over all outputs, tolerance ``AGREE_RTOL * max(1, max |output|)`` of the float ones,
    whether they agree: every float output within it and every integer output the same, taken exactly
    (``bench.max_abs_difference``, ``runtime.compare``))."""
    err, scale, integers_equal = max_abs_difference(got, want)
    tol = AGREE_RTOL * max(1.0, scale)
    return err, tol, integers_equal and err <= tol


def _build(graph, options: CompileOptions, threads: int):
    from opfuse.runtime.native import build
    comp = plan_model(graph, options)
    native = build(comp.graph, comp.plan, threads=threads, memory=comp.memory)
    return comp, native


def ab_test(model, a: CompileOptions, b: CompileOptions, *, labels: tuple[str, str] = ("", ""),
            repeat: int = DEFAULT_REPEAT, warmup: int = DEFAULT_WARMUP, threads: int = 1, seed: int = 0,
            inputs: Mapping[str, np.ndarray] | None = None,
            progress: Callable[[int], None] | None = None) -> dict:
    """Plan, build, check and time ``a`` against ``b`` on ``model`` (module docstring)."""
    from opfuse.api import load
    from opfuse.runtime.reference import random_inputs, run
    if repeat < 2 or warmup < 0 or threads < 1:
        raise OpfuseError(f"need --repeat >= 2, --warmup >= 0 and --threads >= 1 "
                          f"(got {repeat}, {warmup}, {threads})")
    graph = load(model, a.input_shapes)
    feeds = dict(inputs) if inputs is not None else random_inputs(graph, seed)
    sides = {}
    for key, opts in (("a", a), ("b", b)):
        comp, native = _build(graph, opts, threads)
        sides[key] = {"comp": comp, "native": native, "outputs": native.run(feeds)}
    ref = run(graph, feeds)
    calls = {k: s["native"].prepared(feeds)[0] for k, s in sides.items()}
    for _ in range(warmup):
        for k in ("a", "b"):
            calls[k]()
    times: dict[str, list[float]] = {"a": [], "b": []}
    for i in range(repeat):
        for k in (("a", "b") if i % 2 == 0 else ("b", "a")):
            t0 = time.perf_counter()
            calls[k]()
            times[k].append(time.perf_counter() - t0)
        if progress is not None:
            progress(1)
    arrays = {k: np.array(v) for k, v in times.items()}
    ab_err, ab_tol, agree = _max_error(sides["b"]["outputs"], sides["a"]["outputs"])
    result: dict = {"model": graph.name, "repeat": repeat, "warmup": warmup, "threads": threads}
    for k, opts in (("a", a), ("b", b)):
        s = sides[k]
        err, tol, ok = _max_error(s["outputs"], ref)
        agree = agree and ok
        rep = s["comp"].report
        result[k] = {"config": labels[0 if k == "a" else 1], "target": opts.target, "fuse": opts.fuse,
                     "planner": opts.planner, "disable": list(opts.disable),
                     "kernels": rep["kernels_after"], "arena_bytes": rep["arena_bytes"],
                     "predicted_latency_s": rep.get("predicted_latency_s"),
                     "max_abs_error_vs_reference": err, "times_ms": [t * 1e3 for t in times[k]],
                     **percentiles_ms(arrays[k])}
    result["outputs"] = {"max_abs_difference_a_b": ab_err, "tolerance": ab_tol, "agree": agree}
    result["verdict"] = verdict(arrays["a"], arrays["b"])
    return result
