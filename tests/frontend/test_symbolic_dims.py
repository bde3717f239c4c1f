"""Symbolic input dims bound by a run's arrays: ``opfuse.compile`` specialises the model to the
shapes it is run on (recompiled, once per set of shapes, when they change), the CLI binds them
from ``--inputs``, and an exporter's placeholder (paddle2onnx ``?``) is an unknown, not a symbol."""
import numpy as np
import onnx
import pytest
from onnx import helper

import opfuse
from opfuse.api import shapes_for_arrays, unbound_inputs
from opfuse.cli import main
from opfuse.compiler import SpecializingModel
from opfuse.errors import InputError, OpfuseError, ShapeError, ShapeInputError
from opfuse.frontend.input_shapes import symbolic_dim
from opfuse.runtime.reference import run as reference_run

from onnx_builders import I64, init, ints, model, ort_run, vi

RTOL, ATOL = 1e-4, 1e-5


def _yolo_like(dims=("N", 3, "H", "W")) -> onnx.ModelProto:
    """Conv, SiLU, a residual Add, and a shape-deciding subgraph (Shape -> Gather -> Concat ->
    Reshape) that flattens the spatial dims, as YOLO heads do: every size comes from the input."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Mul", ["c", "s"], ["silu"]),
        helper.make_node("Add", ["silu", "c"], ["r"]),
        helper.make_node("Shape", ["r"], ["shp"]),
        helper.make_node("Gather", ["shp", "i01"], ["nc"], axis=0),
        helper.make_node("Concat", ["nc", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["r", "newshape"], ["y"]),
    ]
    inits = [init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3),
             init("b", rng.standard_normal(4).astype(np.float32)), ints("i01", [0, 1]), ints("minus1", [-1])]
    return model(nodes, [vi("x", list(dims))], [vi("y", ["N", 4, "HW"])], inits, opset=17)


def _feeds(shape, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def test_compile_without_shapes_specialises_to_each_run(tmp_path):
    m = opfuse.compile(_yolo_like())
    assert isinstance(m, SpecializingModel)
    for shape in [(1, 3, 8, 8), (2, 3, 5, 7)]:
        feeds = _feeds(shape)
        out = m.run(feeds)
        assert out["y"].shape == (shape[0], 4, shape[2] * shape[3])
        np.testing.assert_allclose(out["y"], ort_run(_yolo_like(), feeds)["y"], rtol=RTOL, atol=ATOL)
        assert m.report["kernels_after"] < m.report["kernels_before"]  # the SiLU and Add fused into the Conv
    assert m.compiles == 2
    m.run(_feeds((1, 3, 8, 8), seed=1))  # shapes seen before: no new compile
    assert m.compiles == 2
    assert m.shapes == [{"x": (2, 3, 5, 7)}, {"x": (1, 3, 8, 8)}]


def test_compile_with_input_shapes_is_a_plain_compiled_model():
    m = opfuse.compile(_yolo_like(), input_shapes={"x": (1, 3, 6, 6)})
    assert not isinstance(m, SpecializingModel)
    feeds = _feeds((1, 3, 6, 6))
    np.testing.assert_allclose(m.run(feeds)["y"], ort_run(_yolo_like(), feeds)["y"], rtol=RTOL, atol=ATOL)
    with pytest.raises(InputError):  # bound once and for all: another shape is an error, not a recompile
        m.run(_feeds((1, 3, 7, 7)))


def test_unfused_specialisation_matches_the_reference():
    m = opfuse.compile(_yolo_like(), fuse=False)
    feeds = _feeds((1, 3, 4, 9))
    out = m.run(feeds)
    np.testing.assert_allclose(out["y"], reference_run(m.graph, feeds)["y"], rtol=RTOL, atol=ATOL)
    assert m.report["kernels_after"] == m.report["kernels_before"]


def test_arrays_that_cannot_bind_the_dims_are_refused_in_one_line():
    m = opfuse.compile(_yolo_like())
    with pytest.raises(OpfuseError, match="not bound yet"):
        _ = m.report
    with pytest.raises(ShapeError, match="rank 3") as e:
        m.run(_feeds((1, 3, 8)))
    assert "\n" not in str(e.value)
    with pytest.raises(ShapeError, match="fixed at 3"):
        m.run(_feeds((1, 4, 8, 8)))
    with pytest.raises(InputError, match=r"\['x'\] missing"):
        m.run({})
    assert m.compiles == 0


def test_one_symbol_shared_by_two_inputs_must_agree():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    m2 = model(nodes, [vi("a", ["batch", 3]), vi("b", ["batch", 3])], [vi("y", ["batch", 3])])
    one = np.ones((2, 3), np.float32)
    assert shapes_for_arrays(m2, {}, {"a": one, "b": one}) == {"a": (2, 3), "b": (2, 3)}
    assert unbound_inputs(m2, {"a": (2, 3)}) == []  # b's batch is bound by a
    with pytest.raises(ShapeError, match="symbolic dimension 'batch' is 2"):
        opfuse.compile(m2).run({"a": one, "b": np.ones((4, 3), np.float32)})


@pytest.mark.parametrize("param, expected", [("?", None), ("", None), ("-1", None), ("*", None),
                                             ("batch", "batch"), ("p2o.DynamicDimension.0", "p2o.DynamicDimension.0"),
                                             ("unk__12", "unk__12")])
def test_exporter_placeholders_are_unknown_not_symbols(param, expected):
    assert symbolic_dim(param) == expected


def test_question_mark_dims_are_independent():
    """paddle2onnx writes [-1, 3, ?, ?] for an image of any height and width: '?' twice is two sizes."""
    m = _yolo_like(dims=(-1, 3, "?", "?"))
    assert opfuse.load(m, {"x": (1, 3, 48, 192)}).inputs[0].shape == (1, 3, 48, 192)
    out = opfuse.compile(m).run(_feeds((1, 3, 4, 10)))
    assert out["y"].shape == (1, 4, 40)


def _save(tmp_path, m, name="m.onnx"):
    path = tmp_path / name
    onnx.save(m, path)
    return str(path)


def test_cli_run_binds_symbolic_dims_from_inputs(tmp_path, capsys):
    path = _save(tmp_path, _yolo_like())
    np.savez(tmp_path / "x.npz", **_feeds((1, 3, 6, 10)))
    code = main(["run", path, "--backend", "c", "--inputs", str(tmp_path / "x.npz"), "--compare", "onnxruntime",
                 "-q"])
    out = capsys.readouterr().out
    assert code == 0
    assert "y: float32[1, 4, 60]" in out
    code = main(["run", path, "--backend", "c", "--input-shape", "x=2x3x5x5", "--compare", "onnxruntime", "-q"])
    assert code == 0 and "y: float32[2, 4, 25]" in capsys.readouterr().out


@pytest.mark.parametrize("argv, fragment", [
    ([], "pass --input-shape x=1x3x1x1"),
    (["--input-shape", "x=1x3x5"], "has rank 3"),
    (["--input-shape", "x=1x2x5x5"], "fixed at 3"),
])
def test_cli_run_refuses_unbindable_dims_in_one_line(tmp_path, capsys, argv, fragment):
    path = _save(tmp_path, _yolo_like())
    code = main(["run", path, "--backend", "c", "-q", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err and err.count("\n") == 1


def test_cli_run_refuses_inputs_of_the_wrong_rank(tmp_path, capsys):
    path = _save(tmp_path, _yolo_like())
    np.savez(tmp_path / "x.npz", **_feeds((3, 6, 10)))
    code = main(["run", path, "--backend", "c", "--inputs", str(tmp_path / "x.npz"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "input 'x' of shape 3x6x10 has rank 3" in err and err.count("\n") == 1


# Inputs that decide shapes: bound to the values of a run -------------------------------------------

def _shape_inputs_model() -> onnx.ModelProto:
    """x reshaped by a run-time shape, then summed over run-time axes (opset 18: axes is an input)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"]),
             helper.make_node("ReduceSum", ["y", "axes"], ["z"], keepdims=0)]
    return model(nodes, [vi("x", [2, 6]), vi("shape", [2], I64), vi("axes", [1], I64)], [vi("z", None)], opset=18)


