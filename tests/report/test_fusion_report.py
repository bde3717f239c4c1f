"""The fusion report: numbers on a hand-checked graph, JSON keys, explain, and the golden text."""
import json
import os

import numpy as np
import pytest

from opfuse import zoo
from opfuse.passes import fuse
from opfuse.rules import FusionOptions
from opfuse.ops import GraphBuilder
from opfuse.report.fusion import build_report, node_flops as spec_flops

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "mobilenet_v1_report.txt")
UPDATE_GOLDEN = "OPFUSE_UPDATE_GOLDEN"  # set to 1 to rewrite the golden file after a deliberate change


def conv_bn_relu():
    b = GraphBuilder("cbr")
    x = b.input("x", (1, 2, 4, 4))
    w = b.const("w", np.ones((3, 2, 1, 1), np.float32))
    p = [b.const(k, np.full(3, v, np.float32)) for k, v in (("g", 2.0), ("bb", 0.5), ("m", 0.1), ("v", 1.0))]
    y = b.op("Relu", b.op("BatchNormalization", b.op("Conv", x, w, name="conv"), *p, name="bn"), name="relu")
    return b.build(y)


def test_numbers_on_a_hand_checked_graph():
    g0 = conv_bn_relu()
    g, plan, dec = fuse(g0)
    rep = build_report(g0, g, plan, dec)
    # Before: Conv reads x (128 B) + w (24 B), writes 192 B; BN reads 192 + 4*12, writes 192;
    # Relu reads 192, writes 192.  After: one kernel reads x, w', b' (128 + 24 + 12), writes 192.
    assert rep.bytes_before == (128 + 24 + 192) + (192 + 48 + 192) + (192 + 192)
    assert rep.bytes_after == 128 + 24 + 12 + 192
    assert rep.eta == pytest.approx(1 - rep.bytes_after / rep.bytes_before)
    assert (rep.kernels_before, rep.kernels_after) == (3, 1)
    grp = rep.groups[0]
    assert grp.origin == ["conv", "bn", "relu"] and grp.kernels_before == 3
    assert grp.flops == sum(spec_flops(n) for n in plan.groups[0].nodes) > 0
    assert rep.rewrites == {"fold_batchnorm": 1}


def test_json_has_the_required_keys():
    g0 = zoo.load("resnet8")
    g, plan, dec = fuse(g0)
    data = json.loads(build_report(g0, g, plan, dec).to_json())
    for key in ("kernels_before", "kernels_after", "bytes_before", "bytes_after", "eta", "groups"):
        assert key in data
    assert data["kernels_before"] == 30 and data["kernels_after"] == 12
    for grp in data["groups"]:
        for key in ("name", "ops", "kernels_before", "bytes_before", "bytes_after"):
            assert key in grp
    assert sum(grp["kernels_before"] for grp in data["groups"]) + len(data["removed_ops"]) == 30
    assert sum(grp["bytes_after"] for grp in data["groups"]) == data["bytes_after"]


def test_explain_names_a_reason_for_every_unmerged_adjacent_or_sibling_pair():
    g0 = zoo.load("yolo_block")
    g, plan, dec = fuse(g0)
    rep = build_report(g0, g, plan, dec)
    order = {g.name: i for i, g in enumerate(plan.groups)}
    edges = {(a.name, b.name) for a, b, _ in plan.group_edges()}
    siblings = set()
    for v in g.values.values():
        readers = sorted({plan.group_of(u).name for u, _ in v.uses} -
                         ({plan.group_of(v.producer).name} if v.producer is not None else set()), key=order.get)
        if not v.is_const:
            siblings |= {(x, y) for i, x in enumerate(readers) for y in readers[i + 1:]}
    assert siblings - edges, "yolo_block has sibling groups (the C2f split halves)"
    assert {(e.producer, e.consumer) for e in rep.explanations} == edges | siblings
    kinds = {e.reason_kind for e in rep.explanations}
    assert {"category forbids", "cycle", "rule refused"} <= kinds
    text = rep.explain_text()
    assert "m1_cv2 -> concat (via m1_add): rule refused: Concat 'concat' is elided" in text
    assert "cv1 -> split" in text and "only elementwise ops form an epilogue" in text


def test_explain_reports_rules_disabled_by_the_user():
    g0 = conv_bn_relu()
    g, plan, dec = fuse(g0, options=FusionOptions(disabled=frozenset({"epilogue"})))
    rep = build_report(g0, g, plan, dec)
    assert [e.reason_kind for e in rep.explanations] == ["disabled by user"]
    assert "rule 'epilogue' is disabled" in rep.explain_text()


def test_mobilenet_v1_golden_report():
    g0 = zoo.load("mobilenet_v1")
    g, plan, dec = fuse(g0)
    rep = build_report(g0, g, plan, dec)
    text = rep.to_text() + "\n\n" + rep.explain_text() + "\n"
    if os.environ.get(UPDATE_GOLDEN) == "1":
        with open(GOLDEN, "w", encoding="utf-8") as f:
            f.write(text)
    with open(GOLDEN, encoding="utf-8") as f:
        assert text == f.read()
