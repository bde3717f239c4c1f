"""Control flow (If, Loop, Scan) and sequences/optionals folded at import (``onnx_control``,
``onnx_sequences``): each folded model computes what ONNX's reference evaluator computes on the
original (rtol 1e-5, atol 1e-6), in the reference executor and in C, with no control flow left;
each case that cannot be folded is refused in one line naming the node and why."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import opfuse
from onnx_builders import init, model, op_types, ort_run, vi
from opfuse.errors import ModelError, OpfuseError, ShapeInputError, UnsupportedOpError
from opfuse.frontend import onnx_control
from opfuse.frontend.onnx import import_model
from opfuse.runtime.reference import run

RTOL, ATOL = 1e-5, 1e-6
# Cases where onnx 1.23's ReferenceEvaluator is wrong, so onnxruntime is the oracle: a Loop without
# a condition input (it raises), an If inside a Loop body (it returns the loop's initial value),
# Optional of a tensor (it returns a list), Scan output directions (not implemented).
ORT = "onnxruntime"
B = TensorProto.BOOL
I64 = TensorProto.INT64
CONTROL_AND_SEQUENCE_OPS = {"If", "Loop", "Scan", "SequenceConstruct", "SequenceAt", "SplitToSequence",
                            "ConcatFromSequence", "Optional", "OptionalGetElement", "OptionalHasElement"}


def _feeds(m: onnx.ModelProto, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    consts = {t.name for t in m.graph.initializer}
    feeds = {}
    for v in m.graph.input:
        if v.name in consts:
            continue
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        feeds[v.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _close(ours: dict, want: dict, rtol: float = RTOL) -> None:
    assert sorted(ours) == sorted(want)
    for k in want:
        a, b = np.asarray(ours[k]), np.asarray(want[k])
        assert a.shape == b.shape and a.dtype == b.dtype, (k, a.shape, b.shape, a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=ATOL, err_msg=k)


def fold_and_compare(m: onnx.ModelProto, c: bool = True, oracle: str = "reference", rtol: float = RTOL):
    """Import ``m``; the reference run (and, with ``c``, the compiled C) equals ONNX's reference
    evaluator (or onnxruntime) on ``m``. Returns the imported graph and the compiled model."""
    feeds = _feeds(m)
    outs = [o.name for o in m.graph.output]
    if oracle == ORT:
        want = ort_run(m, feeds)
    else:
        want = dict(zip(outs, ReferenceEvaluator(m).run(None, feeds), strict=True))
    g = import_model(m)
    assert not set(op_types(g)) & CONTROL_AND_SEQUENCE_OPS
    _close(run(g, feeds), want, rtol)
    compiled = None
    if c:
        compiled = opfuse.compile(m, target="host", threads=1)
        _close(compiled.run(feeds), want, rtol)
    return g, compiled


def _one_line(exc_type, fn, *args) -> str:
    with pytest.raises(exc_type) as e:
        fn(*args)
    msg = str(e.value)
    assert isinstance(e.value, OpfuseError) and "\n" not in msg, msg
    return msg


def _const(name: str, array) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=init(name + "_value", array))


# If ---------------------------------------------------------------------------------------------

def _if_model(cond_nodes, cond: str) -> onnx.ModelProto:
    """``y = If(cond) then Relu(x) * w else Neg(x)``: the branches read ``x`` and ``w`` from outside."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "w"], ["t"])],
                             "then", [], [vi("t", [2, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", [2, 3])])
    nodes = cond_nodes + [helper.make_node("If", [cond], ["y"], name="choose", then_branch=then, else_branch=other),
                          helper.make_node("Add", ["y", "x"], ["z"], name="after")]
    return model(nodes, [vi("x", [2, 3])], [vi("z", [2, 3])], [init("w", np.full((2, 3), 0.5, np.float32))],
                 opset=17)


def test_if_with_a_constant_condition_is_its_branch():
    g, compiled = fold_and_compare(_if_model([_const("c", np.array(True))], "c"))
    assert op_types(g) == ["Relu", "Mul", "Add"]
    assert [n.name for n in g.nodes][:2] == ["choose/then/relu_0", "choose/then/mul_1"]
    assert len(compiled.plan.groups) == 1  # the branch fuses with what follows
    g, _ = fold_and_compare(_if_model([_const("c", np.array(False))], "c"), c=False)
    assert op_types(g) == ["Neg", "Add"]


def test_if_whose_condition_folds_from_a_static_shape():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Equal", ["n", "two"], ["c"])]
    m = _if_model(nodes, "c")
    m.graph.initializer.extend([init("zero", np.array(0, np.int64)), init("two", np.array(2, np.int64))])
    g, _ = fold_and_compare(m, c=False)
    assert "Relu" in op_types(g)


def test_if_on_a_data_dependent_condition_names_the_node_and_why():
    m = _if_model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                   helper.make_node("Greater", ["s", "zero"], ["c"])], "c")
    m.graph.initializer.append(init("zero", np.array(0, np.float32)))
    for fn in (import_model, opfuse.compile):
        msg = _one_line(UnsupportedOpError, fn, m)
        assert "'If' (node 'choose'" in msg and "condition ('c') is computed at run time from the data of ['x']" in msg
        assert "data-dependent" in msg


def test_if_on_a_flag_input_specialises_the_compiled_model():
    """A condition that is a (small) graph input: the model is compiled for each value it is run with."""
    m = _if_model([], "c")
    m.graph.input.append(vi("c", [], B))
    msg = _one_line(ShapeInputError, import_model, m)
    assert "'choose'" in msg and "['c']" in msg
    compiled = opfuse.compile(m, target="host", threads=1)
    x = _feeds(m)["x"]
    for flag in (True, False, True):
        feeds = {"x": x, "c": np.array(flag)}
        want = ReferenceEvaluator(m).run(None, feeds)[0]
        np.testing.assert_allclose(compiled.run(feeds)["z"], want, rtol=RTOL, atol=ATOL)


# Loop -----------------------------------------------------------------------------------------

def _loop_model(trip: int | None, cond: bool | None, body_cond=None) -> onnx.ModelProto:
    """``acc`` accumulates ``x[i] * w`` (``w`` read from outside); the scan output stacks each ``acc``."""
    body_nodes = [helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
                  helper.make_node("Mul", ["row", "w"], ["term"]),
                  helper.make_node("Add", ["acc_in", "term"], ["acc_out"]),
                  helper.make_node("Sigmoid", ["acc_out"], ["scan_out"])]
    if body_cond is None:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        body_nodes += body_cond
    body = helper.make_graph(body_nodes, "body",
                             [vi("i", [], I64), vi("cond_in", [], B), vi("acc_in", [3])],
                             [vi("cond_out", [], B), vi("acc_out", [3]), vi("scan_out", [3])])
    nodes, inits = [], [init("acc0", np.zeros(3, np.float32)), init("w", np.linspace(-1, 1, 3).astype(np.float32))]
    if trip is not None:
        inits.append(init("M", np.array(trip, np.int64)))
    if cond is not None:
        inits.append(init("c", np.array(cond)))
    nodes.append(helper.make_node("Loop", ["M" if trip is not None else "", "c" if cond is not None else "", "acc0"],
                                  ["acc", "stacked"], name="loop", body=body))
    return model(nodes, [vi("x", [6, 3])], [vi("acc", [3]), vi("stacked", None)], inits, opset=17)


def test_loop_with_a_constant_trip_count_is_unrolled():
    g, compiled = fold_and_compare(_loop_model(4, True))
    assert op_types(g).count("Mul") == 4 and "Concat" in op_types(g)
    assert g.outputs[1].shape == (4, 3)
    assert len(compiled.plan.groups) < len(g.nodes)  # the unrolled iterations fuse
    g, _ = fold_and_compare(_loop_model(2, None), c=False, oracle=ORT)
    assert op_types(g).count("Mul") == 2


def test_loop_stops_when_the_body_condition_folds_to_false():
    """The body computes ``cond_out = i < 2``: three iterations of at most 5."""
    less = [_const("limit", np.array(2, np.int64)), helper.make_node("Less", ["i", "limit"], ["cond_out"])]
    g, _ = fold_and_compare(_loop_model(5, True, less))
    assert op_types(g).count("Mul") == 3 and g.outputs[1].shape == (3, 3)
    g, _ = fold_and_compare(_loop_model(None, True, less), c=False)  # a while loop
    assert op_types(g).count("Mul") == 3


def test_loop_refusals_name_the_node_and_why():
    m = _loop_model(None, None)
    assert "endless" in _one_line(UnsupportedOpError, import_model, m)
    m = _loop_model(4, True)
    m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "M"))
    m.graph.input.append(vi("M", [], I64))
    msg = _one_line(ShapeInputError, import_model, m)
    assert "'Loop' (node 'loop'" in msg and "trip count" in msg and "['M']" in msg
    data_cond = [helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
                 _const("zero", np.array(0, np.float32)), helper.make_node("Less", ["total", "zero"], ["cond_out"])]
    msg = _one_line(UnsupportedOpError, import_model, _loop_model(4, True, data_cond))
    assert "'loop'" in msg and "iteration 0" in msg and "data-dependent" in msg


