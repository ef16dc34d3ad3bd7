"""GPU bench: nnserve's CUDA device vs ONNX Runtime's CUDA provider and PyTorch CUDA, on the bench CNNs.

    .venv-dev/bin/python bench/gpu.py                          # every model, batch 1 and 8, appends to RESULTS.md
    .venv-dev/bin/python bench/gpu.py resnet18 --batches 1 --no-record

Needs a CUDA GPU, the bench models (`.venv-dev/bin/python tools/make_fixtures.py --bench`) and, for the peers,
onnxruntime-gpu and a CUDA build of torch; a peer that is not installed is reported as such. Without a GPU
it prints "not measured: no GPU" and exits 0. Latency is wall time of one call from host arrays to host
arrays (copies included, as a server sees it), interleaved across engines; outputs are compared with
nnserve's so a fast wrong answer cannot win.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# This file is bench/gpu.py: the repository root must come before bench/ so `import engine` finds the package.
_BENCH, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
sys.path[:] = [_ROOT, _BENCH] + [p for p in sys.path if p not in (_BENCH, _ROOT, "")]

NAMES = ["resnet18", "mobilenet_v2", "squeezenet1_1", "shufflenet_v2_x1_0", "efficientnet_b0"]


def gpu_name() -> str | None:
    """The first CUDA device's name, or None when there is none (or numba.cuda cannot load)."""
    try:
        from numba import cuda

        from engine.devices.cuda._launch import SIM

        if SIM or not cuda.is_available() or len(cuda.gpus) == 0:
            return None  # the simulator's fake device measures nothing
        with cuda.gpus[0]:
            name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return None


class Nnserve:
    def __init__(self, param: Path, batch: int, size: int):
        import engine

        self.inst = engine.load(param).instance("cuda:0", max_shapes={"in0": (batch, 3, size, size)})
        self.name = next(iter(o.name for o in engine.load(param).outputs))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.inst.run({"in0": x})[self.name]


class OrtCuda:
    def __init__(self, onnx_path: Path):
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
        self.session = ort.InferenceSession(str(onnx_path), providers=["CUDAExecutionProvider"])
        self.input = self.session.get_inputs()[0].name

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input: x})[0]


class TorchCuda:
    def __init__(self, name: str):
        import torch
        from _peers import torch_model

        if not torch.cuda.is_available():
            raise RuntimeError("torch was built without CUDA or sees no GPU")
        self.torch = torch
        self.model = torch_model(name).cuda()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            y = self.model(self.torch.from_numpy(x).cuda())
            return y.cpu().numpy()


def _peers(name: str, model_dir: Path) -> dict:
    peers, missing = {}, {}
    for label, make in (("onnxruntime-cuda", lambda: OrtCuda(model_dir / "model.onnx")),
                        ("pytorch-cuda", lambda: TorchCuda(name))):
        try:
            peers[label] = make()
        except Exception as e:  # a missing peer is reported, not fatal
            missing[label] = f"{type(e).__name__}: {e}"
    return peers, missing


def bench_model(name: str, batch: int, iters: int) -> tuple[list[list[str]], dict]:
    from _peers import MODELS, dynamic_exports

    model_dir = MODELS / name
    x1 = np.load(model_dir / "input.npy")
    size = x1.shape[-1]
    x = np.repeat(x1, batch, axis=0)
    param_dir = model_dir if batch == 1 else dynamic_exports(name, batch)
    runners = {"nnserve-cuda": Nnserve(param_dir / "model.pnnx.param", batch, size)}
    peers, missing = _peers(name, param_dir)
    runners.update(peers)
    ours = runners["nnserve-cuda"](x)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(3):  # warm up (kernel compilation, cuDNN autotune)
        for fn in runners.values():
            fn(x)
    for i in range(iters):
        order = list(runners.items())
        for label, fn in order[i % len(order):] + order[:i % len(order)]:
            t = time.perf_counter()
            fn(x)
            times[label].append(time.perf_counter() - t)
    rows = []
    for label, ts in times.items():
        diff = float(np.abs(runners[label](x) - ours).max())
        med = statistics.median(ts) * 1e3
        rows.append([name, str(batch), label, f"{med:.2f}", f"{batch / (med / 1e3):.1f}", f"{diff:.2e}"])
    return rows, missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=NAMES)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-record", action="store_true", help="print only; do not append to bench/RESULTS.md")
    args = ap.parse_args(argv)
    gpu = gpu_name()
    if gpu is None:
        print("not measured: no GPU (numba.cuda found no CUDA device)")
        return 0
    rows, notes = [], {}
    for name in args.models:
        for batch in args.batches:
            got, missing = bench_model(name, batch, args.iters)
            rows += got
            notes.update(missing)
            for r in got:
                print("  ".join(r), flush=True)
    from _results import append_run, markdown_table

    table = markdown_table(["model", "batch", "engine", "median ms", "images/s", "max abs diff vs nnserve"], rows)
    body = f"GPU: {gpu}\n\n{table}\n" + "".join(f"\nNot measured: {k} ({v})\n" for k, v in notes.items())
    print(body)
    if not args.no_record:
        append_run("GPU", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
