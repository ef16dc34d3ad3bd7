"""Detect faces with the shipped UltraFace model over nnserve's KServe v2 API and draw the boxes.

    .venv/bin/python examples/detect_faces.py photo.jpg boxes.png                 # HTTP, ultraface_tnn
    .venv/bin/python examples/detect_faces.py photo.ppm boxes.ppm --model ultraface_pnnx --url 127.0.0.1:8000

Reads and writes binary PPM with numpy alone; other image formats need Pillow. The model returns per-prior
scores and SSD offsets; the priors, decoding and NMS below follow the UltraFace reference implementation
(github.com/Linzaer/Ultra-Light-Fast-Generic-Face-Detector-1MB, MIT).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

WIDTH, HEIGHT = 320, 240
STRIDES = (8, 16, 32, 64)
MIN_BOXES = ((10, 16, 24), (32, 48), (64, 96), (128, 192, 256))
CENTER_VARIANCE, SIZE_VARIANCE = 0.1, 0.2
TENSORS = {"ultraface_tnn": ("input", "scores", "boxes"), "ultraface_pnnx": ("in0", "out0", "out1")}


def priors() -> np.ndarray:
    """(4420, 4) prior boxes as (cx, cy, w, h), relative to the image, in the model's output order."""
    out = []
    for stride, sizes in zip(STRIDES, MIN_BOXES, strict=True):
        scale_w, scale_h = WIDTH / stride, HEIGHT / stride
        for j in range(math.ceil(scale_h)):
            for i in range(math.ceil(scale_w)):
                for size in sizes:
                    out.append(((i + 0.5) / scale_w, (j + 0.5) / scale_h, size / WIDTH, size / HEIGHT))
    return np.clip(np.array(out, np.float32), 0.0, 1.0)


def decode(offsets: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """SSD offsets -> corner boxes (x1, y1, x2, y2), relative to the image."""
    centre = offsets[:, :2] * CENTER_VARIANCE * prior[:, 2:] + prior[:, :2]
    size = np.exp(offsets[:, 2:] * SIZE_VARIANCE) * prior[:, 2:]
    return np.concatenate([centre - size / 2, centre + size / 2], axis=1)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_limit: float = 0.3) -> list[int]:
    order, keep = list(np.argsort(-scores)), []
    while order:
        best = order.pop(0)
        keep.append(best)
        rest = np.array(order, dtype=int)
        if not rest.size:
            break
        lo = np.maximum(boxes[best, :2], boxes[rest, :2])
        hi = np.minimum(boxes[best, 2:], boxes[rest, 2:])
        inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
        area = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
        iou = inter / (area[best] + area[rest] - inter + 1e-9)
        order = [int(r) for r, v in zip(rest, iou, strict=True) if v <= iou_limit]
    return keep


def detect(scores: np.ndarray, offsets: np.ndarray, threshold: float = 0.7) -> list[tuple[float, np.ndarray]]:
    """[(score, (x1, y1, x2, y2))] of the faces, relative coordinates."""
    face = scores.reshape(-1, 2)[:, 1]
    boxes = decode(offsets.reshape(-1, 4), priors())
    hits = np.flatnonzero(face > threshold)
    return [(float(face[hits[k]]), boxes[hits[k]]) for k in nms(boxes[hits], face[hits])]


def draw(image: np.ndarray, faces: list[tuple[float, np.ndarray]], colour=(255, 0, 0)) -> np.ndarray:
    out = image.copy()
    h, w = out.shape[:2]
    for _, (x1, y1, x2, y2) in faces:
        a, b = int(np.clip(x1 * w, 0, w - 1)), int(np.clip(x2 * w, 0, w - 1))
        c, d = int(np.clip(y1 * h, 0, h - 1)), int(np.clip(y2 * h, 0, h - 1))
        out[c:d + 1, [a, b]] = colour
        out[[c, d], a:b + 1] = colour
    return out


def preprocess(image: np.ndarray) -> np.ndarray:
    """HxWx3 uint8 RGB -> 1x3x240x320 float32, nearest-neighbour resize, (pixel - 127) / 128."""
    h, w = image.shape[:2]
    rows = (np.arange(HEIGHT) * h / HEIGHT).astype(int)
    cols = (np.arange(WIDTH) * w / WIDTH).astype(int)
    small = image[rows][:, cols].astype(np.float32)
    return ((small - 127.0) / 128.0).transpose(2, 0, 1)[None].copy()


def read_image(path: Path) -> np.ndarray:
    data = path.read_bytes()
    if data[:2] == b"P6":
        fields, pos = [], 2
        while len(fields) < 3:  # width, height, maxval, separated by whitespace
            while data[pos:pos + 1].isspace():
                pos += 1
            start = pos
            while not data[pos:pos + 1].isspace():
                pos += 1
            fields.append(int(data[start:pos]))
        w, h, _ = fields
        return np.frombuffer(data, np.uint8, w * h * 3, pos + 1).reshape(h, w, 3)
    return np.asarray(pillow(path).open(path).convert("RGB"))


def write_image(path: Path, image: np.ndarray) -> None:
    if path.suffix.lower() == ".ppm":
        h, w = image.shape[:2]
        path.write_bytes(f"P6\n{w} {h}\n255\n".encode() + image.astype(np.uint8).tobytes())
        return
    pillow(path).fromarray(image.astype(np.uint8)).save(path)


def pillow(path: Path):  # noqa: ANN201 - PIL.Image, imported only when a non-PPM file is used
    try:
        from PIL import Image
    except ImportError:
        raise SystemExit(f"{path}: only binary PPM (.ppm, P6) is handled without Pillow; install it "
                         "(pip install pillow) or convert the image to .ppm") from None
    return Image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--url", default="127.0.0.1:8000", help="nnserve HTTP address")
    parser.add_argument("--model", default="ultraface_tnn", choices=sorted(TENSORS))
    parser.add_argument("--threshold", type=float, default=0.7)
    args = parser.parse_args()

    import tritonclient.http as httpclient

    image = read_image(args.image)
    name_in, name_scores, name_boxes = TENSORS[args.model]
    inp = httpclient.InferInput(name_in, [1, 3, HEIGHT, WIDTH], "FP32")
    inp.set_data_from_numpy(preprocess(image), binary_data=True)
    result = httpclient.InferenceServerClient(args.url).infer(args.model, [inp])
    faces = detect(result.as_numpy(name_scores), result.as_numpy(name_boxes), args.threshold)
    for score, box in faces:
        print(f"face {score:.3f} at {np.round(box * [image.shape[1], image.shape[0]] * 2).astype(int).tolist()}")
    write_image(args.output, draw(image, faces))


if __name__ == "__main__":
    main()