def test_unrolling_stops_at_the_named_limit(monkeypatch):
    monkeypatch.setattr(onnx_control, "MAX_UNROLLED_NODES", 15)
    msg = _one_line(UnsupportedOpError, import_model, _loop_model(4, None))  # 4 x 5 body nodes
    assert "'loop'" in msg and "MAX_UNROLLED_NODES = 15" in msg
    import_model(_loop_model(3, None))


# Scan -----------------------------------------------------------------------------------------

def _scan_model(opset: int = 17, **axes) -> onnx.ModelProto:
    """An RNN cell ``h = tanh(h @ W + x_t)`` scanned over ``x`` (``W`` read from outside), and a
    second scan input summed into a state."""
    body = helper.make_graph([helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
                              helper.make_node("Add", ["hw", "x_t"], ["pre"]),
                              helper.make_node("Tanh", ["pre"], ["h_out"]),
                              helper.make_node("Add", ["s_in", "u_t"], ["s_out"]),
                              helper.make_node("Mul", ["h_out", "u_t"], ["y_t"])],
                             "cell", [vi("h_in", [1, 4]), vi("s_in", [1, 4]), vi("x_t", [1, 4]), vi("u_t", [1, 4])],
                             [vi("h_out", [1, 4]), vi("s_out", [1, 4]), vi("y_t", [1, 4])])
    x_shape = [5, 1, 4] if axes.get("scan_input_axes", [0])[0] == 0 else [1, 5, 4]
    node = helper.make_node("Scan", ["h0", "s0", "x", "u"], ["h", "s", "y"], name="rnn", num_scan_inputs=2,
                            body=body, **axes)
    inits = [init("W", np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32) * 0.5),
             init("s0", np.zeros((1, 4), np.float32))]
    return model([node], [vi("h0", [1, 4]), vi("x", x_shape), vi("u", [5, 1, 4])],
                 [vi("h", [1, 4]), vi("s", [1, 4]), vi("y", None)], inits, opset=opset)


