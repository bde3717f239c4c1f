"""The ONNX backend node tests that concern opfuse's ops, and how to run one through opfuse.

Where the tests come from
-------------------------
onnx 1.23 no longer ships the node tests as files. ``onnx.backend.test.loader.
load_node_model_tests()`` imports every module of ``onnx.backend.test.case.node``; each
``export_*`` function there calls ``expect(node, inputs, outputs, name)``, which builds a
one-node ``onnx.ModelProto`` and appends a ``TestCase`` to a module-level list. A
``TestCase`` carries everything in memory: ``model`` (the ModelProto, opset = the op's newest
``since_version``), ``data_sets`` = ``[(inputs, expected_outputs)]`` (NumPy arrays, or
``TensorProto`` for types NumPy lacks), and ``rtol``/``atol`` (ONNX's defaults 1e-3 / 1e-7).
``*_expanded`` tests hold the op's function body instead of the op.

How one is run
--------------
1. Opset: opfuse imports opsets 7 to the newest the installed onnx defines (28 in onnx 1.23),
   so every model of the suite is run at its own opset; one outside the range would be
   brought into it with ``onnx.version_converter``. (``benchmarks/bench_conformance.py``
   counts the whole suite as shipped: no conversion, no promoted inputs.)
2. Static shapes: opfuse compiles static shapes, so operands that decide a shape (Reshape's
   shape, Slice's starts/ends/axes/steps, Expand's shape, Pad's pads/constant_value/axes,
   Resize's roi/scales/sizes, AffineGrid's size, Col2Im's image/block shapes, MaxUnpool's
   output_shape, ConstantOfShape's shape, Squeeze/Unsqueeze/Reduce* axes,
   Split's sizes, CumSum's axis, OneHot's depth, Range's inputs, Tile's repeats, TopK's K, DFT's
   length and axis, STFT's step and length, MelWeightMatrix's scalars, Compress's condition, and
   every input of NonZero, Unique and NonMaxSuppression, whose output shapes depend on values) must be
   constants, and so must what decides control flow (If's condition, Loop's trip count and
   condition, a sequence position or SplitToSequence's split: opfuse folds them at import). A
   test that feeds them as graph inputs has them *promoted to initializers* holding the test's
   own input data -- the same values, now known at compile time. Graph inputs a shape operand
   is computed from are promoted too (the walk stops at ``Shape``, whose result depends only
   on static shapes).
3. ``opfuse.frontend.onnx.import_model`` imports the model, ``opfuse.runtime.reference.run``
   executes it, and every output is compared with the expected one: same shape, same dtype,
   values within the test's ``rtol``/``atol`` (``numpy.testing.assert_allclose``, NaN == NaN).
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.version_converter
from onnx import numpy_helper

from opfuse.frontend.onnx import MAX_OPSET, MIN_OPSET, import_model
from opfuse.frontend.onnx_control import CONTROL_FLOW
from opfuse.frontend.onnx_sequences import SEQUENCE_OPS
from opfuse.ops import REGISTRY
from opfuse.runtime.reference import run

# Operand indices that must be compile-time constants in opfuse's canonical IR.
SHAPE_OPERANDS = {
    "Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Resize": (1, 2, 3),
    "ConstantOfShape": (0,), "Squeeze": (1,), "Unsqueeze": (1,), "ReduceMean": (1,),
    "ReduceSum": (1,), "ReduceMax": (1,), "Split": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "CumSum": (1,), "CumProd": (1,), "OneHot": (1,), "Range": (0, 1, 2), "Tile": (1,), "TopK": (1,),
    "AffineGrid": (1,), "Col2Im": (1, 2), "MaxUnpool": (2,),
    "DFT": (1, 2), "STFT": (1, 3), "MelWeightMatrix": (0, 1, 2, 3, 4), "Compress": (1,),
    # Data-dependent output shapes (frontend/onnx_data_shapes.py): every input decides it.
    "NonZero": (0,), "Unique": (0,), "NonMaxSuppression": (0, 1, 2, 3, 4),
    "If": (0,), "Loop": (0, 1), "SplitToSequence": (1,), "SequenceAt": (1,), "SequenceInsert": (2,),
    "SequenceErase": (1,),
}
# Ops with no OpSpec that the importer rewrites into ops that have one, whose tests are selected
# (frontend/onnx_einsum, onnx_spectral, onnx_data_shapes, onnx_attention_ops, onnx_tfidf, onnx_preview).
REWRITTEN_SELECTED = frozenset({"Einsum", "DFT", "STFT", "MelWeightMatrix", "Compress", "NonZero", "Unique",
                                "NonMaxSuppression", "TensorScatter", "TfIdfVectorizer", "FlexAttention",
                                "LinearAttention"})
EXPANDED_MARK = "_expanded"
DEFAULT_DOMAINS = ("", "ai.onnx")


@functools.lru_cache(maxsize=1)
def all_node_tests() -> dict:
    """Every ONNX node test case by name (building them takes a few seconds: cached)."""
    import onnx.backend.test.loader as loader
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow casts on purpose
        return {t.name: t for t in loader.load_node_model_tests()}


def target_op(test, tests: dict) -> str | None:
    """The op a test is about: the single node's op, or for ``*_expanded`` tests the op of
    the matching unexpanded test; ``None`` for multi-node tests of no single op."""
    nodes = test.model.graph.node
    if EXPANDED_MARK in test.name:
        base = tests.get(test.name.split(EXPANDED_MARK)[0])
        return target_op(base, tests) if base is not None and EXPANDED_MARK not in base.name else None
    return nodes[0].op_type if len(nodes) == 1 else None


# Ops with no OpSpec that the importer folds away (control flow, sequences and optionals).
FOLDED_OPS = frozenset(CONTROL_FLOW) | SEQUENCE_OPS


def selected_tests() -> list[str]:
    """Tests about one of our ops or an op the importer folds, plus any test built only from our
    ops; sorted by name."""
    tests = all_node_tests()
    names = []
    for name, t in tests.items():
        ops = {n.op_type for n in t.model.graph.node}
        op = target_op(t, tests)
        if op in REGISTRY or op in REWRITTEN_SELECTED or op in FOLDED_OPS or (ops and ops <= set(REGISTRY)):
            names.append(name)
    return sorted(names)


def as_array(x) -> np.ndarray:
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


def model_opset(model: onnx.ModelProto) -> int:
    return max(o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS)


def in_supported_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model converted into opsets MIN_OPSET..MAX_OPSET by ONNX's version converter."""
    opset = model_opset(model)
    if MIN_OPSET <= opset <= MAX_OPSET:
        return model
    return onnx.version_converter.convert_version(model, min(max(opset, MIN_OPSET), MAX_OPSET))


