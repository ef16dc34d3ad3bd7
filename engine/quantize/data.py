"""Calibration inputs from a folder (or one file): `.npy` arrays for a one-input model, `.npz` files holding one
array per input name, or images preprocessed as the model expects (`Preprocess`: size, channel order, mean and
scale per channel, layout). Arrays without the batch axis get one; every input becomes float32."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import EngineError
from engine.quantize.calibrate import Sample
from engine.quantize.images import SUFFIXES, read_image, resize_bilinear
from engine.runtime.model import TensorSpec


@dataclass(frozen=True)
class Preprocess:
    """pixel (0..255, in `channels` order) -> (pixel - mean) * scale, resized to `size` (default: the model's)."""
    mean: tuple[float, ...] = (0.0,)
    scale: tuple[float, ...] = (1.0,)
    size: tuple[int, int] | None = None  # (height, width)
    channels: str = "rgb"  # rgb | bgr
    layout: str = "nchw"  # nchw | nhwc: how the model takes the image


def calibration_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise EngineError(f"{path}: no such calibration file or folder")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in {".npy", ".npz", *SUFFIXES})
    if not files:
        raise EngineError(f"{path}: no .npy, .npz or image files to calibrate on")
    return files


def load_samples(path: str | Path, inputs: list[TensorSpec], pre: Preprocess = Preprocess(),
                 limit: int | None = None) -> list[Sample]:
    files = calibration_files(Path(path))[:limit]
    return [_sample(f, inputs, pre) for f in files]


def _sample(f: Path, inputs: list[TensorSpec], pre: Preprocess) -> Sample:
    suffix = f.suffix.lower()
    if suffix == ".npz":
        with np.load(f, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        missing = [s.name for s in inputs if s.name not in arrays]
        if missing:
            raise EngineError(f"{f}: no array for input(s) {', '.join(missing)}")
        return {s.name: _batched(arrays[s.name], s, f) for s in inputs}
    if len(inputs) != 1:
        raise EngineError(f"{f}: the model has {len(inputs)} inputs; give each calibration input as an .npz of "
                          f"{', '.join(s.name for s in inputs)}")
    spec = inputs[0]
    if suffix == ".npy":
        return {spec.name: _batched(np.load(f, allow_pickle=False), spec, f)}
    return {spec.name: image_input(read_image(f), spec, pre)}


def _batched(a: np.ndarray, spec: TensorSpec, f: Path) -> np.ndarray:
    a = np.asarray(a, np.float32)
    if a.ndim == len(spec.shape) - 1:
        a = a[None]
    if a.ndim != len(spec.shape) or any(d >= 0 and d != g for d, g in zip(spec.shape[1:], a.shape[1:],
                                                                          strict=True)):
        raise EngineError(f"{f}: shape {a.shape} does not fit input {spec.name!r} {spec.shape}")
    return np.ascontiguousarray(a)


def image_input(img: np.ndarray, spec: TensorSpec, pre: Preprocess) -> np.ndarray:
    """HxWx3 uint8 RGB -> the model's input (1, 3, H, W) (or NHWC)."""
    if len(spec.shape) != 4:
        raise EngineError(f"input {spec.name!r} {spec.shape} is not an image batch")
    nhwc = pre.layout == "nhwc"
    h, w = spec.shape[1:3] if nhwc else spec.shape[2:4]
    size = pre.size or (h, w)
    if min(size) <= 0:
        raise EngineError(f"input {spec.name!r} has dynamic height/width {spec.shape}: give the image size")
    x = resize_bilinear(img, size)
    if pre.channels == "bgr":
        x = x[:, :, ::-1]
    x = (x - np.asarray(pre.mean, np.float32)) * np.asarray(pre.scale, np.float32)
    x = x[None] if nhwc else x.transpose(2, 0, 1)[None]
    return np.ascontiguousarray(x, np.float32)
