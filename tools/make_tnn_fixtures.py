"""Writes the TNN fixtures in tests/fixtures/tnn/ from the PNNX fixtures in tests/fixtures/pnnx/.

Each PNNX fixture (a PyTorch model exported by pnnx, with PyTorch's own outputs) is loaded, lowered and
written as TNN files with engine.formats.tnn_writer. The inputs and PyTorch's expected outputs are copied
unchanged, so the TNN fixtures are checked against PyTorch, not against our own engine.

    .venv/bin/python tools/make_tnn_fixtures.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engine  # noqa: E402
from engine.formats.tnn_writer import write_tnn  # noqa: E402

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
    for f in ("inputs.npz", "expected.npz"):
        shutil.copyfile(src / f, dst / f)
    meta = {"source": f"tests/fixtures/pnnx/{source}", "version": version, "fp16": fp16,
            "generator": "tools/make_tnn_fixtures.py",
            "reference": "expected.npz is PyTorch's output copied from the source fixture"}
    (dst / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{name}: {sum(p.stat().st_size for p in dst.iterdir())} bytes")


if __name__ == "__main__":
    for spec in FIXTURES:
        make(*spec)
