"""`nnserve quantize` accuracy a user can see: classifiers keep their logits (cosine >= 0.99 against PyTorch's float
outputs on inputs calibration never saw) and the bundled UltraFace finds the same face on the committed photo
(IoU >= 0.9) as the float model, decoded as examples/detect_faces.py does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.quantize import QuantizeOptions, quantize
from engine.quantize.data import Preprocess, load_samples
from engine.quantize.images import read_image
from engine.quantize.report import cosine
from engine.runtime.model import spec_of

REPO = Path(__file__).resolve().parents[3]
ULTRAFACE = REPO / "model_repository" / "ultraface_tnn" / "1" / "model.tnnproto"
PHOTO = REPO / "examples" / "photos" / "astronaut.png"
pytestmark = pytest.mark.slow


def _detect_faces_module():
    spec = importlib.util.spec_from_file_location("detect_faces", REPO / "examples" / "detect_faces.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _random_samples(shape, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"in0": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet"])
@pytest.mark.parametrize("method", ["minmax", "kl"])
def test_classifier_logits_keep_cosine_099(tmp_path, load_fixture, name, method):
    fx = load_fixture(name)
    shape = tuple(fx.meta["inputs"][0]["shape"])
    result = quantize(fx.param, _random_samples(shape, 8, 1), tmp_path / "q", QuantizeOptions(method=method))
    assert result.counts.get("TnnQConv", 0) >= 10 and result.counts.get("TnnQInnerProduct") == 1
    int8 = engine.load(result.proto)
    assert "Conv" not in int8.op_counts() and "Gemm" not in int8.op_counts()
    got = int8.instance().run(fx.inputs)["out0"]
    want = fx.expected["out0"]  # PyTorch's float output on the fixture's own input (not a calibration input)
    assert cosine(got, want) >= 0.99, f"{name}/{method}: cosine {cosine(got, want):.5f}"
    assert result.outputs[0].cosine >= 0.99  # the report's own comparison agrees


def _calibration_images(folder: Path) -> None:
    """16 variants of the photo as PPM: the whole frame shifted by up to 8 pixels and crops keeping three quarters
    of each side, flipped and lit differently; none is the photo itself."""
    img = read_image(PHOTO)
    h, w = img.shape[:2]
    rng = np.random.default_rng(0)
    folder.mkdir()
    for k in range(16):
        if k < 8:
            dy, dx = rng.integers(-8, 9, 2)
            a = np.pad(img, ((8, 8), (8, 8), (0, 0)), mode="edge")[8 + dy:8 + dy + h, 8 + dx:8 + dx + w]
        else:
            y0, x0 = rng.integers(0, h // 4), rng.integers(0, w // 4)
            a = img[y0:h - rng.integers(0, h // 4), x0:w - rng.integers(0, w // 4)]
        a = np.clip(a.astype(np.float32) * rng.uniform(0.8, 1.2), 0, 255).astype(np.uint8)
        if k % 2:
            a = a[:, ::-1]
        a = np.ascontiguousarray(a)
        (folder / f"c{k:02d}.ppm").write_bytes(b"P6 %d %d 255\n" % (a.shape[1], a.shape[0]) + a.tobytes())


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    lo, hi = np.maximum(a[:2], b[:2]), np.minimum(a[2:], b[2:])
    inter = float(np.prod(np.clip(hi - lo, 0, None)))
    return inter / (float(np.prod(a[2:] - a[:2])) + float(np.prod(b[2:] - b[:2])) - inter)


def _faces(model_path: Path, df) -> list:
    x = df.preprocess(df.read_image(PHOTO))
    out = engine.load(model_path).instance().run({"input": x})
    return df.detect(out["scores"], out["boxes"])


def test_ultraface_int8_finds_the_same_face(tmp_path):
    df = _detect_faces_module()
    _calibration_images(tmp_path / "calib")
    spec = [spec_of(v) for v in engine.load(ULTRAFACE).graph.inputs]
    # the model's own preprocessing, as detect_faces.py feeds it: (pixel - 127) / 128
    samples = load_samples(tmp_path / "calib", spec, Preprocess((127.0,), (1 / 128,)))
    result = quantize(ULTRAFACE, samples, tmp_path / "ultraface_int8")
    assert result.counts["TnnQConv"] == 42
    want, got = _faces(ULTRAFACE, df), _faces(result.proto, df)
    assert len(want) == len(got) == 1
    for (_, a), (score, b) in zip(want, got, strict=True):
        assert score > 0.7 and _iou(a, b) >= 0.9, (a, b)
