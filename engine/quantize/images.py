"""Images for calibration: 8-bit PNG and binary PPM/PGM read with numpy and zlib alone, other formats through
Pillow when it is installed; bilinear resizing (half-pixel centres, as torch's align_corners=False)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from engine.errors import EngineError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # colour type -> samples per pixel: gray, RGB, gray + alpha, RGBA
SUFFIXES = {".png", ".ppm", ".pgm", ".jpg", ".jpeg", ".bmp"}


def read_image(path: Path) -> np.ndarray:
    """HxWx3 uint8 RGB."""
    data = path.read_bytes()
    if data[:2] in (b"P5", b"P6"):
        return _read_pnm(data, path)
    if data[:8] == PNG_SIGNATURE:
        try:
            return _read_png(data, path)
        except _NeedsPillow:
            pass
    return _read_with_pillow(path)


class _NeedsPillow(Exception):
    pass


def _read_with_pillow(path: Path) -> np.ndarray:
    try:
        from PIL import Image  # optional: only for formats numpy alone does not read
    except ImportError:
        raise EngineError(f"{path}: only 8-bit PNG and binary PPM/PGM are read without Pillow; "
                          f"`pip install pillow` for other image formats") from None
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def _read_pnm(data: bytes, path: Path) -> np.ndarray:
    fields, pos = [], 2
    while len(fields) < 3:  # width, height, maxval, separated by whitespace; '#' starts a comment
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
        raise EngineError(f"{path}: PPM/PGM with maxval {maxval}; only 8-bit (255) is read")
    c = 3 if data[:2] == b"P6" else 1
    img = np.frombuffer(data, np.uint8, w * h * c, pos + 1).reshape(h, w, c)
    return np.repeat(img, 3, axis=2) if c == 1 else img


def _read_png(data: bytes, path: Path) -> np.ndarray:
    header, compressed, pos = None, [], len(PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            compressed.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise EngineError(f"{path}: PNG without a header")
    w, h, depth, colour, _, _, interlace = header
    if depth != 8 or interlace or colour not in PNG_CHANNELS:
        raise _NeedsPillow()
    bpp = PNG_CHANNELS[colour]
    raw = zlib.decompress(b"".join(compressed))
    img = np.frombuffer(_unfilter(raw, h, w * bpp, bpp), np.uint8).reshape(h, w, bpp)
    if bpp < 3:
        img = np.repeat(img[:, :, :1], 3, axis=2)
    return np.ascontiguousarray(img[:, :, :3])


def _unfilter(raw: bytes, h: int, stride: int, bpp: int) -> bytearray:
    out, prev = bytearray(h * stride), bytearray(stride)
    for y in range(h):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return out


def resize_bilinear(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """HxWxC -> size[0] x size[1] x C float32."""
    h, w = img.shape[:2]
    oh, ow = size
    ys = np.clip((np.arange(oh) + 0.5) * h / oh - 0.5, 0, h - 1)
    xs = np.clip((np.arange(ow) + 0.5) * w / ow - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    f = img.astype(np.float32)
    top = f[y0][:, x0] * (1 - fx) + f[y0][:, x1] * fx
    bottom = f[y1][:, x0] * (1 - fx) + f[y1][:, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)
