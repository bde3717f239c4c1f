"""``opfuse run --backend c --compare reference`` on a QDQ model whose fused build runs integer kernels: the oracle is
the reference of the graph the build runs (the integer arithmetic of ``rules/integer_ops``, which the C must equal),
and the float QDQ model's outputs, which that arithmetic may miss by one quantization step at a rounding tie, are
reported beside it. Before, a correct fused build of mobilenet_v1_025_96 quantized by opfuse printed MISMATCH and
exited 1."""
import json

import numpy as np
import onnx

from opfuse.cli import main
from opfuse.ir.graph import Graph
from opfuse.testing import fuzz_cases as fc
from opfuse.testing.fuzz import _model_bytes

TIE_SEED = 268  # one of its 18432 outputs lies at a tie the float and the integer arithmetic round apart


def _qdq_conv(seed: int, cin: int = 3, cout: int = 8, hw: int = 48):
    rng = np.random.default_rng(seed)
    g = Graph("qconv")
    x = g.add_input("x", (1, cin, hw, hw), np.float32)
    xd = fc._dequantize(g, fc._quantize(g, x, 0.0107, 0, np.uint8), 0.0107, 0)
    ws = rng.uniform(0.002, 0.01, cout).astype(np.float32).reshape(cout, 1, 1, 1)
    wd = fc._dequantize(g, g.add_const("w_q", rng.integers(-127, 128, (cout, cin, 3, 3)).astype(np.int8)), ws,
                        np.zeros((1, 1, 1, 1), np.float32))
    y = fc._add(g, "Conv", [xd, wd], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    g.outputs.append(fc._quantize(g, y, 0.4, 0, np.int8, "y"))
    feeds = {"x": rng.uniform(0, 2.7, (1, cin, hw, hw)).astype(np.float32)}
    return onnx.load_from_string(_model_bytes(g)), feeds


def _files(tmp_path, seed=TIE_SEED):
    m, feeds = _qdq_conv(seed)
    onnx.save(m, tmp_path / "q.onnx")
    np.savez(tmp_path / "x.npz", **feeds)
    return str(tmp_path / "q.onnx"), str(tmp_path / "x.npz")


def test_the_fused_integer_build_is_compared_with_its_own_arithmetic(tmp_path, capsys):
    model, inputs = _files(tmp_path)
    assert main(["run", model, "--backend", "c", "--inputs", inputs, "--compare", "reference"]) == 0
    out = capsys.readouterr().out
    assert "the fused build's integer arithmetic (integer_conv: rounding within one quantization step" in out
    assert "compare reference y: max abs error 0," in out
    assert "against the float QDQ model y: max abs error 1," in out  # the tie, one int8 step
    assert "MISMATCH" not in out
    assert main(["run", model, "--backend", "c", "--inputs", inputs, "--compare", "reference", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["compare"]
    assert result["integer_rewrites"] == ["integer_conv"]
    assert result["outputs"]["y"]["ok"] and result["outputs"]["y"]["max_abs_error"] == 0
    assert result["outputs"]["y"]["float_qdq"]["max_abs_error"] == 1


def test_the_unfused_build_and_the_reference_backend_compare_with_the_float_model(tmp_path, capsys):
    model, inputs = _files(tmp_path)
    assert main(["run", model, "--backend", "c", "--no-fuse", "--inputs", inputs, "--compare", "reference"]) == 0
    out = capsys.readouterr().out
    assert "compare reference y: max abs error 0," in out and "integer arithmetic" not in out
    assert main(["run", model, "--inputs", inputs, "--compare", "reference"]) == 0
    assert "integer arithmetic" not in capsys.readouterr().out


def test_a_wrong_integer_kernel_is_still_a_mismatch(tmp_path, capsys, monkeypatch):
    """The build's own arithmetic as oracle does not excuse the C: a fused build one step off everywhere (a
    requantization rounding wrongly, say) is a MISMATCH and exit status 1."""
    from opfuse.runtime import native
    model, inputs = _files(tmp_path)
    real_run = native.CompiledModel.run

    def off_by_one(self, feeds, **kwargs):
        return {k: (v + np.ones_like(v)) for k, v in real_run(self, feeds, **kwargs).items()}
    monkeypatch.setattr(native.CompiledModel, "run", off_by_one)
    assert main(["run", model, "--backend", "c", "--inputs", inputs, "--compare", "reference"]) == 1
    assert "compare reference y: max abs error 1, max rel error" in capsys.readouterr().out
