"""Trace a torch module and convert it with pnnx: the one step the fixture scripts share (dev extra: torch, pnnx)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

PNNX = Path(sys.executable).parent / "pnnx"


def trace_and_convert(model: torch.nn.Module, xs: list[np.ndarray], inputshape: str, inputshape2: str | None,
                      dst: Path) -> None:
    """torch.jit.trace `model` on `xs`, run pnnx with the given shape arguments, and copy model.pnnx.param / .bin
    into `dst` (created)."""
    with tempfile.TemporaryDirectory() as tmp:
        pt = Path(tmp) / "model.pt"
        with torch.no_grad():
            torch.jit.trace(model, tuple(torch.from_numpy(x.copy()) for x in xs), check_trace=False).save(str(pt))
        cmd = [str(PNNX), str(pt), f"inputshape={inputshape}"]
        if inputshape2 is not None:
            cmd.append(f"inputshape2={inputshape2}")
        subprocess.run(cmd, cwd=tmp, check=True, capture_output=True, timeout=120)  # pnnx can hang
        dst.mkdir(parents=True, exist_ok=True)
        for suffix in (".pnnx.param", ".pnnx.bin"):
            shutil.copy(Path(tmp) / f"model{suffix}", dst / f"model{suffix}")
