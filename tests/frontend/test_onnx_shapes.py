"""Input shapes: parsing ``--input-shape`` strings and binding symbolic dimensions."""
import numpy as np
import pytest
from onnx import helper

from onnx_builders import import_and_compare, init, model, vi
from opfuse.errors import InputError, OpfuseError, ShapeError
from opfuse.frontend.onnx import import_model, parse_input_shapes


@pytest.mark.parametrize("spec,expected", [
    (["input=1x3x224x224"], {"input": (1, 3, 224, 224)}),
    (["input=1,3,224,224"], {"input": (1, 3, 224, 224)}),
    (["a=2X3", "b=7"], {"a": (2, 3), "b": (7,)}),
    (["input:0=4x5"], {"input:0": (4, 5)}),
    (["odd=name=1x2"], {"odd=name": (1, 2)}),
    ([" x = 0x4 "], {"x": (0, 4)}),
    (["scalar="], {"scalar": ()}),
    ([], {}),
])
def test_parse_input_shapes(spec, expected):
    assert parse_input_shapes(spec) == expected


@pytest.mark.parametrize("spec,fragment", [
    ("1x3x224x224", "NAME=DIMS"),
    ("=1x2", "NAME=DIMS"),
    ("x=1x-3", "'-3'"),
    ("x=1xx3", "''"),
    ("x=1.5", "'1.5'"),
    ("x=ax2", "'a'"),
    ("x=１x2", "'１'"),
])
def test_parse_input_shapes_rejects_bad_strings(spec, fragment):
    with pytest.raises(InputError) as e:
        parse_input_shapes([spec])
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_parse_input_shapes_rejects_duplicates():
    with pytest.raises(InputError, match="twice"):
        parse_input_shapes(["x=1", "x=2"])


def _two_input_model():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    return model(nodes, [vi("a", ["batch", 3]), vi("b", ["batch", 3])], [vi("y", ["batch", 3])])


def test_symbolic_batch_is_bound_and_shared_between_inputs():
    g = import_and_compare(_two_input_model(), {"a": (5, 3)})
    assert [v.shape for v in g.inputs] == [(5, 3), (5, 3)]
    assert g.outputs[0].shape == (5, 3)


def test_unbound_dimension_tells_the_user_what_to_pass():
    with pytest.raises(ShapeError) as e:
        import_model(_two_input_model())
    msg = str(e.value)
    assert "--input-shape a=1x3" in msg and "\n" not in msg


def test_unknown_dimension_without_a_name():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [None, 4])], [vi("y", None)])
    with pytest.raises(ShapeError, match="--input-shape x=1x4"):
        import_model(m)
    assert import_model(m, {"x": (2, 4)}).inputs[0].shape == (2, 4)


def test_unknown_rank_needs_a_shape():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", None)], [vi("y", None)])
    with pytest.raises(ShapeError, match="unknown rank"):
        import_model(m)
    assert import_model(m, {"x": (2, 2, 2)}).outputs[0].shape == (2, 2, 2)


def test_given_shape_must_match_fixed_dims_and_rank():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["N", 4])], [vi("y", None)])
    with pytest.raises(ShapeError, match="fixed at 4"):
        import_model(m, {"x": (1, 5)})
    with pytest.raises(ShapeError, match="rank"):
        import_model(m, {"x": (1, 4, 1)})


def test_conflicting_symbol_bindings():
    with pytest.raises(ShapeError, match="'batch'"):
        import_model(_two_input_model(), {"a": (2, 3), "b": (3, 3)})


def test_shape_for_an_unknown_input():
    with pytest.raises(InputError, match="'nope'"):
        import_model(_two_input_model(), {"a": (1, 3), "nope": (1,)})


def test_static_model_needs_no_shapes_and_accepts_its_own():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])
    assert import_model(m).inputs[0].shape == (2, 3)
    assert import_model(m, {"x": (2, 3)}).inputs[0].shape == (2, 3)


def test_errors_are_opfuse_errors():
    for bad in (lambda: import_model(_two_input_model()), lambda: parse_input_shapes(["?"])):
        with pytest.raises(OpfuseError):
            bad()


def test_batch_dimension_flows_through_a_constant_weight():
    nodes = [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)]
    m = model(nodes, [vi("x", ["N", 8])], [vi("y", ["N", 2])], [init("w", np.ones((2, 8), np.float32))])
    g = import_and_compare(m, {"x": (6, 8)})
    assert g.outputs[0].shape == (6, 2)
