"""Models built and exported by PyTorch, run the way a user brings them (optional: skipped without
torch; `pip install -e '.[torch]'`).

* A BERT from a ``transformers``-style config with random weights (``transformers`` when installed,
  else skipped), exported by the TorchScript exporter at opsets 13 and 17 and by the dynamo
  exporter (its own opset, 18), with symbolic batch and sequence dimensions.
* A CNN with BatchNormalization kept in the graph (``do_constant_folding=False``, eval mode):
  residual block, depthwise and grouped convolutions, SiLU/HardSwish, pooling, Linear, at opsets
  13 and 17.

Each model is compiled through the whole pipeline and run in C fused and unfused; outputs must
match onnxruntime within the issue's rtol 1e-3 / atol 1e-4, and the fused build must have fused
groups named by their rules."""
from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest

import opfuse
from opfuse.compiler import SpecializingModel

torch = pytest.importorskip("torch", reason="torch is an optional extra (pip install -e '.[torch]')")
ort = pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-3, 1e-4


def _export(module, args, names, opset, *, dynamo=False, fold=True, dynamic_axes=None) -> onnx.ModelProto:
    buf = io.BytesIO()
    module.eval()  # the TorchScript exporter can leave a module in training mode after it ran
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {"dynamo": dynamo, "do_constant_folding": fold, "input_names": names, "opset_version": opset}
        if dynamo:
            kwargs.pop("do_constant_folding")
            kwargs["verbose"] = False
        elif dynamic_axes:
            kwargs["dynamic_axes"] = dynamic_axes
        torch.onnx.export(module, args, buf, **kwargs)
    return onnx.load_from_string(buf.getvalue())


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def _check_fused_and_unfused(model, feeds, input_shapes=None) -> dict:
    theirs = _onnxruntime(model, feeds)
    reports = {}
    for fuse in (True, False):
        compiled = opfuse.compile(model, fuse=fuse, input_shapes=input_shapes)
        ours = list(compiled.run(feeds).values())
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"fuse={fuse}")
        reports[fuse] = compiled.report
    fused, unfused = reports[True], reports[False]
    assert unfused["kernels_after"] == unfused["kernels_before"]
    assert fused["kernels_after"] < unfused["kernels_after"]
    groups = [g for g in fused["groups"] if len(g["nodes"]) > 1]
    assert groups and all(g["rule"] for g in groups)
    return fused


# BERT ------------------------------------------------------------------------------------------
BATCH, SEQ, VOCAB = 2, 16, 120


@pytest.fixture(scope="module")
def bert():
    transformers = pytest.importorskip("transformers", reason="transformers is an optional extra")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, max_position_embeddings=64, hidden_act="gelu")
    config._attn_implementation = "eager"  # sdpa has no ONNX export below opset 14
    model = transformers.BertModel(config).eval()

    class Bert(torch.nn.Module):  # positional inputs, tuple outputs: what an exporter needs
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
            return out[0], out[1]
    return Bert(model)


def _bert_feeds(batch=BATCH, seq=SEQ, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[-1, seq * 2 // 3:] = 0  # a padded sequence: the mask reaches the attention scores
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("opset,dynamo", [(13, False), (17, False), (18, True)], ids=["ts13", "ts17", "dynamo"])
def test_bert_from_a_config(bert, opset, dynamo):
    feeds = _bert_feeds()
    args = (torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
    model = _export(bert, args, ["input_ids", "attention_mask"], opset, dynamo=dynamo)
    if not dynamo:
        assert model.opset_import[0].version == opset
    fused = _check_fused_and_unfused(model, feeds)
    # the attention, LayerNorm and GELU of both layers end up in few kernels
    assert fused["kernels_after"] * 2 <= fused["kernels_before"]


def test_bert_with_symbolic_batch_and_sequence(bert):
    """Exported with dynamic axes: compiled without shapes, each run's (batch, seq) specialises it."""
    feeds = _bert_feeds()
    args = (torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    model = _export(bert, args, ["input_ids", "attention_mask"], 17, dynamic_axes=axes)
    assert model.graph.input[0].type.tensor_type.shape.dim[1].dim_param == "sequence"
    compiled = opfuse.compile(model)
    assert isinstance(compiled, SpecializingModel)
    for batch, seq in [(2, 16), (1, 24), (2, 16)]:
        f = _bert_feeds(batch, seq, seed=seq)
        ours = list(compiled.run(f).values())
        for a, b in zip(ours, _onnxruntime(model, f), strict=True):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"{batch}x{seq}")
    assert compiled.compiles == 2


# A CNN with BatchNormalization kept ------------------------------------------------------------
def _cnn():
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.act = nn.SiLU()

        def forward(self, x):
            y = self.act(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.dw(y)) + x)

    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.Hardswish(),
        Block(16),
        nn.Conv2d(16, 32, 1, groups=2, bias=True), nn.BatchNorm2d(32), nn.ReLU6(),
        nn.MaxPool2d(2), Block(32),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    torch.manual_seed(1)
    for m in net.modules():  # non-trivial BN statistics, or BN would be an identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return net.eval()


@pytest.mark.parametrize("opset", [13, 17])
def test_cnn_with_batchnorm_kept(opset):
    x = np.random.default_rng(2).standard_normal((2, 3, 32, 32), dtype=np.float32)
    model = _export(_cnn(), (torch.from_numpy(x),), ["image"], opset, fold=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("BatchNormalization") == 6  # kept by the exporter, folded by opfuse
    fused = _check_fused_and_unfused(model, {"image": x})
    bn_groups = [g for g in fused["groups"] if any("BatchNormalization" in op for op in g.get("ops", []))]
    assert fused["kernels_after"] <= fused["kernels_before"] - 6 or bn_groups
