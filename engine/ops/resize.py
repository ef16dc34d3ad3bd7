"""Resize (nearest / nearest_exact / bilinear / bicubic, NCHW), PixelShuffle, PixelUnshuffle and ChannelShuffle.

Resize follows torch's CPU `F.interpolate` to the bit where it can: source coordinates are computed in float32
as torch does, nearest is floor(dst * scale) (with torch's same-size and 2x shortcuts), nearest_exact (torch's
"nearest-exact", pixel centres) is floor((dst + 0.5) * scale), bilinear clamps a
negative half-pixel source to 0, bicubic uses A = -0.75 with clamped taps. The scale is in/out, or
1/scale_factor when only a scale is given. `coordinate="tnn"` reproduces TNN's CPU Upsample: the output size is
round(in * scale), the coordinate scale is always in/out, and a non-align-corners output of size 1 uses scale 0.
"""

from __future__ import annotations

import math

import numpy as np

from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register

_MODES = {"nearest": "nearest", "nearest_exact": "nearest_exact", "nearest-exact": "nearest_exact",
          "bilinear": "bilinear", "linear": "bilinear", "bicubic": "bicubic", "cubic": "bicubic"}
_NEAREST = ("nearest", "nearest_exact")


def _mode(node: Node) -> str:
    mode = node.params.get("mode", "nearest")
    if mode not in _MODES:
        raise UnsupportedOpError(f"Resize mode={mode!r} (supported: {sorted(_MODES)})", node.name, node.where())
    return _MODES[mode]


def _pair_or_none(node: Node, key: str):
    v = node.params.get(key)
    if v is None or isinstance(v, int | float):
        return v if v is None else (v, v)
    v = list(v)
    return tuple(v[-2:]) if len(v) >= 2 else (v[0], v[0])


def tnn_scaled_size(n: int, scale: float) -> int:
    """TNN's Upsample size, int(round(n * scale)) with an int and a float (DimsVectorUtils::Upsample): the product is
    a float32 and round() takes halves away from zero. In float64 a product just below a half can round the other
    way (3 x 0.8333333f: 2.4999999 in float64, 2.5f in float32, so TNN's 3 and not 2)."""
    product = float(np.float32(n) * np.float32(scale))
    return math.floor(product + 0.5) if product >= 0 else -math.floor(-product + 0.5)


def resize_size(node: Node, shape, size_value=None) -> tuple[int, int]:
    """(oh, ow): the size input, else the size param, else in * scale (floored; rounded for TNN)."""
    if len(shape) != 4:
        raise ShapeError(f"{node.where()}: Resize expects an NCHW input, got shape {tuple(shape)}")
    if size_value is not None:
        size = tuple(int(s) for s in np.asarray(size_value).ravel()[-2:])
    elif _pair_or_none(node, "size") is not None:
        size = tuple(int(s) for s in _pair_or_none(node, "size"))
    elif _pair_or_none(node, "scale") is not None:
        scales = _pair_or_none(node, "scale")
        if node.params.get("coordinate", "torch") == "tnn":
            size = tuple(tnn_scaled_size(n, s) for n, s in zip(shape[2:], scales, strict=True))
        else:  # torch floors in * scale
            size = tuple(math.floor(n * float(s)) for n, s in zip(shape[2:], scales, strict=True))
    else:
        raise ShapeError(f"{node.where()}: Resize has neither a size nor a scale")
    if len(size) != 2 or min(size) <= 0:
        raise ShapeError(f"{node.where()}: Resize output size {size} must be two positive ints")
    return size


def _axis_scale(node: Node, axis: int, n_in: int, n_out: int, has_size: bool) -> float:
    align = bool(node.params.get("align_corners", False)) and _mode(node) not in _NEAREST
    tnn = node.params.get("coordinate", "torch") == "tnn"
    if align:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    if tnn:
        return n_in / n_out if (n_out > 1 or _mode(node) == "nearest") else 0.0
    scale = _pair_or_none(node, "scale")
    if scale is not None and not has_size and float(scale[axis]) > 0:
        return 1.0 / float(scale[axis])
    return n_in / n_out


def _cubic(t: np.ndarray) -> np.ndarray:
    a = np.float32(-0.75)

    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


def taps(node: Node, axis: int, n_in: int, n_out: int, has_size: bool) -> tuple[np.ndarray, np.ndarray]:
    """Source indices (n_out, T) int64 and weights (n_out, T) float32 along one axis."""
    mode = _mode(node)
    scale = np.float32(_axis_scale(node, axis, n_in, n_out, has_size))
    dst = np.arange(n_out, dtype=np.float32)
    if mode == "nearest_exact":  # torch's nearest_neighbor_exact_compute_source_index, in float32
        idx = np.minimum(np.floor((dst + np.float32(0.5)) * scale).astype(np.int64), n_in - 1)
        return idx[:, None], np.ones((n_out, 1), np.float32)
    if mode == "nearest":
        tnn = node.params.get("coordinate", "torch") == "tnn"
        if not tnn and n_out == n_in:
            idx = np.arange(n_out)
        elif not tnn and n_out == 2 * n_in:
            idx = np.arange(n_out) // 2
        else:
            idx = np.minimum(np.floor(dst * scale).astype(np.int64), n_in - 1)
        return idx[:, None], np.ones((n_out, 1), np.float32)
    align = bool(node.params.get("align_corners", False))
    if align:
        real = scale * dst
    elif node.params.get("coordinate", "torch") == "tnn":
        real = (np.float64(scale) * (dst.astype(np.float64) + 0.5) - 0.5).astype(np.float32)
    else:
        real = scale * (dst + np.float32(0.5)) - np.float32(0.5)
    if mode == "bilinear":
        real = np.maximum(real, np.float32(0))
    # torch's guard_index_and_lambda: clamp the index, then the fraction to [0, 1].
    i0 = np.minimum(np.floor(real).astype(np.int64), n_in - 1)
    lam = np.clip(real - i0.astype(np.float32), 0, 1).astype(np.float32)
    if mode == "bilinear":
        i1 = i0 + (i0 < n_in - 1)
        return np.stack([i0, i1], axis=1), np.stack([1 - lam, lam], axis=1)
    idx = np.clip(i0[:, None] + np.arange(-1, 3)[None, :], 0, n_in - 1)
    return idx, _cubic(lam).astype(np.float32)


