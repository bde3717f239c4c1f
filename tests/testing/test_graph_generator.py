"""The random graph generator: valid, bounded, deterministic, shrinkable graphs of the asked ops."""
import numpy as np
import pytest
from hypothesis import find, given
from hypothesis.errors import FailedHealthCheck, Unsatisfiable

from opfuse.errors import InputError
from opfuse.ops import GraphBuilder
from opfuse.ops.registry import REGISTRY
from opfuse.runtime.reference import run
from opfuse.testing import (ALL_OPS, DEFAULT_OPS, INTERNAL_OPS, MAX_ELEMENTS, enabled_families,
                            focused_ops, graph_and_inputs, graphs, magnitude_bounds,
                            property_settings)
from opfuse.testing.graph_families import FAMILIES

# Graphs drawn when looking for one that contains an op or a pattern.
SEARCH_EXAMPLES = 25
# Examples ``find`` may try (and then shrink) before giving up.
FIND_BUDGET = 200
# Every generated tensor is far below float32 overflow (the tracked bounds are much tighter).
MAGNITUDE_CEILING = 1e6
# Float32 rounding may push a value a few ulp past its exact worst-case bound.
BOUND_SLACK = 1e-5


def _op_types(g) -> set[str]:
    return {n.op_type for n in g.nodes}


def _find(strategy, condition):
    return find(strategy, condition, settings=property_settings(FIND_BUDGET))


@property_settings(max_examples=60)
@given(graph_and_inputs(max_nodes=12))
def test_graphs_verify_and_run_finite(case):
    g, feeds = case
    g.verify()
    assert 1 <= len(g.nodes) <= 12
    assert g.outputs and g.inputs
    assert _op_types(g) <= DEFAULT_OPS
    for v in g.values.values():
        assert v.type.size <= MAX_ELEMENTS, v
        if not v.is_const:
            assert v.dtype == np.float32 or (v.dtype in (np.bool_, np.int64) and v.producer is not None), v
    for node in g.nodes:  # the importer would fold a node whose inputs are all constants
        assert any(not v.is_const for v in node.input_values()), node
    used = {id(v) for n in g.nodes for v in n.input_values()}
    assert all(id(v) in used for v in g.inputs)  # no dead inputs
    outputs = {id(v) for v in g.outputs}
    assert all(any(id(v) in outputs or v.uses for v in n.outputs) for n in g.nodes)  # no dead nodes
    result = run(g, feeds)
    assert list(result) == [v.name for v in g.outputs]
    for name, value in result.items():
        assert np.isfinite(value).all(), name
        assert np.abs(value).max(initial=0.0) < MAGNITUDE_CEILING, name


@property_settings(max_examples=60)
@given(graph_and_inputs(max_nodes=12, ops=ALL_OPS))
def test_values_stay_within_their_tracked_bounds(case):
    """The generator's worst-case magnitude bound holds for every input and intermediate value."""
    g, feeds = case
    bounds = magnitude_bounds(g)
    assert set(bounds) == {v.name for v in g.values.values() if not v.is_const}
    for name, value in run(g, feeds, keep=True).items():
        if name in bounds:
            peak = np.abs(value.astype(np.float64)).max(initial=0.0)
            assert peak <= bounds[name] * (1 + BOUND_SLACK), name


def test_magnitude_bounds_only_for_generated_graphs():
    b = GraphBuilder("hand_made")
    g = b.build(b.op("Relu", b.input("x", (2,))))
    with pytest.raises(InputError, match="not made by"):
        magnitude_bounds(g)


@property_settings(max_examples=25)
@given(graphs(max_nodes=6, allow_multi_output=False))
def test_single_output_graphs(g):
    """One output; every node it does not need is gone, and so is every input it does not read."""
    assert len(g.outputs) == 1
    assert 1 <= len(g.nodes) <= 6
    g.verify()
    needed = {id(g.outputs[0])}
    for node in reversed(g.nodes):
        assert any(id(v) in needed for v in node.outputs), node
        needed.update(id(v) for v in node.input_values())
    assert all(id(v) in needed for v in g.inputs)


@property_settings(max_examples=25)
@given(graphs(max_nodes=8, ops={"Conv", "Relu", "Add", "MaxPool"}))
def test_only_the_asked_ops_appear(g):
    assert _op_types(g) <= {"Conv", "Relu", "Add", "MaxPool"}


def _collect(strategy, n=SEARCH_EXAMPLES):
    """The first ``n`` graphs the (derandomized) strategy draws."""
    seen = []

    @property_settings(max_examples=n)
    @given(strategy)
    def collect(g):
        seen.append(g)

    collect()
    return seen


def test_same_seed_same_graphs():
    first = [str(g) for g in _collect(graphs(max_nodes=8), 15)]
    assert first == [str(g) for g in _collect(graphs(max_nodes=8), 15)]
    assert len(set(first)) > len(first) // 2  # and they are not all the same graph


@pytest.mark.parametrize("op", sorted(ALL_OPS))
def test_every_op_is_generated(op):
    """Each op is generated when it is (nearly) the only one allowed."""
    assert any(op in _op_types(g) for g in _collect(graphs(max_nodes=6, ops=focused_ops(op))))


def test_shrinking_reaches_one_node():
    """Hypothesis shrinks a graph that must contain a Softmax down to that Softmax alone."""
    g = _find(graphs(), lambda g: "Softmax" in _op_types(g))
    assert [n.op_type for n in g.nodes] == ["Softmax"]


