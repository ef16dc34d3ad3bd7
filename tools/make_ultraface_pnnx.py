"""Rebuild UltraFace version-slim-320 in PyTorch, load the published weights and export the bundled PNNX model.

The server ships ../shared/models/tnn/ultraface_slim320 as TNN. This script rebuilds the same network
(Linzaer/Ultra-Light-Fast-Generic-Face-Detector-1MB, MIT: Mb_Tiny backbone + SSD heads) from its ONNX twin in
that folder, checks the rebuild against reference.npz (ONNX Runtime outputs) to 1e-4, and writes
model_repository/ultraface_pnnx/1/model.pnnx.param + .bin. Run with the `dev` extra (torch, pnnx, onnx).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fixture_io import export_pnnx, max_abs_diff, run_pnnx_python  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO.parent / "shared" / "models" / "tnn" / "ultraface_slim320"
ONNX_FILE = "version-slim-320_simplified.onnx"
OUT = REPO / "model_repository" / "ultraface_pnnx" / "1"
INPUT_SHAPE = (1, 3, 240, 320)
TOLERANCE = 1e-4

# The published model is BatchNorm-folded (every conv has a bias, no BN nodes), so the rebuild uses biased
# convs where the training code had conv + BN; the arithmetic is the deployed network's exactly.


def conv_relu(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.ReLU(inplace=True))


def conv_dw(cin: int, cout: int, stride: int) -> nn.Sequential:
    """Mb_Tiny's depthwise-separable unit: 3x3 depthwise + ReLU, 1x1 pointwise + ReLU."""
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin),
        nn.ReLU(inplace=True),
        nn.Conv2d(cin, cout, 1, 1, 0),
        nn.ReLU(inplace=True),
    )


def separable(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    """SeperableConv2d of the original code: depthwise 3x3 + ReLU + pointwise 1x1 (no final activation)."""
    return nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin), nn.ReLU(), nn.Conv2d(cin, cout, 1))