def test_scan_is_unrolled():
    g, compiled = fold_and_compare(_scan_model())
    assert op_types(g).count("Tanh") == 5 and g.outputs[2].shape == (5, 1, 4)


def test_scan_axes_and_directions():
    m = _scan_model(scan_input_axes=[1, 0], scan_input_directions=[1, 0], scan_output_axes=[-1],
                    scan_output_directions=[1])
    g, _ = fold_and_compare(m, oracle=ORT)
    assert g.outputs[2].shape == (1, 4, 5)


def test_scan8_scans_each_batch_element():
    """Scan-8: batch axis 0, sequence axis 1 (ONNX's reference evaluator has no Scan-8: onnxruntime)."""
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
                             "body", [vi("s_in", [2]), vi("x_t", [2])], [vi("s_out", [2]), vi("y_t", [2])])
    node = helper.make_node("Scan", ["", "s0", "x"], ["s", "y"], name="scan8", num_scan_inputs=1, body=body,
                            directions=[1])
    m = model([node], [vi("s0", [3, 2]), vi("x", [3, 4, 2])], [vi("s", [3, 2]), vi("y", [3, 4, 2])], opset=8)
    feeds = _feeds(m)
    g = import_model(m)
    assert "Scan" not in op_types(g)
    _close(run(g, feeds), ort_run(m, feeds))


