"""Writes the TNN fixtures in tests/fixtures/tnn/ from the PNNX fixtures in tests/fixtures/pnnx/.

Each PNNX fixture (a PyTorch model exported by pnnx, with PyTorch's own outputs) is loaded, lowered and
written as TNN files with engine.formats.tnn.writer. The inputs and PyTorch's expected outputs are copied
unchanged, so the TNN fixtures are checked against PyTorch, not against our own engine.

fp16 fixtures store half weights, so copying fp32 PyTorch outputs would force a loose tolerance: their
expected outputs are PyTorch's on the same model rebuilt by tools/make_fixtures.py with the conv, deconv and
linear weights and biases rounded to half, as the writer stores them (BatchNorm folded into its conv first,
as the lowering does; elementwise constants and PReLU slopes stay float, as the writer keeps them). That
needs torch:

    .venv-dev/bin/python tools/make_tnn_fixtures.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.formats.tnn.writer.write import write_tnn  # noqa: E402

PNNX = ROOT / "tests" / "fixtures" / "pnnx"
OUT = ROOT / "tests" / "fixtures" / "tnn"

# (name, source pnnx fixture, format version, fp16): both versions and both weight types are covered.
FIXTURES = [
    ("misc_conv_resize_v1", "misc_conv_resize", 1, False),
    ("misc_activations_v2_fp16", "misc_activations", 2, True),
    ("misc_shapes_v2", "misc_shapes", 2, False),
    ("transformer_v2", "transformer", 2, False),
    ("unet_v1_fp16", "unet", 1, True),
    ("two_inputs_v2", "two_inputs", 2, False),
]


def make(name: str, source: str, version: int, fp16: bool) -> None:
    src, dst = PNNX / source, OUT / name
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    model = engine.load(src / "model.pnnx.param")
    write_tnn(model.graph, dst / "model", version=version, fp16=fp16)
    shutil.copyfile(src / "inputs.npz", dst / "inputs.npz")
    reference = "expected.npz is PyTorch's output copied from the source fixture"
    if fp16:
        save_npz(dst / "expected.npz", half_weight_outputs(source, src))
        reference = "expected.npz is PyTorch's output with the weights the file stores as half rounded to half"
    else:
        shutil.copyfile(src / "expected.npz", dst / "expected.npz")
    meta = {"source": f"tests/fixtures/pnnx/{source}", "version": version, "fp16": fp16,
            "generator": "tools/make_tnn_fixtures.py", "reference": reference}
    (dst / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{name}: {sum(p.stat().st_size for p in dst.iterdir())} bytes")


HALF_LAYERS = ("Conv1d", "Conv2d", "ConvTranspose2d", "Linear")


def half_weight_outputs(source: str, src: Path) -> dict[str, np.ndarray]:
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    import make_fixtures
    half_layers = tuple(getattr(torch.nn, n) for n in HALF_LAYERS)

    spec = next(s for s in make_fixtures.SPECS if s.name == source)
    model, _ = make_fixtures.build(spec)
    inputs = [torch.from_numpy(a) for a in np.load(src / "inputs.npz").values()]
    expected = dict(np.load(src / "expected.npz"))
    fp32 = make_fixtures.named("out", make_fixtures.run(model, inputs))
    for name, ref in expected.items():  # the rebuilt model is the one the fixture came from
        np.testing.assert_allclose(fp32[name], ref, rtol=1e-5, atol=1e-6, err_msg=f"{source}: rebuild differs")
    fold_batchnorm(model)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, half_layers):
                for p in mod.parameters(recurse=False):
                    p.copy_(p.half().float())
    return make_fixtures.named("out", make_fixtures.run(model, inputs))


def fold_batchnorm(model) -> None:
    """conv -> BatchNorm2d pairs inside Sequentials become one conv (the BN an Identity)."""
    import torch
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    for seq in [m for m in model.modules() if isinstance(m, torch.nn.Sequential)]:
        for i in range(len(seq) - 1):
            if isinstance(seq[i], torch.nn.Conv2d) and isinstance(seq[i + 1], torch.nn.BatchNorm2d):
                seq[i] = fuse_conv_bn_eval(seq[i], seq[i + 1])
                seq[i + 1] = torch.nn.Identity()
    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise RuntimeError("a BatchNorm outside a conv Sequential: fold it here as the lowering does")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tools"))
    from _fixture_io import save_npz

    for spec in FIXTURES:
        if len(sys.argv) < 2 or spec[0] in sys.argv[1:]:
            make(*spec)
