"""`TnnQUpsample`: TNN's int8 Upsample (the QuantizedUpsample layer) as TNN's x86 device runs it.

TNN's x86 registry has its own acc for LAYER_UPSAMPLE, int8 included (X86UpsampleLayerAcc::DoForward,
source/tnn/device/x86/acc/x86_upsample_layer_acc.cc, with X86UpsampleNearest2D / X86UpsampleBilinear2D in
source/tnn/device/x86/acc/compute/x86_compute_int8.cc) on its NHWC4 int8 blobs; the naive CpuUpsampleLayerAcc
(source/tnn/device/cpu/acc/cpu_upsample_layer_acc.cc: NaiveDequant, the float upsample, NaiveQuant into the
output blob) is not what x86 runs. Per channel c (input and output blob scales per tensor or per channel,
`len == 1 ? s[0] : s[c]`):
- factor[c] = in_scale[c] / out_scale[c] in float32, 0 where out_scale[c] < FLT_MIN (TNN's guard: zero,
  denormal and negative output scales give 0; one float32 division, as GCC compiles the acc's -ffast-math loop,
  as for TnnQConv's factors); `do_scale` = any |factor[c] - 1| > 1/128 (in double);
- same spatial size and not do_scale: the int8 bytes are copied;
- nearest (mode 1; align_corners is ignored): source row trunc(h * fl(ih / oh)) in float32, column alike; the
  byte itself, or float2int8(q * factor[c]) when do_scale;
- bilinear (mode 2): the source coordinate of output row h is h * fl((ih - 1) / (oh - 1)) (align_corners; 0
  when oh == 1) or fl(fl(ih / oh) * (h + 0.5) - 0.5) computed in double, clamped below at 0, never above
  (half-pixel; 0 scale when oh == 1); row h1 = trunc, h1p = (h1 < ih - 1), l1 = coordinate - h1, l0 = 1 - l1;
  columns alike; then float2int8(((x00 l0w + x01 l1w) l0h + (x10 l0w + x11 l1w) l1h) [* factor[c]]).
  TNN compiles that sum with -ffast-math (and -mfma with AVX2: source/tnn/device/x86/CMakeLists.txt), so its
  rounding is the compiler's: only coordinates whose weights are multiples of 1/128 are taken (BILINEAR_GRID),
  where every partial sum is exact in float32 whatever the order or contraction; `exact_bilinear` tells them
  apart and other sizes are refused.
- the output size is params `size` (oh, ow), or round(in * scale) (float32 product, half away from zero) with
  params `scale` (sh, sw), as DimsFunctionUtils::Upsample computes it.
float2int8 (source/tnn/utils/naive_compute.cc, built without -ffast-math) is quant.float2int8.
Attrs `in_scale` / `out_scale` hold the two blob scales as the file gives them.
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.quant import F32, FLT_MIN, I8, float2int8
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.resize import tnn_scaled_size

# Bilinear weights on this grid keep TNN's float sums exact (|x| <= 128: products on a 1/2**14 grid below 2**8)
BILINEAR_GRID = 128
DO_SCALE_TOLERANCE = 0.0078125  # need_do_scale in x86_upsample_layer_acc.cc
EXACT_SAMPLE, EXACT_CHUNK = 1025, 1 << 16  # exact_bilinear's positions: a first sample, then chunks of all


def output_size(node: Node, shape) -> tuple[int, int]:
    if len(shape) != 4:
        raise ShapeError(f"{node.where()}: {node.op_type} takes NCHW int8 values, got {tuple(shape)}")
    if node.params.get("size") is not None:
        oh, ow = (int(v) for v in node.params["size"])
    else:
        oh, ow = (tnn_scaled_size(n, s) for n, s in zip(shape[2:], node.params["scale"], strict=True))
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"{node.where()}: {node.op_type} output size {oh}x{ow} (TNN refuses a size below 1)")
    return oh, ow


def factors(in_scale: np.ndarray, out_scale: np.ndarray, c: int) -> tuple[np.ndarray, bool]:
    """The per-channel (c,) float32 factors in / out (0 where out < FLT_MIN) and TNN's do_scale."""
    i = np.broadcast_to(np.asarray(in_scale, F32).reshape(-1), (c,))
    o = np.broadcast_to(np.asarray(out_scale, F32).reshape(-1), (c,))
    ok = o >= FLT_MIN
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        f = np.where(ok, i / np.where(ok, o, F32.type(1)), F32.type(0)).astype(F32)
    return np.ascontiguousarray(f), bool(np.any(np.abs(f.astype(np.float64) - 1.0) > DO_SCALE_TOLERANCE))


def nearest_index(n_in: int, n_out: int) -> np.ndarray:
    scale = F32.type(n_in) / F32.type(n_out)
    return np.trunc(np.arange(n_out).astype(F32) * scale).astype(np.int64)


