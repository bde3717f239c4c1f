"""Peak activation memory estimate, and the fitted correction factors."""
import json

import pytest

from opfuse.cost import (CostModel, Sample, fit_corrections, load_corrections, peak_activation_bytes,
                         save_corrections)
from opfuse.cost.correction import GLOBAL_BUCKET, MIN_SAMPLES_PER_BUCKET, corrections_path
from opfuse.errors import InputError
from opfuse.ops import GraphBuilder
from opfuse.targets import get_profile


def chain_with_escaping_intermediate(n=1000):
    b = GraphBuilder()
    x = b.input("x", (n,))
    v = b.op("Relu", x)
    w = b.op("Sigmoid", v)
    return b.build(w, v)


def test_fusion_removes_intermediates_but_stretches_boundary_lifetimes():
    n = 1000
    g = chain_with_escaping_intermediate(n)
    relu, sig = g.nodes
    # Unfused: at Relu x and v are live, at Sigmoid v and w (x is dead): 2 tensors.
    assert peak_activation_bytes(g, [[relu], [sig]]) == 2 * n * 4
    # Fused: one kernel holds x, v (an output) and w across its span: 3 tensors.
    assert peak_activation_bytes(g, [[relu, sig]]) == 3 * n * 4


def test_internal_values_take_no_memory():
    n = 500
    b = GraphBuilder()
    x = b.input("x", (n,))
    g = b.build(b.op("Tanh", b.op("Sigmoid", b.op("Relu", x))))
    nodes = list(g.nodes)
    assert peak_activation_bytes(g, [[m] for m in nodes]) == 2 * n * 4
    assert peak_activation_bytes(g, [nodes]) == 2 * n * 4  # x and the output, nothing else


def test_fit_single_and_per_bucket_alphas():
    samples = [Sample("ELEMWISE", p, p * 1.5) for p in (1e-6, 2e-6, 5e-6, 1e-3)]
    samples += [Sample("OUT_ELEMWISE_FUSABLE", p, p * 0.8) for p in (1e-5, 3e-5, 7e-5)]
    samples += [Sample("REDUCTION", 1e-6, 3e-6)]  # too few samples for its own alpha
    corr = fit_corrections("toy", samples)
    assert corr.alpha("ELEMWISE") == pytest.approx(0.5)
    assert corr.alpha("OUT_ELEMWISE_FUSABLE") == pytest.approx(-0.2)
    mean_ratio = (4 * 1.5 + 3 * 0.8 + 3.0) / 8
    assert corr.alpha("REDUCTION") == pytest.approx(mean_ratio - 1) == corr.alpha(GLOBAL_BUCKET)
    assert len([s for s in samples if s.bucket == "REDUCTION"]) < MIN_SAMPLES_PER_BUCKET
    single = fit_corrections("toy", samples, per_bucket=False)
    assert single.alphas == {GLOBAL_BUCKET: pytest.approx(mean_ratio - 1)}


def test_fit_is_least_squares_on_relative_residuals():
    ratios = [1.1, 1.3, 0.9, 1.5]
    samples = [Sample("ELEMWISE", 1e-6 * (k + 1), 1e-6 * (k + 1) * r) for k, r in enumerate(ratios)]
    a = fit_corrections("toy", samples).alpha("ELEMWISE")
    residual = lambda a_: sum((r - (1 + a_)) ** 2 for r in ratios)  # noqa: E731
    assert residual(a) <= min(residual(a + 1e-3), residual(a - 1e-3))


def test_bad_samples_are_refused():
    with pytest.raises(InputError):
        fit_corrections("toy", [])
    with pytest.raises(InputError, match="positive"):
        fit_corrections("toy", [Sample("ELEMWISE", 0.0, 1e-6)])


def test_corrections_round_trip_per_target_and_corrupt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_CACHE_DIR", str(tmp_path))
    corr = fit_corrections("cortex-m7", [Sample("ELEMWISE", 1e-6, 2e-6)] * 3)
    path = save_corrections(corr)
    assert path == corrections_path("cortex-m7") and path.parent.name == "corrections"
    assert load_corrections("cortex-m7") == corr
    assert load_corrections("h200").alphas == {}  # nothing saved for this target
    path.write_text("{broken")
    assert load_corrections("cortex-m7").alpha("ELEMWISE") == 0.0
    path.write_text(json.dumps({"target": "cortex-m7", "alphas": {"*": -3.0}}))
    assert load_corrections("cortex-m7").alphas == {}  # alpha <= -1 is nonsense


def test_cost_model_applies_the_bucket_alpha():
    g = chain_with_escaping_intermediate()
    m7 = get_profile("cortex-m7")
    corr = fit_corrections("cortex-m7", [Sample("ELEMWISE", 1e-6, 1.25e-6)] * 3)
    plain = CostModel(m7).group_cost(g, g.nodes)
    corrected = CostModel(m7, corr).group_cost(g, g.nodes)
    assert corrected.bucket == "ELEMWISE" and corrected.alpha == pytest.approx(0.25)
    assert corrected.t_predicted == plain.t_predicted
    assert corrected.latency_s == pytest.approx(plain.latency_s * 1.25)


def test_corrections_fitted_from_a_measured_plan_reproduce_the_measurement(tmp_path, monkeypatch):
    from opfuse.cost import correction_samples
    from opfuse.ir.plan import FusionPlan
    monkeypatch.setenv("OPFUSE_CACHE_DIR", str(tmp_path))
    b = GraphBuilder()
    x = b.input("x", (4096,))
    g = b.build(b.op("Sigmoid", b.op("Relu", b.op("Neg", x))))
    m7 = get_profile("cortex-m7")
    plan = FusionPlan.unfused(g)
    cm = CostModel(m7)
    measured = {grp.name: 1.3 * cm.group_cost(g, grp).t_predicted for grp in plan.groups}
    samples = correction_samples(cm, plan, measured)
    assert [s.bucket for s in samples] == ["ELEMWISE"] * 3
    save_corrections(fit_corrections(m7.name, samples))
    calibrated = CostModel(m7, load_corrections(m7.name))
    for grp in plan.groups:
        assert calibrated.group_cost(g, grp).latency_s == pytest.approx(measured[grp.name])