def test_every_generated_op_is_registered():
    assert ALL_OPS <= set(REGISTRY)
    assert INTERNAL_OPS <= ALL_OPS and not INTERNAL_OPS & DEFAULT_OPS


# Pattern families: the shapes the rewrites look for do appear ------------------------------------

def _producer_op(v):
    return v.producer.op_type if v is not None and v.producer is not None else None


def _has_silu(g) -> bool:
    """``Mul(x, Sigmoid(x))`` in either order."""
    return any(n.op_type == "Mul" and any(_producer_op(v) == "Sigmoid" and v.producer.inputs[0] in n.inputs
                                          for v in n.inputs) for n in g.nodes)


def _has_conv_bn_relu(g) -> bool:
    return any(n.op_type == "Relu" and _producer_op(n.inputs[0]) == "BatchNormalization"
               and _producer_op(n.inputs[0].producer.inputs[0]) == "Conv" for n in g.nodes)


def _has_residual(g) -> bool:
    """``Add(x, f(Conv(x)))`` with ``f`` a chain of BatchNorm/Relu (possibly empty)."""
    def conv_source(v):
        while _producer_op(v) in ("Relu", "BatchNormalization"):
            v = v.producer.inputs[0]
        return v.producer.inputs[0] if _producer_op(v) == "Conv" else None
    return any(n.op_type == "Add" and (conv_source(n.inputs[0]) is n.inputs[1]
                                       or conv_source(n.inputs[1]) is n.inputs[0]) for n in g.nodes)


def _has_qkv_siblings(g) -> bool:
    return any(sum(1 for c in v.consumers if c.op_type == "MatMul" and c.inputs[0] is v
                   and c.inputs[1].is_const) >= 3 for v in g.values.values())


def _has_decomposed_layernorm(g) -> bool:
    return any(n.op_type == "Div" and _producer_op(n.inputs[0]) == "Sub"
               and _producer_op(n.inputs[1]) == "Sqrt" for n in g.nodes)


def _has_squeeze_excite(g) -> bool:
    """``Mul(x, Sigmoid(Conv(Relu(Conv(GlobalAveragePool(x))))))``."""
    def chain(v, ops):
        for op in ops:
            if _producer_op(v) != op:
                return None
            v = v.producer.inputs[0]
        return v
    return any(n.op_type == "Mul" and chain(n.inputs[1], ("Sigmoid", "Conv", "Relu", "Conv",
                                                          "GlobalAveragePool")) is n.inputs[0]
               for n in g.nodes)


def _has_erf_gelu(g) -> bool:
    return any(n.op_type == "Erf" and any(c.op_type == "Add" for c in n.outputs[0].consumers)
               for n in g.nodes)


@pytest.mark.parametrize("name, ops, present", [
    ("silu", {"Mul", "Sigmoid"}, _has_silu),
    ("conv_bn_relu", {"Conv", "BatchNormalization", "Relu"}, _has_conv_bn_relu),
    ("residual", {"Conv", "Add"}, _has_residual),
    ("qkv", {"MatMul", "Transpose", "Softmax", "Mul"}, _has_qkv_siblings),
    ("layernorm", {"ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div", "Pow"}, _has_decomposed_layernorm),
    ("gelu", {"Mul", "Erf", "Add", "Div"}, _has_erf_gelu),
    ("squeeze_excite", {"GlobalAveragePool", "Conv", "Relu", "Sigmoid", "Mul"}, _has_squeeze_excite),
])
def test_patterns_are_generated(name, ops, present):
    # Patterns take up to 10 nodes: ask for big enough graphs.
    assert any(present(g) for g in _collect(graphs(ops=ops, min_nodes=8)))


def test_patterns_can_be_left_out():
    names = {f.name for f in enabled_families(DEFAULT_OPS, patterns=False)}
    assert names == {f.name for f in FAMILIES if not f.pattern}


# Bad arguments --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"ops": {"Relu", "NoSuchOp"}}, "not in the opfuse op registry"),
    ({"ops": {"Shape"}}, "cannot emit"),
    ({"ops": "Relu"}, "collection of op names"),
    ({"ops": set()}, "no op family"),
    ({"max_nodes": 2, "min_nodes": 3}, "min_nodes"),
    ({"max_inputs": 0}, "max_inputs"),
])
def test_bad_arguments_raise_input_error(kwargs, message):
    with pytest.raises(InputError, match=message):
        graphs(**kwargs)


@pytest.mark.parametrize("op", sorted(ALL_OPS))
def test_any_single_op_draws_graphs_or_is_refused(op):
    """``opfuse fuzz --ops OP`` with one op and none of its helpers: the generator draws graphs, or refuses an op
    no family builds alone (InputError), or finds none where the op needs another to keep its inputs in its
    domain (the ops ``focused_ops`` adds helpers for: ``fuzz`` turns that into an InputError naming them), and
    never fails otherwise (``--ops DepthToSpace`` alone raised an IndexError: its family took values that only
    SpaceToDepth, not allowed, had blocks for)."""
    try:
        seen = _collect(graphs(max_nodes=6, ops={op}), 5)
    except InputError as e:
        assert str(e) == f"no op family can be built from ops ['{op}']"
        return
    except (FailedHealthCheck, Unsatisfiable):
        assert focused_ops(op) - {op}, op
        return
    assert len(seen) == 5


def test_fuzz_refuses_an_op_set_it_cannot_draw_from_in_one_line():
    from opfuse.testing.fuzz import fuzz
    with pytest.raises(InputError, match=r"^no graph can be drawn from ops \['Tan'\] alone .*try --ops Tan Tanh$"):
        fuzz(count=2, ops=["Tan"])