# Nesting and function bodies ----------------------------------------------------------------------

def test_if_inside_a_loop_folds_per_iteration():
    """The body branches on ``i == 0`` (a constant in each unrolled copy)."""
    then = helper.make_graph([helper.make_node("Identity", ["acc_in"], ["first"])], "then", [], [vi("first", [3])])
    other = helper.make_graph([helper.make_node("Mul", ["acc_in", "x"], ["later"])], "else", [],
                              [vi("later", [3])])
    body = helper.make_graph([_const("zero", np.array(0, np.int64)),
                              helper.make_node("Equal", ["i", "zero"], ["is_first"]),
                              helper.make_node("If", ["is_first"], ["picked"], then_branch=then, else_branch=other),
                              helper.make_node("Add", ["picked", "x"], ["acc_out"]),
                              helper.make_node("Identity", ["cond_in"], ["cond_out"])],
                             "body", [vi("i", [], I64), vi("cond_in", [], B), vi("acc_in", [3])],
                             [vi("cond_out", [], B), vi("acc_out", [3])])
    node = helper.make_node("Loop", ["M", "", "acc0"], ["acc"], name="loop", body=body)
    m = model([node], [vi("x", [3])], [vi("acc", [3])],
              [init("M", np.array(3, np.int64)), init("acc0", np.ones(3, np.float32))], opset=17)
    g, _ = fold_and_compare(m, oracle=ORT)
    assert op_types(g) == ["Add", "Mul", "Add", "Mul", "Add"]


def test_function_bodies_with_control_flow_are_inlined(monkeypatch):
    """AffineGrid's ONNX function body holds If nodes on its attributes and static shapes. AffineGrid
    is an opfuse op now, so the importer is made to take the function body as for an op it lacks."""
    from opfuse.frontend import onnx_functions
    real = onnx_functions.is_importable
    monkeypatch.setattr(onnx_functions, "is_importable", lambda op: op != "AffineGrid" and real(op))
    nodes = [helper.make_node("AffineGrid", ["t", "size"], ["y"], align_corners=1)]
    m = model(nodes, [vi("t", [2, 2, 3])], [vi("y", None)], [init("size", np.array([2, 1, 4, 5], np.int64))],
              opset=20)
    g, _ = fold_and_compare(m, c=False)
    assert "AffineGrid" not in op_types(g)


def test_a_function_body_with_a_scan_is_unrolled():
    """LinearAttention's ONNX function body scans the sequence (4 steps here) with a Scan (states reach
    ~40 from unit inputs: float32 sums in another order differ by ~1e-5 relative)."""
    node = helper.make_node("LinearAttention", ["q", "k", "v", "past", "decay", "beta"], ["y", "state"],
                            q_num_heads=4, kv_num_heads=4)
    m = model([node], [vi("q", [2, 4, 32]), vi("k", [2, 4, 32]), vi("v", [2, 4, 32]), vi("past", [2, 4, 8, 8]),
                       vi("decay", [2, 4, 32]), vi("beta", [2, 4, 4])],
              [vi("y", [2, 4, 32]), vi("state", [2, 4, 8, 8])], opset=27)
    g, compiled = fold_and_compare(m, rtol=1e-4)
    assert "LinearAttention" not in op_types(g) and "MatMul" in op_types(g)
    assert any(len(group.nodes) > 1 for group in compiled.plan.groups)