def _shape_feeds(shape, axes):
    x = np.arange(12, dtype=np.float32).reshape(2, 6) - 5
    return {"x": x, "shape": np.array(shape, np.int64), "axes": np.array(axes, np.int64)}


def test_import_names_the_graph_inputs_that_decide_a_shape():
    with pytest.raises(ShapeInputError) as e:
        opfuse.load(_shape_inputs_model())
    assert e.value.inputs == ("shape",) and "must be a constant" in str(e.value) and "\n" not in str(e.value)
    g = opfuse.load(_shape_inputs_model(), input_values={"shape": np.array([3, 4]), "axes": np.array([1])})
    assert [v.name for v in g.inputs] == ["x"] and g.outputs[0].shape == (3,)


def test_input_values_must_match_the_declared_input():
    with pytest.raises(InputError, match="the value given for input 'shape' is int32"):
        opfuse.load(_shape_inputs_model(), input_values={"shape": np.array([3, 4], np.int32)})
    with pytest.raises(InputError, match="unknown input"):
        opfuse.load(_shape_inputs_model(), input_values={"nope": np.array([1])})


def test_compiled_model_is_specialised_to_each_runs_values():
    m = opfuse.compile(_shape_inputs_model())
    assert isinstance(m, SpecializingModel)
    for shape, axes, compiles in [([3, 4], [0], 1), ([4, 3], [1], 2), ([3, 4], [0], 2), ([3, 4], [1], 3)]:
        feeds = _shape_feeds(shape, axes)
        np.testing.assert_allclose(m.run(feeds)["z"], ort_run(_shape_inputs_model(), feeds)["z"], rtol=RTOL)
        assert m.compiles == compiles
    assert m.value_inputs == ("axes", "shape")
    assert [v.name for v in m.graph.inputs] == ["x"]
    with pytest.raises(InputError, match=r"\['axes'\] missing"):
        m.run({"x": feeds["x"], "shape": feeds["shape"]})


