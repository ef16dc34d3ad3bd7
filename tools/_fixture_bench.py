"""`make_fixtures.py --bench`: full-size random-weight torchvision models for benchmarks (bench/models/, gitignored).

Each model gets model.pnnx.param/.bin, input.npy and expected.npy (PyTorch output); the first group also gets
the model.ncnn.param/.bin pnnx writes and an ONNX export (model.onnx) for comparing runtimes.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torchvision.models as tvm
from _fixture_io import export_pnnx
from torch import nn


def vit_b_16() -> nn.Module:
    """ViT-B/16 with a random classifier head: torchvision zero-initialises it, and an all-zero output would
    compare equal to anything."""
    model = tvm.vit_b_16()
    with torch.no_grad():
        head = model.heads.head
        head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.02)
    return model


# name -> (constructor, input size, with ncnn + onnx)
BENCH_MODELS: dict[str, tuple[Callable[[], nn.Module], int, bool]] = {
    "resnet18": (lambda: tvm.resnet18(), 224, True),
    "mobilenet_v2": (lambda: tvm.mobilenet_v2(), 224, True),
    "squeezenet1_1": (lambda: tvm.squeezenet1_1(), 224, True),
    "shufflenet_v2_x1_0": (lambda: tvm.shufflenet_v2_x1_0(), 224, True),
    "efficientnet_b0": (lambda: tvm.efficientnet_b0(), 224, True),
    "alexnet": (lambda: tvm.alexnet(), 224, False),
    "inception_v3": (lambda: tvm.inception_v3(aux_logits=False, init_weights=False), 299, False),
    "vgg16": (lambda: tvm.vgg16(), 224, False),
    "resnet50": (lambda: tvm.resnet50(), 224, False),
    "mobilenet_v3_small": (lambda: tvm.mobilenet_v3_small(), 224, False),
    "vit_b_16": (vit_b_16, 224, False),
}


def export_onnx(model: nn.Module, x: torch.Tensor, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (x,), str(path), input_names=["in0"], output_names=["out0"], opset_version=17, dynamo=False
        )


def make_bench_models(
    out_root: Path,
    work_root: Path,
    randomize: Callable[[nn.Module, torch.Generator], None],
    names: list[str] | None = None,
) -> None:
    for name, (build, size, full) in BENCH_MODELS.items():
        if names and name not in names:
            continue
        start = time.perf_counter()
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        model = build()
        randomize(model, gen)
        model.eval()
        x = torch.randn(1, 3, size, size, generator=gen)
        with torch.no_grad():
            y = model(x)
        out = out_root / name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        paths = export_pnnx(model, [x], work_root / name, name)
        keep = {"param": "model.pnnx.param", "bin": "model.pnnx.bin"}
        if full:
            keep |= {"ncnn_param": "model.ncnn.param", "ncnn_bin": "model.ncnn.bin"}
            export_onnx(model, x, out / "model.onnx")
        for key, filename in keep.items():
            shutil.copyfile(paths[key], out / filename)
        np.save(out / "input.npy", x.numpy())
        np.save(out / "expected.npy", y.numpy())
        shutil.rmtree(work_root / name, ignore_errors=True)
        size_mb = sum(f.stat().st_size for f in out.iterdir()) / 1e6
        print(f"{name:<20} {size_mb:8.1f} MB  {time.perf_counter() - start:6.1f} s", flush=True)
