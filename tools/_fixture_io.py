"""Export and file-writing helpers for tools/make_fixtures.py (needs the `dev` extra: torch and pnnx)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

_DTYPE_TAGS = {torch.float32: "f32", torch.int64: "i64", torch.int32: "i32", torch.float16: "f16"}
# A fixed timestamp keeps the npz bytes identical between runs (numpy's savez stamps the current time).
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def pnnx_executable() -> str:
    """The `pnnx` console script installed next to the running interpreter."""
    exe = Path(sys.executable).parent / "pnnx"
    if not exe.exists():
        raise SystemExit(f"pnnx executable not found next to {sys.executable}; install the `dev` extra")
    return str(exe)


def shape_arg(tensors: list[torch.Tensor]) -> str:
    """pnnx's inputshape syntax, with dtype tags: [1,3,64,64]f32,[1,6]i64."""
    return ",".join("[" + ",".join(str(d) for d in t.shape) + "]" + _DTYPE_TAGS[t.dtype] for t in tensors)


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    """Tuple/list outputs flattened depth-first, the order pnnx numbers them."""
    if isinstance(out, torch.Tensor):
        return [out]
    flat: list[torch.Tensor] = []
    for item in out:
        flat.extend(flatten_outputs(item))
    return flat


def export_pnnx(
    model: torch.nn.Module,
    inputs: list[torch.Tensor],
    work: Path,
    stem: str,
    inputs2: list[torch.Tensor] | None = None,
) -> dict[str, Path]:
    """Trace `model`, run the pnnx executable in `work` and return the paths it wrote."""
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob(f"{stem}*"):
        old.unlink()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace's deprecation notice, once per model
        traced = torch.jit.trace(model, tuple(inputs))
    traced.save(str(work / f"{stem}.pt"))
    args = [pnnx_executable(), f"{stem}.pt", "inputshape=" + shape_arg(inputs)]
    if inputs2 is not None:
        args.append("inputshape2=" + shape_arg(inputs2))
    proc = subprocess.run(args, cwd=work, capture_output=True, text=True)
    (work / f"{stem}.pnnx.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"pnnx failed on {stem} (exit {proc.returncode}); log in {work / (stem + '.pnnx.log')}")
    return {
        "param": work / f"{stem}.pnnx.param",
        "bin": work / f"{stem}.pnnx.bin",
        "py": work / f"{stem}_pnnx.py",
        "ncnn_param": work / f"{stem}.ncnn.param",
        "ncnn_bin": work / f"{stem}.ncnn.bin",
    }


def run_pnnx_python(py_path: Path, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the PyTorch module pnnx generated from its own graph: tells pnnx bugs apart from engine bugs."""
    spec = importlib.util.spec_from_file_location(py_path.stem, py_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cwd = Path.cwd()
    try:
        # The generated module opens its .pnnx.bin by a path relative to the working directory.
        os.chdir(py_path.parent)
        net = module.Model().float().eval()
    finally:
        os.chdir(cwd)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated code calls the deprecated F.upsample
        return flatten_outputs(net(*inputs))


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Compressed npz with fixed zip timestamps, so re-running the script changes no bytes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def save_json(path: Path, obj: dict[str, Any]) -> None:
    text = json.dumps(obj, indent=2)
    # Keep shapes on one line: [1, 3, 64, 64] instead of one number per line.
    text = re.sub(
        r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]", lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text
    )
    path.write_text(text + "\n")


def op_counts(param_path: Path) -> dict[str, int]:
    """Operator types in a .pnnx.param and how often each occurs."""
    counts: dict[str, int] = {}
    for line in param_path.read_text().splitlines()[2:]:
        if line.strip():
            op = line.split()[0]
            counts[op] = counts.get(op, 0) + 1
    return dict(sorted(counts.items()))


def as_numpy(tensors: list[torch.Tensor]) -> dict[str, np.ndarray]:
    out = {}
    for i, t in enumerate(tensors):
        arr = t.detach().cpu().numpy()
        out[f"{i}"] = arr.astype(np.float32) if arr.dtype.kind == "f" else arr
    return out


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return float("inf")
        worst = max(worst, float((x.float() - y.float()).abs().max()) if x.numel() else 0.0)
    return worst
