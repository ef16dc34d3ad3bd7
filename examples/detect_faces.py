"""Detect faces with the shipped UltraFace model over nnserve's KServe v2 API and draw the boxes.

    .venv/bin/python examples/detect_faces.py examples/photos/astronaut.png faces.png        # HTTP, ultraface_tnn
    .venv/bin/python examples/detect_faces.py photo.ppm faces.ppm --model ultraface_pnnx --url 127.0.0.1:8000

Reads and writes PNG (8-bit, not interlaced) and binary PPM with numpy and the standard library alone; other image
formats (JPEG, ...) need Pillow. Prints one line per face with its box in the photo's pixels. The model returns
per-prior scores and SSD offsets; the priors, decoding and NMS below follow the UltraFace reference implementation
(github.com/Linzaer/Ultra-Light-Fast-Generic-Face-Detector-1MB, MIT).
"""

from __future__ import annotations

import argparse
import math
import struct
import zlib
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
    """A one-pixel frame around each face, at the pixel box that is printed."""
    out = image.copy()
    for _, box in faces:
        a, c, b, d = pixel_box(box, out)
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
    """HxWx3 uint8 RGB."""
    data = path.read_bytes()
    if data[:2] == b"P6":
        return read_ppm(data, path)
    if data[:8] == PNG_SIGNATURE:
        return read_png(data, path)
    return np.asarray(pillow(path).open(path).convert("RGB"))


def read_ppm(data: bytes, path: Path) -> np.ndarray:
    fields, pos = [], 2
    while len(fields) < 3:  # width, height, maxval, separated by whitespace; a '#' starts a comment
        while data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.index(b"\n", pos)
            continue
        start = pos
        while not data[pos:pos + 1].isspace():
            pos += 1
        fields.append(int(data[start:pos]))
    w, h, maxval = fields
    if maxval != 255:
        raise SystemExit(f"{path}: a PPM with maxval {maxval} (only 8-bit, maxval 255, is handled)")
    return np.frombuffer(data, np.uint8, w * h * 3, pos + 1).reshape(h, w, 3)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # colour type -> samples per pixel: gray, RGB, gray + alpha, RGBA


def read_png(data: bytes, path: Path) -> np.ndarray:
    """8-bit, non-interlaced gray/RGB(A) PNG -> HxWx3 RGB (alpha dropped); other PNGs need Pillow."""
    header, compressed, pos = None, [], len(PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length  # length, type, body, CRC
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            compressed.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise SystemExit(f"{path}: not a PNG file (no IHDR chunk)")
    w, h, depth, colour, _, _, interlace = header
    channels = PNG_CHANNELS.get(colour)
    if depth != 8 or channels is None or interlace:
        return np.asarray(pillow(path).open(path).convert("RGB"))
    pixels = unfilter(zlib.decompress(b"".join(compressed)), h, w * channels, channels)
    image = np.frombuffer(pixels, np.uint8).reshape(h, w, channels)
    return np.repeat(image[..., :1], 3, axis=2) if channels <= 2 else image[..., :3].copy()


def unfilter(raw: bytes, h: int, stride: int, bpp: int) -> bytearray:
    """Undo PNG's per-row filters (None, Sub, Up, Average, Paeth; each row starts with its filter type)."""
    out, prev = bytearray(h * stride), bytearray(stride)
    for y in range(h):
        kind = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0  # left, up, up-left (already reconstructed)
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + a) & 255
            elif kind == 2:
                row[i] = (row[i] + b) & 255
            elif kind == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            elif kind != 0:
                raise ValueError(f"PNG row {y}: unknown filter type {kind}")
        out[y * stride:(y + 1) * stride] = row
        prev = row
    return out


def write_image(path: Path, image: np.ndarray) -> None:
    image = np.ascontiguousarray(image, np.uint8)
    h, w = image.shape[:2]
    if path.suffix.lower() == ".ppm":
        path.write_bytes(f"P6\n{w} {h}\n255\n".encode() + image.tobytes())
    elif path.suffix.lower() == ".png":
        rows = np.concatenate([np.zeros((h, 1), np.uint8), image.reshape(h, w * 3)], axis=1)  # filter 0 per row
        chunks = [(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)), (b"IDAT", zlib.compress(rows.tobytes(), 9)),
                  (b"IEND", b"")]
        path.write_bytes(PNG_SIGNATURE + b"".join(
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
            for kind, body in chunks))
    else:
        pillow(path).fromarray(image).save(path)


def pillow(path: Path):  # noqa: ANN201 - PIL.Image, imported only for formats read or written through it
    try:
        from PIL import Image
    except ImportError:
        raise SystemExit(f"{path}: only PNG (8-bit) and binary PPM (P6) are handled without Pillow; install it "
                         "(pip install pillow) or convert the image to .png") from None
    return Image


def pixel_box(box: np.ndarray, image: np.ndarray) -> list[int]:
    """Relative (x1, y1, x2, y2) -> pixels of `image`, clipped to it."""
    h, w = image.shape[:2]
    return np.clip(np.round(box * np.array([w, h, w, h])), 0, [w - 1, h - 1, w - 1, h - 1]).astype(int).tolist()


def infer(url: str, model: str, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scores, offsets) from the server; a server that cannot be reached or refuses gives a one-line error."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    name_in, name_scores, name_boxes = TENSORS[model]
    inp = httpclient.InferInput(name_in, [1, 3, HEIGHT, WIDTH], "FP32")
    inp.set_data_from_numpy(preprocess(image), binary_data=True)
    client = httpclient.InferenceServerClient(url)
    try:
        result = client.infer(model, [inp])
    except (InferenceServerException, OSError) as exc:
        raise SystemExit(f"inference on {url} (model {model}) failed: {exc}") from None
    finally:
        client.close()
    return result.as_numpy(name_scores), result.as_numpy(name_boxes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--url", default="127.0.0.1:8000", help="nnserve HTTP address (default: %(default)s)")
    parser.add_argument("--model", default="ultraface_tnn", choices=sorted(TENSORS), help="(default: %(default)s)")
    parser.add_argument("--threshold", type=float, default=0.7, help="face score threshold (default: %(default)s)")
    args = parser.parse_args(argv)

    image = read_image(args.image)
    faces = detect(*infer(args.url, args.model, image), args.threshold)
    for score, box in faces:
        print(f"face {score:.3f} at {pixel_box(box, image)}")
    write_image(args.output, draw(image, faces))
    print(f"{len(faces)} face(s); boxes drawn on {args.output}")


if __name__ == "__main__":
    main()
