"""examples/detect_faces.py: prior layout, SSD decoding, NMS, drawing and PPM I/O (numpy references by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parents[2] / "examples" / "detect_faces.py"
spec = importlib.util.spec_from_file_location("detect_faces", PATH)
df = importlib.util.module_from_spec(spec)
spec.loader.exec_module(df)


def test_priors_match_the_model_output_count_and_layout():
    p = df.priors()
    assert p.shape == (4420, 4)
    # first prior: centre of the top-left stride-8 cell, smallest box
    np.testing.assert_allclose(p[0], [0.5 / 40, 0.5 / 30, 10 / 320, 10 / 240], rtol=1e-6)
    # last prior: bottom-right stride-64 cell (5 x 3.75 cells), largest box clipped to the image
    np.testing.assert_allclose(p[-1], [4.5 / 5, min(3.5 / 3.75, 1.0), 256 / 320, 1.0], rtol=1e-6)


def test_decode_zero_offsets_gives_the_prior_and_scaling_works():
    prior = np.array([[0.5, 0.5, 0.2, 0.4]], np.float32)
    np.testing.assert_allclose(df.decode(np.zeros((1, 4), np.float32), prior), [[0.4, 0.3, 0.6, 0.7]], atol=1e-7)
    moved = df.decode(np.array([[1.0, 0.0, 5.0, 0.0]], np.float32), prior)  # +0.1*w in x, width * e^1
    np.testing.assert_allclose(moved, [[0.52 - 0.1 * np.e, 0.3, 0.52 + 0.1 * np.e, 0.7]], atol=1e-6)


def test_nms_keeps_the_best_of_overlapping_boxes():
    boxes = np.array([[0, 0, 1, 1], [0.05, 0, 1, 1], [2, 2, 3, 3]], np.float32)
    assert df.nms(boxes, np.array([0.8, 0.9, 0.5])) == [1, 2]


def test_detect_finds_a_planted_face():
    scores = np.zeros((1, 4420, 2), np.float32)
    scores[0, :, 0] = 1
    scores[0, 100] = (0.05, 0.95)
    faces = df.detect(scores, np.zeros((1, 4420, 4), np.float32))
    assert len(faces) == 1 and faces[0][0] == np.float32(0.95)
    np.testing.assert_allclose(faces[0][1], df.decode(np.zeros((1, 4)), df.priors()[100:101])[0], atol=1e-7)


def test_draw_and_ppm_round_trip(tmp_path):
    image = np.zeros((40, 60, 3), np.uint8)
    out = df.draw(image, [(0.9, np.array([0.25, 0.25, 0.75, 0.75]))])
    assert (out[10, 15:46] == (255, 0, 0)).all() and (out[20, 20] == 0).all()
    df.write_image(tmp_path / "x.ppm", out)
    np.testing.assert_array_equal(df.read_image(tmp_path / "x.ppm"), out)
    assert df.preprocess(out).shape == (1, 3, 240, 320)


def test_other_formats_without_pillow_give_a_clear_message(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pillow(name, *args, **kwargs):  # as on a machine without Pillow installed
        if name == "PIL" or name.startswith("PIL."):
            raise ModuleNotFoundError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pillow)
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    for call in (lambda: df.read_image(tmp_path / "photo.jpg"),
                 lambda: df.write_image(tmp_path / "boxes.png", np.zeros((2, 2, 3), np.uint8))):
        with pytest.raises(SystemExit) as exc:
            call()
        assert "without Pillow" in str(exc.value) and "pip install pillow" in str(exc.value)
