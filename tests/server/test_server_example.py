"""examples/: every example runs end to end against a real server on a real photo (one face found, its box on the
face as marked by hand); plus detect_faces.py's parts: prior layout, SSD decoding, NMS, drawing, PNG and PPM I/O
(numpy references by hand)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serverproc import ServerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
PATH = EXAMPLES / "detect_faces.py"
PHOTO = EXAMPLES / "photos" / "astronaut.png"
# examples/photos/README.md: the face marked by hand (x1, y1, x2, y2 in the photo's pixels), and the hash of the
# photo's pixels as Pillow decoded them when the file was made (an independent PNG decoder).
FACE = (88, 36, 137, 92)
PHOTO_SHA256 = "17aafb1aea244905ad6cfa5ba69c18cc726c9cd663772e7b35f0d11f7c1fa122"
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
                 lambda: df.write_image(tmp_path / "boxes.jpg", np.zeros((2, 2, 3), np.uint8))):
        with pytest.raises(SystemExit) as exc:
            call()
        assert "without Pillow" in str(exc.value) and "pip install pillow" in str(exc.value)


# ---- PNG I/O against an independent encoder: every row filter of the PNG spec, written here in numpy ----------
def paeth(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def encode_png(image: np.ndarray, filters: list[int]) -> bytes:
    """image (h, w, channels) uint8 -> PNG bytes, row y filtered with filters[y % len(filters)]."""
    h, w, ch = image.shape
    x = image.reshape(h, w * ch).astype(np.int32)
    up = np.vstack([np.zeros((1, w * ch), np.int32), x[:-1]])
    left = np.hstack([np.zeros((h, ch), np.int32), x[:, :-ch]])
    up_left = np.hstack([np.zeros((h, ch), np.int32), up[:, :-ch]])
    predictors = {0: 0 * x, 1: left, 2: up, 3: (left + up) // 2, 4: paeth(left, up, up_left)}
    kinds = [filters[y % len(filters)] for y in range(h)]
    rows = np.stack([(x[y] - predictors[k][y]) % 256 for y, k in enumerate(kinds)]).astype(np.uint8)
    raw = np.hstack([np.array(kinds, np.uint8)[:, None], rows]).tobytes()
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[ch]

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    header = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, colour, 0, 0, 0])
    return df.PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_png_reader_undoes_every_row_filter(tmp_path, channels):
    rng = np.random.default_rng(channels)
    image = rng.integers(0, 256, (7, 9, channels), dtype=np.uint8)
    path = tmp_path / "x.png"
    path.write_bytes(encode_png(image, [0, 1, 2, 3, 4, 4, 3]))
    rgb = np.repeat(image[..., :1], 3, axis=2) if channels <= 2 else image[..., :3]
    np.testing.assert_array_equal(df.read_image(path), rgb)


def test_png_writer_round_trips_and_the_committed_photo_decodes_as_pillow_did(tmp_path):
    photo = df.read_image(PHOTO)
    assert photo.shape == (192, 256, 3)
    assert hashlib.sha256(photo.tobytes()).hexdigest() == PHOTO_SHA256
    df.write_image(tmp_path / "copy.png", photo)
    np.testing.assert_array_equal(df.read_image(tmp_path / "copy.png"), photo)
    assert PHOTO.stat().st_size < 120_000


def test_ppm_header_comments_and_wide_samples(tmp_path):
    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    (tmp_path / "c.ppm").write_bytes(b"P6\n# made by hand\n3 2\n255\n" + pixels.tobytes())
    np.testing.assert_array_equal(df.read_image(tmp_path / "c.ppm"), pixels)
    (tmp_path / "w.ppm").write_bytes(b"P6 3 2 65535\n" + bytes(36))
    with pytest.raises(SystemExit, match="maxval 65535"):
        df.read_image(tmp_path / "w.ppm")


# ---- every example, end to end, against `nnserve serve` on the bundled repository -------------------------------
@pytest.fixture(scope="module")
def bundled() -> Iterator[ServerProcess]:
    srv = ServerProcess(REPO_ROOT / "model_repository")
    yield srv
    assert srv.stop() == 0, srv.log_text


def iou(a: tuple | list, b: tuple | list) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0) * max(h, 0)
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    return inter / (area - inter)


def run_detect_faces(server: ServerProcess, tmp_path: Path, model: str, output: str) -> None:
    out = tmp_path / output
    proc = subprocess.run([sys.executable, str(PATH), str(PHOTO), str(out), "--url", server.http_url,
                           "--model", model], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    faces = re.findall(r"^face ([\d.]+) at \[(\d+), (\d+), (\d+), (\d+)\]$", proc.stdout, re.M)
    assert len(faces) == 1, f"expected exactly one face:\n{proc.stdout}"
    score, *box = faces[0]
    box = [int(v) for v in box]
    assert float(score) > 0.9
    assert iou(box, FACE) > 0.6, f"{box} is not on the face {FACE}"
    centre = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    assert FACE[0] < centre[0] < FACE[2] and FACE[1] < centre[1] < FACE[3]
    drawn = df.read_image(out)
    x1, y1, x2, y2 = box
    assert drawn.shape == (192, 256, 3)
    red = (drawn == (255, 0, 0)).all(axis=2)
    assert red[y1, x1:x2 + 1].all() and red[y2, x1:x2 + 1].all() and red[y1:y2 + 1, x1].all()
    assert red.sum() == (x2 - x1 + 1) * 2 + (y2 - y1 - 1) * 2, "only the box is drawn"


# An example added to examples/ must be added here: make test runs each against the real server.
END_TO_END = {
    "detect_faces.py": [lambda srv, tmp: run_detect_faces(srv, tmp, "ultraface_tnn", "faces.png"),
                        lambda srv, tmp: run_detect_faces(srv, tmp, "ultraface_pnnx", "faces.ppm")],
}


def test_every_example_has_an_end_to_end_run():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(END_TO_END)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(END_TO_END))
def test_example_runs_end_to_end_on_a_real_photo(bundled, tmp_path, name):
    for run in END_TO_END[name]:
        run(bundled, tmp_path)


def test_unreachable_server_gives_a_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, str(PATH), str(PHOTO), str(tmp_path / "o.png"), "--url", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "inference on 127.0.0.1:1 (model ultraface_tnn) failed" in proc.stderr
