"""Peak activation memory estimate, and the fitted correction factors."""
import json

import pytest

from opfuse.cost import (CostModel, Sample, fit_corrections, load_corrections, peak_activation_bytes,
                         save_corrections)
from opfuse.cost.correction import (ALPHA_MAX, ALPHA_MIN, GLOBAL_BUCKET, MIN_CORRECTION_SAMPLES, corrections_path,
                                    describe_corrections)
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
    n = MIN_CORRECTION_SAMPLES
    samples = [Sample("ELEMWISE", 1e-6 * (k + 1), 1e-6 * (k + 1) * 1.5) for k in range(n)]
    samples += [Sample("OUT_ELEMWISE_FUSABLE", 1e-5 * (k + 1), 1e-5 * (k + 1) * 0.8) for k in range(n)]
    samples += [Sample("REDUCTION", 1e-6, 3e-6)]  # too few samples for its own alpha
    corr = fit_corrections("toy", samples)
    assert corr.alpha("ELEMWISE") == pytest.approx(0.5)
    assert corr.alpha("OUT_ELEMWISE_FUSABLE") == pytest.approx(-0.2)
    # An under-sampled bucket is not corrected at all, in particular not by a pooled factor
    # that its own outliers would inflate.
    assert corr.alpha("REDUCTION") == 0.0 and GLOBAL_BUCKET not in corr.alphas
    assert "REDUCTION" not in corr.alphas and corr.dropped["REDUCTION"] == f"1 samples < {n}"
    assert corr.samples == {"ELEMWISE": n, "OUT_ELEMWISE_FUSABLE": n, "REDUCTION": 1}
    assert corr.total_samples == 2 * n + 1
    assert corr.raw_alphas["REDUCTION"] == pytest.approx(2.0)  # recorded, not applied
    mean_ratio = (n * 1.5 + n * 0.8 + 3.0) / (2 * n + 1)
    single = fit_corrections("toy", samples, per_bucket=False)  # one factor for every group
    assert single.alphas == {GLOBAL_BUCKET: pytest.approx(mean_ratio - 1)}
    assert single.alpha("REDUCTION") == single.alpha("ELEMWISE") == pytest.approx(mean_ratio - 1)


def test_the_issue_case_a_reduction_alpha_of_22_from_4_samples_is_not_used():
    samples = [Sample("REDUCTION", 2.2e-6 / 23, 2.2e-6)] * 4
    corr = fit_corrections("host", samples)
    assert corr.raw_alphas["REDUCTION"] == pytest.approx(22.0)
    assert corr.alphas == {} and corr.alpha("REDUCTION") == 0.0 and not corr.active
    assert set(corr.dropped) == {"REDUCTION"}
    # ... and a pooled factor does not bring it back: other buckets' samples leave REDUCTION alone
    more = fit_corrections("host", samples + [Sample("GEMM", 1e-6, 1.5e-6)] * MIN_CORRECTION_SAMPLES)
    assert more.alpha("REDUCTION") == 0.0 and more.alpha("GEMM") == pytest.approx(0.5)


def test_alphas_are_clamped_to_the_bounds_and_the_raw_fit_is_kept():
    n = MIN_CORRECTION_SAMPLES
    slow = [Sample("REDUCTION", 1e-7, 2.3e-6)] * n  # 23x slower than predicted
    fast = [Sample("GEMM", 1e-3, 1e-4)] * n  # 10x faster
    corr = fit_corrections("host", slow + fast)
    assert corr.raw_alphas["REDUCTION"] == pytest.approx(22.0) and corr.alphas["REDUCTION"] == ALPHA_MAX == 3.0
    assert corr.raw_alphas["GEMM"] == pytest.approx(-0.9) and corr.alphas["GEMM"] == ALPHA_MIN == -0.75
    assert set(corr.clamped) == {"REDUCTION", "GEMM"}
    assert all(ALPHA_MIN <= a <= ALPHA_MAX for a in corr.alphas.values())


