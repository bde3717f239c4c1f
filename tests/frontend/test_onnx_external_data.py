"""External tensor data: read from the model folder, never from outside it."""
import os

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx_builders import assert_close, init, model, ort_run, vi
from opfuse.errors import ModelError, SecurityError
from opfuse.frontend.onnx import import_model, load_model, read_model, read_model_with_data
from opfuse.runtime.reference import run

W = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
B = np.arange(8, dtype=np.float32)


def _save_external(folder, location="weights.bin"):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    m = model(nodes, [vi("x", [2, 16])], [vi("y", [2, 8])], [init("w", W), init("b", B)])
    path = os.path.join(folder, "model.onnx")
    onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    return path


def _set_location(path, location):
    m = read_model(path)
    for t in m.graph.initializer:
        for kv in t.external_data:
            if kv.key == "location":
                kv.value = location
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def test_external_weights_are_loaded(tmp_path):
    path = _save_external(str(tmp_path))
    assert os.path.getsize(tmp_path / "weights.bin") >= W.nbytes + B.nbytes
    g = load_model(path)
    np.testing.assert_array_equal(g.values["w"].const, W)
    np.testing.assert_array_equal(g.values["b"].const, B)
    x = np.ones((2, 16), np.float32)
    np.testing.assert_allclose(run(g, {"x": x})["y"], x @ W + B, rtol=1e-5)


def test_external_data_in_a_subfolder(tmp_path):
    (tmp_path / "data").mkdir()
    path = _save_external(str(tmp_path), location="data/w.bin")
    assert load_model(path).values["w"].const.shape == (16, 8)


def test_relative_path_that_stays_inside_is_fine(tmp_path):
    (tmp_path / "sub").mkdir()
    path = _save_external(str(tmp_path))
    _set_location(path, "sub/../weights.bin")
    np.testing.assert_array_equal(load_model(path).values["w"].const, W)


def test_read_model_with_data_inlines_for_onnxruntime(tmp_path):
    path = _save_external(str(tmp_path))
    m = read_model_with_data(path)
    feeds = {"x": np.ones((2, 16), np.float32)}
    assert_close(ort_run(m, feeds), run(load_model(path), feeds))


def test_parent_directory_location_is_rejected(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _save_external(str(folder))
    os.replace(folder / "weights.bin", tmp_path / "evil.bin")  # the bytes exist, outside
    _set_location(path, "../evil.bin")
    with pytest.raises(SecurityError, match="outside the model folder"):
        load_model(path)


def test_absolute_location_is_rejected(tmp_path):
    path = _save_external(str(tmp_path))
    _set_location(path, str(tmp_path / "weights.bin"))  # even one that points inside the folder
    with pytest.raises(SecurityError, match="outside the model folder"):
        load_model(path)


@pytest.mark.parametrize("location", ["/etc/passwd", "\\\\server\\share\\w.bin", "C:\\w.bin",
                                      "..\\evil.bin", "a/../../evil.bin"])
def test_other_escapes_are_rejected(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _save_external(str(folder))
    _set_location(path, location)
    with pytest.raises(SecurityError):
        load_model(path)


def test_symlink_out_of_the_folder_is_rejected(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    path = _save_external(str(folder))
    os.replace(folder / "weights.bin", tmp_path / "outside.bin")
    os.symlink(tmp_path / "outside.bin", folder / "weights.bin")
    with pytest.raises(SecurityError, match="outside the model folder"):
        load_model(path)


def test_missing_external_file_is_a_model_error(tmp_path):
    path = _save_external(str(tmp_path))
    os.remove(tmp_path / "weights.bin")
    with pytest.raises(ModelError, match="does not exist") as e:
        load_model(path)
    assert not isinstance(e.value, SecurityError)


def test_truncated_external_file(tmp_path):
    path = _save_external(str(tmp_path))
    with open(tmp_path / "weights.bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ModelError, match="too short"):
        load_model(path)


def test_external_data_needs_a_folder_when_importing_a_proto(tmp_path):
    path = _save_external(str(tmp_path))
    m = read_model(path)
    with pytest.raises(ModelError, match="base_dir"):
        import_model(m)
    assert import_model(m, base_dir=str(tmp_path)).values["w"].const.shape == (16, 8)


def test_external_data_location_that_is_a_directory(tmp_path):
    (tmp_path / "d").mkdir()
    path = _save_external(str(tmp_path))
    _set_location(path, "d")
    with pytest.raises(ModelError, match="not a regular file"):
        load_model(path)