def test_cli_run_binds_shape_inputs_from_inputs(tmp_path, capsys):
    path = _save(tmp_path, _shape_inputs_model())
    np.savez(tmp_path / "in.npz", **_shape_feeds([3, 4], [1]))
    code = main(["run", path, "--backend", "c", "--inputs", str(tmp_path / "in.npz"), "--compare", "onnxruntime",
                 "-q"])
    assert code == 0 and "z: float32[3]" in capsys.readouterr().out
    code = main(["run", path, "--backend", "c", "-q"])  # random inputs cannot decide a shape
    err = capsys.readouterr().err
    assert code == 2 and "graph input(s) ['shape']" in err and err.count("\n") == 1


def test_a_function_body_keeps_the_inputs_that_decide_its_shapes():
    """CenterCropPad is imported through its ONNX function body, where a Pad's pads come from the
    graph input 'shape': the refusal still names it, so a run's value binds it."""
    nodes = [helper.make_node("CenterCropPad", ["x", "shape"], ["y"])]
    m = model(nodes, [vi("x", [4, 6]), vi("shape", [2], I64)], [vi("y", None)], opset=18)
    with pytest.raises(ShapeInputError) as e:
        opfuse.load(m)
    assert e.value.inputs == ("shape",) and "in its ONNX function body" in str(e.value)
    feeds = {"x": np.arange(24, dtype=np.float32).reshape(4, 6), "shape": np.array([6, 3], np.int64)}
    np.testing.assert_array_equal(opfuse.compile(m).run(feeds)["y"], ort_run(m, feeds)["y"])


def test_reshape_between_empty_tensors_compiles():
    """(0, 3, 4) -> (3, 4, 0): no element to map, and axes that pair up in no finer way."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=1)]
    m = model(nodes, [vi("x", [0, 3, 4])], [vi("y", None)], [ints("s", [3, 4, 0])], opset=18)
    out = opfuse.compile(m).run({"x": np.zeros((0, 3, 4), np.float32)})
    assert out["y"].shape == (3, 4, 0)


def test_values_bound_at_compile_time_need_not_be_fed():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    m = model(nodes, [vi("x", ["N", 6]), vi("shape", [2], I64)], [vi("y", None)], opset=18)
    c = opfuse.compile(m, input_values={"shape": np.array([-1, 3], np.int64)})
    assert c.run({"x": np.ones((2, 6), np.float32)})["y"].shape == (4, 3)
    assert c.run({"x": np.ones((2, 6), np.float32), "shape": np.array([3, -1])})["y"].shape == (3, 4)
    assert c.compiles == 2