def test_fit_records_samples_raw_and_clamped_alphas_in_the_saved_file(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_CACHE_DIR", str(tmp_path))
    n = MIN_CORRECTION_SAMPLES
    corr = fit_corrections("host", [Sample("REDUCTION", 1e-7, 2.3e-6)] * n + [Sample("GEMM", 1e-6, 2e-6)] * 2)
    data = json.loads(save_corrections(corr).read_text())
    assert data["samples"] == {"GEMM": 2, "REDUCTION": n}
    assert data["raw_alphas"]["REDUCTION"] == pytest.approx(22.0) and data["alphas"]["REDUCTION"] == 3.0
    assert data["dropped"] == {"GEMM": f"2 samples < {n}"}
    assert data["min_samples"] == n and data["alpha_bounds"] == [ALPHA_MIN, ALPHA_MAX]
    assert data["fitted_at"] and load_corrections("host") == corr


@pytest.mark.parametrize("alphas,samples,why", [
    ({"REDUCTION": 22.0}, {"REDUCTION": 40}, "outside"),  # out of bounds (an old or edited file)
    ({"REDUCTION": 0.5}, {"REDUCTION": 4}, "4 samples < 8"),  # under-sampled
    ({"REDUCTION": 0.5}, {}, "no sample count"),
    ({"REDUCTION": float("nan")}, {"REDUCTION": 40}, "outside"),
])
def test_loading_drops_out_of_bounds_or_under_sampled_buckets_and_says_so(tmp_path, alphas, samples, why):
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"target": "host", "alphas": {**alphas, "GEMM": 0.25},
                                "samples": {**samples, "GEMM": 12}}))
    corr = load_corrections("host", path)
    assert corr.alphas == {"GEMM": 0.25} and corr.alpha("REDUCTION") == 0.0
    assert why in corr.dropped["REDUCTION"]
    line = describe_corrections(corr)
    assert "gemm x1.25" in line and "not used: reduction" in line and why in line and "--no-corrections" in line


def test_corrections_fitted_against_another_profile_are_not_applied(tmp_path):
    m7 = get_profile("cortex-m7")
    corr = fit_corrections("cortex-m7", [Sample("ELEMWISE", 1e-6, 2e-6)] * MIN_CORRECTION_SAMPLES, profile=m7)
    path = save_corrections(corr, tmp_path / "c.json")
    assert load_corrections("cortex-m7", path, profile=m7).alphas == corr.alphas
    other = m7.with_overrides(mem_bandwidth=800e6)
    stale = load_corrections("cortex-m7", path, profile=other)
    assert stale.alphas == {} and "another profile" in stale.dropped["ELEMWISE"]


def test_fit_is_least_squares_on_relative_residuals():
    ratios = [1.1, 1.3, 0.9, 1.5, 1.2, 1.0, 1.4, 0.8]
    assert len(ratios) >= MIN_CORRECTION_SAMPLES
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
    corr = fit_corrections("cortex-m7", [Sample("ELEMWISE", 1e-6, 2e-6)] * MIN_CORRECTION_SAMPLES)
    path = save_corrections(corr)
    assert path == corrections_path("cortex-m7") and path.parent.name == "corrections"
    assert load_corrections("cortex-m7") == corr
    assert load_corrections("h200").alphas == {}  # nothing saved for this target
    path.write_text("{broken")
    broken = load_corrections("cortex-m7")
    assert broken.alpha("ELEMWISE") == 0.0 and "unreadable" in broken.problem
    assert "unreadable" in describe_corrections(broken)
    path.write_text(json.dumps({"target": "cortex-m7", "alphas": {"*": -3.0}, "samples": {"*": 50}}))
    assert load_corrections("cortex-m7").alphas == {}  # alpha <= -1 is nonsense


def test_cost_model_applies_the_bucket_alpha():
    g = chain_with_escaping_intermediate()
    m7 = get_profile("cortex-m7")
    corr = fit_corrections("cortex-m7", [Sample("ELEMWISE", 1e-6, 1.25e-6)] * MIN_CORRECTION_SAMPLES)
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
    v = x
    for k in range(MIN_CORRECTION_SAMPLES):  # one sample per kernel: enough kernels for a usable fit
        v = b.op(("Neg", "Relu", "Sigmoid")[k % 3], v)
    g = b.build(v)
    m7 = get_profile("cortex-m7")
    plan = FusionPlan.unfused(g)
    cm = CostModel(m7)
    measured = {grp.name: 1.3 * cm.group_cost(g, grp).t_predicted for grp in plan.groups}
    samples = correction_samples(cm, plan, measured)
    assert [s.bucket for s in samples] == ["ELEMWISE"] * MIN_CORRECTION_SAMPLES
    save_corrections(fit_corrections(m7.name, samples))
    calibrated = CostModel(m7, load_corrections(m7.name))
    for grp in plan.groups:
        assert calibrated.group_cost(g, grp).latency_s == pytest.approx(measured[grp.name])
