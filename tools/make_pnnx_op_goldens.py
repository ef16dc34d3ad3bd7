"""Writes tests/fixtures/pnnx_ops/<case>/: tiny real pnnx exports, one per op and attribute variant the engine
lowers (dims, negative indices, broadcasting, int64 / bool / float16 operands, empty dims, in-place writes, tied
weights), each with its inputs and PyTorch's outputs as the golden.

Run with the dev environment (torch + pnnx): `<dev venv>/bin/python tools/make_pnnx_op_goldens.py [case ...]`.
Each case folder holds model.pnnx.param, model.pnnx.bin and io.npz (in0.., out0..); io2.npz holds a second run at
other input shapes for cases exported with dynamic dims. Cases live in tools/_op_golden_cases.py.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _op_golden_cases import CASES, Case, Spec  # noqa: E402
from pnnx_export import trace_and_convert  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "pnnx_ops"
CODES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int64): "i64",
         np.dtype(np.int32): "i32", np.dtype(np.bool_): "bool"}


def make_input(spec: Spec, rng: np.random.Generator) -> np.ndarray:
    """A float32 normal tensor, or `("i64", shape, high)` ints in [0, high), `("bool", shape)`, `("f16", shape)`,
    `("perm", shape)` distinct float32 values (no ties for sort-like ops)."""
    if not isinstance(spec[0], str):
        return rng.standard_normal(spec).astype(np.float32)
    kind, shape = spec[0], tuple(spec[1])
    if kind == "i64":
        return rng.integers(0, spec[2], shape).astype(np.int64)
    if kind == "bool":
        return rng.random(shape) > 0.5
    if kind == "f16":
        return rng.standard_normal(shape).astype(np.float16)
    if kind == "perm":
        return (rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0).astype(np.float32)
    raise ValueError(f"unknown input spec {spec!r}")


def shape_arg(xs: list[np.ndarray]) -> str:
    return ",".join("[" + ",".join(map(str, x.shape)) + "]" + CODES[x.dtype] for x in xs)


def run_torch(model: torch.nn.Module, xs: list[np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        outs = model(*(torch.from_numpy(x.copy()) for x in xs))
    outs = outs if isinstance(outs, tuple) else (outs,)
    return {f"in{i}": x for i, x in enumerate(xs)} | {f"out{i}": o.numpy() for i, o in enumerate(outs)}


def export(name: str, case: Case, rng: np.random.Generator) -> None:
    model = case.model.eval()
    xs = [make_input(s, rng) for s in case.inputs]
    xs2 = None if case.inputs2 is None else [make_input(s, rng) for s in case.inputs2]
    trace_and_convert(model, xs, shape_arg(xs), None if xs2 is None else shape_arg(xs2), OUT / name)
    np.savez_compressed(OUT / name / "io.npz", **run_torch(model, xs))
    if xs2 is not None:
        np.savez_compressed(OUT / name / "io2.npz", **run_torch(model, xs2))
    print(name, "exported")


def main(only: set[str]) -> None:
    """Exports every case, or only the named ones. Each case draws from a seed of its own name, so exporting
    one or adding one leaves the others' weights and inputs as they are."""
    for name, case in CASES.items():
        if not only or name in only:
            seed = zlib.crc32(name.encode())
            torch.manual_seed(seed)
            case.model = case.build()  # weights drawn under the case's seed
            export(name, case, np.random.default_rng(seed))


if __name__ == "__main__":
    main(set(sys.argv[1:]))
