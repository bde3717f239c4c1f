"""Property tests: random DAGs keep their outputs through the whole pipeline; plans stay acyclic."""
import numpy as np
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from opfuse.passes import fuse
from opfuse.rules import PlanLegality, unfused_plan, verify_plan
from opfuse.rules.legality import annotate_plan
from opfuse.report.fusion import build_report
from opfuse.runtime.reference import random_inputs, run
from random_graphs import random_graphs

RTOL, ATOL = 1e-4, 1e-5
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def close(ref: np.ndarray, got: np.ndarray) -> None:
    # Random chains of Sub/Mul cancel: compare relative to the output's own scale.
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL * scale)


@PROPERTY
@given(random_graphs())
def test_pipeline_keeps_outputs_and_plan_is_acyclic(g0):
    note(str(g0))
    g, plan, decisions = fuse(g0)
    g.verify()
    verify_plan(plan)  # partition, topological group order (acyclic), kernel shapes, boundaries
    feeds = random_inputs(g0, 0)
    a, b = run(g0, feeds), run(g, feeds)
    assert list(a) == list(b)
    for k in a:
        close(a[k], b[k])
    rep = build_report(g0, g, plan, decisions)
    assert sum(gr.kernels_before for gr in rep.groups) + len(rep.removed_ops) == len(g0.nodes)
    assert rep.bytes_after <= rep.bytes_before


@PROPERTY
@given(random_graphs(max_ops=7), st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=12))
def test_any_sequence_of_legal_merges_keeps_a_valid_plan(g0, picks):
    note(str(g0))
    legal = PlanLegality(unfused_plan(g0))
    for pick in picks:
        pairs = [(a, b) for a, b in legal.candidate_merges() if legal.can_merge(a, b) is None]
        if not pairs:
            break
        a, b = pairs[pick % len(pairs)]
        note(f"merge {a.name} ({a.kind}) + {b.name} ({b.kind})")
        legal.merge(a, b)
    verify_plan(annotate_plan(legal.plan()))