def test_folding_is_deterministic():
    m = _scan_model(scan_input_axes=[1, 0], scan_output_axes=[1])
    a, b = import_model(m), import_model(m)
    assert [(n.name, n.op_type, [v.name for v in n.outputs]) for n in a.nodes] == \
        [(n.name, n.op_type, [v.name for v in n.outputs]) for n in b.nodes]
    first = opfuse.compile(m, target="host", threads=1).program.source
    assert opfuse.compile(m, target="host", threads=1).program.source == first


def test_subgraphs_only_on_control_flow_ops():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [], [vi("o", [3])])
    node = helper.make_node("MatMul", ["x", "x"], ["y"], name="odd", body=branch)
    msg = _one_line(UnsupportedOpError, import_model, model([node], [vi("x", [3])], [vi("y", [3])]))
    assert "'odd'" in msg and "subgraph" in msg and "If, Loop and Scan" in msg


# Sequences and optionals --------------------------------------------------------------------------

def test_sequences_inside_the_graph_fold_away():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"], axis=1),             # 4 pieces [2, 1]
             helper.make_node("SequenceAt", ["parts", "minus1"], ["last"]),
             helper.make_node("SequenceErase", ["parts", "zero"], ["rest"]),              # pieces 1..3
             helper.make_node("SequenceInsert", ["rest", "last", "zero"], ["again"]),     # 3, 1, 2, 3
             helper.make_node("SequenceLength", ["again"], ["n"]),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("ConcatFromSequence", ["again"], ["cat"], axis=1),
             helper.make_node("Mul", ["cat", "nf"], ["y"]),
             helper.make_node("SplitToSequence", ["x"], ["cols"], axis=1, keepdims=0),   # 4 pieces [2]
             helper.make_node("ConcatFromSequence", ["cols"], ["z"], axis=0, new_axis=1),
             helper.make_node("SequenceConstruct", ["x", "x"], ["pair"]),
             helper.make_node("SplitToSequence", ["x", "three"], ["chunks"], axis=1),    # sizes 3, 1
             helper.make_node("SequenceAt", ["chunks", "zero"], ["head"]),
             helper.make_node("SequenceAt", ["pair", "zero"], ["p0"]),
             helper.make_node("Add", ["head", "head"], ["w"]),
             helper.make_node("Optional", ["p0"], ["opt"]),
             helper.make_node("OptionalGetElement", ["opt"], ["v"]),
             helper.make_node("OptionalHasElement", ["opt"], ["has"])]
    inits = [init("zero", np.array(0, np.int64)), init("minus1", np.array(-1, np.int64)),
             init("three", np.array(3, np.int64))]
    m = model(nodes, [vi("x", [2, 4])], [vi("y", None), vi("z", None), vi("w", None), vi("v", None),
                                         vi("has", None, B)], inits, opset=18)
    g, _ = fold_and_compare(m, oracle=ORT)
    assert g.outputs[0].shape == (2, 4) and g.outputs[1].shape == (4, 2)


def test_sequence_refusals():
    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0)]
    m = model(nodes, [vi("x", [2, 4])], [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)],
              opset=18)
    assert "graph output 'parts' is a sequence" in _one_line(ModelError, import_model, m)
    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0),
             helper.make_node("Relu", ["parts"], ["y"], name="act")]
    m = model(nodes, [vi("x", [2, 4])], [vi("y", None)], opset=18)
    msg = _one_line(UnsupportedOpError, import_model, m)
    assert "'act'" in msg and "input 0 is a sequence" in msg
    nodes = [helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0),
             helper.make_node("SequenceAt", ["parts", "k"], ["y"], name="pick")]
    m = model(nodes, [vi("x", [2, 4]), vi("k", [], I64)], [vi("y", None)], opset=18)
    msg = _one_line(ShapeInputError, import_model, m)
    assert "'pick'" in msg and "must be a constant" in msg
