"""Einsum imported as Transpose/Reshape/MatMul/ReduceSum/Mul/Gather (``frontend/onnx_einsum.py``),
against ``onnx.reference`` in opfuse's reference executor, fused C and portable C."""
import numpy as np
import pytest

from misc_ops_support import check_against_onnx_reference, one_node_model
from opfuse.errors import ModelError, ShapeError
from opfuse.frontend.onnx import import_model

RNG = np.random.default_rng(12)

# (equation, operand shapes, the ops the import should leave)
CASES = [
    ("bij,bjk->bik", [(5, 2, 3), (5, 3, 4)], ["MatMul"]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)], ["Transpose", "MatMul"]),  # attention scores
    ("bhqk,bhkd->bqhd", [(2, 3, 4, 5), (2, 3, 5, 8)], ["MatMul", "Transpose"]),
    ("i,i", [(5,), (5,)], None),                            # implicit output: a scalar
    ("->", [()], None),
    ("ij->i", [(3, 4)], ["ReduceSum"]),
    ("ij->ji", [(3, 4)], ["Transpose"]),
    ("ij", [(3, 4)], []),                                   # implicit output: the operand itself
    ("ji", [(3, 4)], ["Transpose"]),                        # implicit output sorted: ij
    ("...ii->...i", [(3, 5, 5)], ["Reshape", "Gather"]),     # batch diagonal
    ("ii", [(4, 4)], ["Reshape", "Gather", "ReduceSum"]),    # trace
    ("iii->i", [(3, 3, 3)], None),
    ("iij,jk->ik", [(3, 3, 4), (4, 2)], None),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], ["MatMul", "MatMul"]),
    ("i,j->ij", [(3,), (4,)], ["Reshape", "Reshape", "Mul"]),  # outer product: a broadcast Mul
    ("ab,ab->ab", [(3, 4), (3, 4)], ["Mul"]),
    ("...ij,...jk", [(2, 1, 3, 4), (5, 4, 2)], None),       # ellipsis broadcast, implicit output
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)], None),    # bilinear
    ("ijk,ijk->", [(2, 3, 4), (2, 3, 4)], None),
    ("ij,ij->i", [(3, 1), (3, 4)], None),                   # a contracted label broadcast from 1
    (",i->i", [(), (3,)], None),
    ("Ab,bA->A", [(3, 4), (4, 3)], None),                   # upper-case labels
    (" b i j , b j k -> b i k ", [(2, 2, 3), (2, 3, 2)], ["MatMul"]),
]


@pytest.mark.parametrize("equation,shapes,ops", CASES, ids=[c[0].replace(" ", "") or "scalar" for c in CASES])
def test_einsum_matches_the_onnx_reference(equation, shapes, ops):
    feeds = {f"x{i}": RNG.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    m = one_node_model("Einsum", feeds, {"equation": equation}, opset=12)
    g, _ = check_against_onnx_reference(m, feeds)
    assert "Einsum" not in [n.op_type for n in g.nodes]
    if ops is not None:
        assert [n.op_type for n in g.nodes if n.op_type != "Identity"] == ops


def test_einsum_double_and_a_fused_attention_score_epilogue():
    """The batched MatMul an Einsum leaves fuses with the elementwise op after it (a gemm epilogue);
    the Transpose of ``k`` stays a kernel of its own, as in any exported Transpose -> MatMul."""
    from onnx import helper
    feeds = {"q": RNG.standard_normal((2, 4, 8)), "k": RNG.standard_normal((2, 5, 8))}
    m = one_node_model("Einsum", feeds, {"equation": "bqd,bkd->bqk"}, opset=12)
    m.graph.node[0].output[0] = "s"
    m.graph.node.append(helper.make_node("Relu", ["s"], ["y0"]))
    _, plan = check_against_onnx_reference(m, feeds, rtol=1e-12, atol=1e-12)
    assert [(g.kind, [n.op_type for n in g.nodes]) for g in plan.groups] == [
        ("single", ["Transpose"]), ("gemm_epilogue", ["MatMul", "Relu"])]


@pytest.mark.parametrize("equation,shapes,match", [
    ("ij,jk->ik", [(2, 3)], "2 operand term\\(s\\) for 1 input"),
    ("ij->ik", [(2, 3)], "output label 'k' is on no input"),
    ("ij->ii", [(2, 2)], "repeats a label"),
    ("ijk->ij", [(2, 3)], "does not fit an input of rank 2"),
    ("i1->i", [(2, 3)], "must be letters"),
    ("...ij->ij", [(4, 2, 3)], "omits '...'"),
])
def test_bad_equations_are_refused_in_one_line(equation, shapes, match):
    feeds = {f"x{i}": np.zeros(s, np.float32) for i, s in enumerate(shapes)}
    with pytest.raises(ModelError, match=match):
        import_model(one_node_model("Einsum", feeds, {"equation": equation}, opset=12))


def test_mismatched_label_sizes_are_refused():
    feeds = {"a": np.zeros((2, 3), np.float32), "b": np.zeros((4, 5), np.float32)}
    with pytest.raises(ShapeError, match="label 'j' has sizes 3 and 4"):
        import_model(one_node_model("Einsum", feeds, {"equation": "ij,jk->ik"}, opset=12))
    with pytest.raises(ShapeError, match="repeated on axes of sizes 2 and 3"):
        import_model(one_node_model("Einsum", {"a": np.zeros((2, 3), np.float32)}, {"equation": "ii->i"}, opset=12))