class UltraFaceSlim(nn.Module):
    """version-slim: Mb_Tiny (base 16) + 4-level SSD heads, 2 classes, priors (3, 2, 2, 3) per location."""

    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        b = 16
        self.num_classes = num_classes
        self.base_net = nn.Sequential(
            conv_relu(3, b, 2),
            conv_dw(b, b * 2, 1),
            conv_dw(b * 2, b * 2, 2),
            conv_dw(b * 2, b * 2, 1),
            conv_dw(b * 2, b * 4, 2),
            conv_dw(b * 4, b * 4, 1),
            conv_dw(b * 4, b * 4, 1),
            conv_dw(b * 4, b * 4, 1),
            conv_dw(b * 4, b * 8, 2),
            conv_dw(b * 8, b * 8, 1),
            conv_dw(b * 8, b * 8, 1),
            conv_dw(b * 8, b * 16, 2),
            conv_dw(b * 16, b * 16, 1),
        )
        self.source_layer_indexes = (8, 11, 13)
        self.extras = nn.Sequential(
            nn.Conv2d(b * 16, b * 4, 1), nn.ReLU(), separable(b * 4, b * 16, stride=2), nn.ReLU()
        )
        priors = (3, 2, 2, 3)
        chans = (b * 4, b * 8, b * 16)
        self.classification_headers = nn.ModuleList(
            [separable(c, p * num_classes) for c, p in zip(chans, priors, strict=False)]
            + [nn.Conv2d(b * 16, priors[3] * num_classes, 3, padding=1)]
        )
        self.regression_headers = nn.ModuleList(
            [separable(c, p * 4) for c, p in zip(chans, priors, strict=False)]
            + [nn.Conv2d(b * 16, priors[3] * 4, 3, padding=1)]
        )

    def _head(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        conf = self.classification_headers[i](x).permute(0, 2, 3, 1).contiguous()
        loc = self.regression_headers[i](x).permute(0, 2, 3, 1).contiguous()
        return conf.view(conf.size(0), -1, self.num_classes), loc.view(loc.size(0), -1, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        confs, locs = [], []
        start = 0
        for i, end in enumerate(self.source_layer_indexes):
            for layer in self.base_net[start:end]:
                x = layer(x)
            start = end
            conf, loc = self._head(i, x)
            confs.append(conf)
            locs.append(loc)
        conf, loc = self._head(3, self.extras(x))
        confs.append(conf)
        locs.append(loc)
        return F.softmax(torch.cat(confs, 1), dim=2), torch.cat(locs, 1)


def load_onnx_weights(model: UltraFaceSlim, onnx_path: Path) -> None:
    """Assign the ONNX Conv initialisers to the rebuilt convs in execution order, checking every shape."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    onnx_convs = [n for n in graph.node if n.op_type == "Conv"]
    order: list[nn.Conv2d] = []
    hooks = [
        m.register_forward_hook(lambda mod, _i, _o: order.append(mod))
        for m in model.modules()
        if isinstance(m, nn.Conv2d)
    ]
    with torch.no_grad():
        model(torch.zeros(INPUT_SHAPE))
    for h in hooks:
        h.remove()
    if len(order) != len(onnx_convs):
        raise SystemExit(f"rebuild has {len(order)} convs, the ONNX model {len(onnx_convs)}")
    with torch.no_grad():
        for conv, node in zip(order, onnx_convs, strict=True):
            weight, bias = inits[node.input[1]], inits[node.input[2]]
            groups = next(a.i for a in node.attribute if a.name == "group")
            if tuple(conv.weight.shape) != weight.shape or conv.groups != groups:
                raise SystemExit(f"conv mismatch at ONNX node {node.output[0]}: {conv} vs {weight.shape} g={groups}")
            conv.weight.copy_(torch.from_numpy(np.array(weight)))
            conv.bias.copy_(torch.from_numpy(np.array(bias)))


def check_against_reference(model: nn.Module, reference: Path) -> tuple[np.ndarray, float]:
    ref = np.load(reference)
    x = torch.from_numpy(ref["input"])
    with torch.no_grad():
        scores, boxes = model(x)
    err = max(float(np.abs(scores.numpy() - ref["scores"]).max()), float(np.abs(boxes.numpy() - ref["boxes"]).max()))
    if err > TOLERANCE:
        raise SystemExit(f"rebuilt UltraFace differs from the ONNX Runtime reference by {err:.3e} > {TOLERANCE}")
    return ref["input"], err


def main(argv: list[str] | None = None) -> int:
    if not (SOURCE / ONNX_FILE).exists():
        print(f"skipping UltraFace: {SOURCE.relative_to(REPO.parent)} not present (needs ../shared)")
        return 0
    torch.set_num_threads(1)
    model = UltraFaceSlim().eval()
    load_onnx_weights(model, SOURCE / ONNX_FILE)
    x, err = check_against_reference(model, SOURCE / "reference.npz")
    print(f"UltraFace rebuild vs ONNX Runtime reference: max abs error {err:.2e}")
    work = REPO / ".fixture-work" / "ultraface"
    inputs = [torch.from_numpy(x)]
    paths = export_pnnx(model, inputs, work, "ultraface")
    with torch.no_grad():
        want = list(model(*inputs))
    pnnx_err = max_abs_diff(run_pnnx_python(paths["py"], inputs), want)
    if pnnx_err > TOLERANCE:
        raise SystemExit(f"pnnx's own Python rendering of the export differs from torch by {pnnx_err:.3e}")
    OUT.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths["param"], OUT / "model.pnnx.param")
    shutil.copyfile(paths["bin"], OUT / "model.pnnx.bin")
    print(f"wrote {OUT.relative_to(REPO)}/model.pnnx.param and model.pnnx.bin (pnnx self-check {pnnx_err:.1e})")
    if "--keep-work" not in (argv or []):
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