def promoted_names(model: onnx.ModelProto) -> set[str]:
    """Graph inputs that are, or feed, shape-deciding operands (see the module docstring)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    inputs = {vi.name for vi in model.graph.input}
    todo = [n.input[i] for n in model.graph.node for i in SHAPE_OPERANDS.get(n.op_type, ())
            if i < len(n.input) and n.input[i]]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is not None and node.op_type != "Shape":
            todo.extend(i for i in node.input if i)
    return seen & inputs


def promote_shape_operands(model: onnx.ModelProto, inputs: list) -> tuple[onnx.ModelProto, dict]:
    """The model with shape-deciding graph inputs turned into initializers, and the feeds left."""
    promote = promoted_names(model)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    kept, feeds = [], {}
    for vi, x in zip(model.graph.input, inputs, strict=True):
        if vi.name in promote:
            m.graph.initializer.append(numpy_helper.from_array(as_array(x), vi.name))
        else:
            kept.append(vi)
            feeds[vi.name] = x if isinstance(x, list) or x is None else as_array(x)  # sequences, optionals as given
    del m.graph.input[:]
    m.graph.input.extend(kept)
    return m, feeds


@dataclass
class Mismatch:
    output: str
    detail: str


def run_case(name: str) -> list[Mismatch]:
    """Run every data set of one node test through opfuse; the mismatches (empty: passed).

    Raises what opfuse raises (``OpfuseError`` for an unsupported model) or what ONNX's version
    converter raises.
    """
    test = all_node_tests()[name]
    model = in_supported_opset(test.model)
    problems = []
    for inputs, expected in test.data_sets:
        m, feeds = promote_shape_operands(model, list(inputs))
        graph = import_model(m, input_shapes={k: v.shape for k, v in feeds.items() if isinstance(v, np.ndarray)})
        results = run(graph, feeds)
        for vi, want in zip(test.model.graph.output, expected, strict=True):
            want = as_array(want)
            got = results[vi.name]
            if got.shape != want.shape or got.dtype != want.dtype:
                problems.append(Mismatch(vi.name, f"got {got.dtype}{list(got.shape)}, "
                                                  f"expected {want.dtype}{list(want.shape)}"))
                continue
            if want.dtype.kind == "V" and want.dtype.itemsize <= 2:  # ml_dtypes floats (bfloat16): as floats
                got, want = got.astype(np.float32), want.astype(np.float32)
            try:
                if want.dtype.kind in "fc":
                    np.testing.assert_allclose(got, want, rtol=test.rtol, atol=test.atol, equal_nan=True)
                else:
                    np.testing.assert_array_equal(got, want)
            except AssertionError as e:
                problems.append(Mismatch(vi.name, str(e).strip().splitlines()[-1]))
    return problems