def size_input(node: Node, arrays: list) -> np.ndarray | None:
    return None if len(arrays) < 2 else arrays[1]


def infer_resize(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    size_value = None
    if len(ins) > 1:
        if ins[1].value is None:
            raise ShapeError(f"{node.where()}: Resize size input is not known before running")
        size_value = ins[1].value
    _mode(node)
    oh, ow = resize_size(node, ins[0].shape, size_value)
    return [TensorInfo(tuple(ins[0].shape[:2]) + (oh, ow), ins[0].dtype)]


def has_size(node: Node, size_value) -> bool:
    return size_value is not None or node.params.get("size") is not None


def resize_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x, size_value = arrays[0], size_input(node, arrays)
    oh, ow = resize_size(node, x.shape, size_value)
    has = has_size(node, size_value)
    iy, wy = taps(node, 0, x.shape[2], oh, has)
    ix, wx = taps(node, 1, x.shape[3], ow, has)
    g = x.astype(np.float64)[:, :, iy][:, :, :, :, ix]  # (N, C, oh, Ty, ow, Tx)
    out = np.einsum("ncyaxb,ya,xb->ncyx", g, wy.astype(np.float64), wx.astype(np.float64))
    return [out.astype(x.dtype)]


# -- PixelShuffle / ChannelShuffle ------------------------------------------------------------------
def _factor(node: Node, key: str, shape, divisor_of_c) -> int:
    if len(shape) != 4:
        raise ShapeError(f"{node.where()}: {node.op_type} expects an NCHW input, got shape {tuple(shape)}")
    f = int(node.params.get(key, 0) or 0)
    if f <= 0 or shape[1] % divisor_of_c(f):
        raise ShapeError(f"{node.where()}: {node.op_type} {key}={f} does not divide {shape[1]} channels")
    return f


def pixel_view(node: Node, x: np.ndarray) -> np.ndarray:
    r = _factor(node, "upscale", x.shape, lambda f: f * f)
    n, c, h, w = x.shape
    return x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)


def infer_pixel(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    n, c, h, w = ins[0].shape
    r = _factor(node, "upscale", ins[0].shape, lambda f: f * f)
    return [TensorInfo((n, c // (r * r), h * r, w * r), ins[0].dtype)]


def pixel_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    n, c, h, w = arrays[0].shape
    r = _factor(node, "upscale", arrays[0].shape, lambda f: f * f)
    return [pixel_view(node, arrays[0]).reshape(n, c // (r * r), h * r, w * r).copy()]


def unshuffle_view(node: Node, x: np.ndarray) -> np.ndarray:
    """torch.pixel_unshuffle as a view of x: (n, c, h/r, w/r, r, r) laid out as (n, c, r, r, h/r, w/r)."""
    r = _unshuffle_factor(node, x.shape)
    n, c, h, w = x.shape
    return x.reshape(n, c, h // r, r, w // r, r).transpose(0, 1, 3, 5, 2, 4)


def _unshuffle_factor(node: Node, shape) -> int:
    r = _factor(node, "downscale", shape, lambda f: 1)
    if shape[2] % r or shape[3] % r:
        raise ShapeError(f"{node.where()}: PixelUnshuffle downscale={r} does not divide {tuple(shape[2:])}")
    return r


def infer_unshuffle(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    r = _unshuffle_factor(node, ins[0].shape)
    n, c, h, w = ins[0].shape
    return [TensorInfo((n, c * r * r, h // r, w // r), ins[0].dtype)]


def unshuffle_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    n, c, h, w = arrays[0].shape
    r = _unshuffle_factor(node, arrays[0].shape)
    return [unshuffle_view(node, arrays[0]).reshape(n, c * r * r, h // r, w // r).copy()]


def _channel_view(node: Node, x: np.ndarray) -> np.ndarray:
    g = _factor(node, "groups", x.shape, lambda f: f)
    n, c, h, w = x.shape
    return x.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4)


def infer_channel(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    _factor(node, "groups", ins[0].shape, lambda f: f)
    return [TensorInfo(tuple(ins[0].shape), ins[0].dtype)]


def channel_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [_channel_view(node, arrays[0]).reshape(arrays[0].shape).copy()]


register(
    OpDef("Resize", infer_resize, resize_reference, arity=(1, 2), float_inputs=(0,)),
    OpDef("PixelShuffle", infer_pixel, pixel_reference, arity=(1, 1)),
    OpDef("PixelUnshuffle", infer_unshuffle, unshuffle_reference, arity=(1, 1)),
    OpDef("ChannelShuffle", infer_channel, channel_reference, arity=(1, 1)),
)