def bilinear_coords(n_in: int, n_out: int, align_corners: bool, at: np.ndarray | None = None) -> np.ndarray:
    """get_bilinear_coeffs: the float32 source coordinate of every output position (or of the positions `at`)."""
    at = np.arange(n_out) if at is None else at
    if align_corners:
        r = F32.type(n_in - 1) / F32.type(n_out - 1) if n_out > 1 else F32.type(0)
        return at.astype(F32) * r
    r = F32.type(n_in) / F32.type(n_out) if n_out > 1 else F32.type(0)
    coord = (np.float64(r) * (at + 0.5) - 0.5).astype(F32)
    return np.where(coord >= 0, coord, F32.type(0)).astype(F32)


def bilinear_taps(n_in: int, n_out: int, align_corners: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first source index, second source index, (l0, l1) float32 weights) per output position."""
    coord = bilinear_coords(n_in, n_out, align_corners)
    first = coord.astype(np.int64)  # truncation (coordinates are >= 0)
    second = first + (first < n_in - 1)
    l1 = (coord - first.astype(F32)).astype(F32)
    return first, second, np.stack([F32.type(1) - l1, l1], axis=1).astype(F32)


def _on_grid(n_in: int, n_out: int, align_corners: bool, at: np.ndarray) -> bool:
    coord = bilinear_coords(n_in, n_out, align_corners, at)
    w = (coord - coord.astype(np.int64).astype(F32)).astype(np.float64) * BILINEAR_GRID  # l1 (l0 = 1 - l1 with it)
    return bool(np.all(w == np.round(w)))


def exact_bilinear(n_in: int, n_out: int, align_corners: bool) -> bool:
    """Whether every bilinear weight on this axis is a multiple of 1/BILINEAR_GRID (TNN's sums then exact).
    A file's size may be any int: a strided sample of positions first (a size off the grid fails there), then
    every position a chunk at a time, so the check never holds arrays of the axis's length."""
    sample = np.unique(np.linspace(0, max(n_out - 1, 0), EXACT_SAMPLE).astype(np.int64))
    if not _on_grid(n_in, n_out, align_corners, sample):
        return False
    return all(_on_grid(n_in, n_out, align_corners, np.arange(lo, min(n_out, lo + EXACT_CHUNK)))
               for lo in range(0, n_out, EXACT_CHUNK))


def check_exact(node: Node, shape, out_hw) -> None:
    if node.params["mode"] != "bilinear":
        return
    align = bool(node.params.get("align_corners"))
    for n_in, n_out in zip(shape[2:], out_hw, strict=True):
        if not exact_bilinear(int(n_in), int(n_out), align):
            raise ShapeError(f"{node.where()}: {node.op_type} bilinear {n_in} -> {n_out} (align_corners {align}): "
                             f"weights off the 1/{BILINEAR_GRID} grid, where TNN's float sums round as its "
                             "compiler chose")


def infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    shape = tuple(ins[0].shape)
    oh, ow = output_size(node, shape)
    check_exact(node, shape, (oh, ow))
    return [TensorInfo((shape[0], shape[1], oh, ow), I8)]


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    n, c, ih, iw = x.shape
    oh, ow = output_size(node, x.shape)
    check_exact(node, x.shape, (oh, ow))
    f, do_scale = factors(node.attrs["in_scale"], node.attrs["out_scale"], c)
    f = f.reshape(1, c, 1, 1)
    if (ih, iw) == (oh, ow) and not do_scale:
        return [x.astype(I8, copy=True)]
    if node.params["mode"] == "nearest":
        y = x[:, :, nearest_index(ih, oh)][:, :, :, nearest_index(iw, ow)]
        return [float2int8(y.astype(F32) * f) if do_scale else y.astype(I8, copy=True)]
    align = bool(node.params.get("align_corners"))
    h0, h1, lh = bilinear_taps(ih, oh, align)
    w0, w1, lw = bilinear_taps(iw, ow, align)
    xf = x.astype(F32)
    l0h, l1h = lh[:, 0].reshape(1, 1, oh, 1), lh[:, 1].reshape(1, 1, oh, 1)
    l0w, l1w = lw[:, 0].reshape(1, 1, 1, ow), lw[:, 1].reshape(1, 1, 1, ow)
    top, bottom = xf[:, :, h0], xf[:, :, h1]
    val = (top[:, :, :, w0] * l0w + top[:, :, :, w1] * l1w) * l0h + \
        (bottom[:, :, :, w0] * l0w + bottom[:, :, :, w1] * l1w) * l1h
    return [float2int8(val.astype(F32) * f if do_scale else val.astype(F32))]


register(OpDef("TnnQUpsample", infer, reference, arity=(1, 1)))
