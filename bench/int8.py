"""Int8 bench: nnserve's int8 (TNN int8 files made by `nnserve quantize`) against nnserve's float32 and ONNX
Runtime's static int8 (onnxruntime.quantization: QDQ, per-channel weights) and float32, on MobileNetV2, ResNet-18
and UltraFace, at batch 1 and 8.

    .venv-dev/bin/python bench/int8.py                       # appends its table to bench/RESULTS.md
    .venv-dev/bin/python bench/int8.py ultraface --batches 1 --no-record

Needs the bench models (`.venv-dev/bin/python tools/make_fixtures.py --bench`), the dev extra (torch, pnnx, onnx,
onnxruntime) and, for UltraFace, its ONNX release in ../shared/models/tnn/ultraface_slim320. Models are prepared
once into bench/models/<name>/int8/: dynamic-batch PNNX and ONNX exports, our int8 file per batch and ORT's int8
ONNX, both calibrated on the same inputs (16 normal-noise images for the random-weight classifiers; variants of
examples/photos/astronaut.png for UltraFace).

Every engine runs alone in its own process with its shipped defaults (ours: the CPUs the process may use, at most 8,
OpenMP threads sleeping between primitives; ORT: its default session options). The processes take turns: each
round asks each one in rotating order for a few timed runs while the others wait, so machine noise hits all of
them alike; the figures are the median and p90 over all rounds. Outputs are compared with the float32 model's
(cosine) so that a fast wrong answer cannot win; memory is the instance's arena + workspace and the model's
weights, in bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

_BENCH, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
sys.path[:] = [_ROOT, _BENCH] + [p for p in sys.path if p not in (_BENCH, _ROOT, "")]

from _results import append_run, markdown_table  # noqa: E402

ROOT = Path(_ROOT)
MODELS = ROOT / "bench" / "models"
SHARED_ULTRAFACE = ROOT.parent / "shared" / "models" / "tnn" / "ultraface_slim320" / "version-slim-320_simplified.onnx"
PHOTO = ROOT / "examples" / "photos" / "astronaut.png"
NAMES = ["mobilenet_v2", "resnet18", "ultraface"]
ENGINES = ["nnserve-fp32", "nnserve-int8", "ort-fp32", "ort-int8"]
CALIBRATION = 16


# -- preparation (parent process, dev venv) --------------------------------------------------------------------
def _ultraface_exports(out: Path, onnx_path: Path) -> None:
    """The PyTorch rebuild of UltraFace (tools/make_ultraface_pnnx.py) exported with a dynamic batch."""
    import warnings

    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    from _fixture_io import export_pnnx
    from make_ultraface_pnnx import UltraFaceSlim, load_onnx_weights

    if not onnx_path.exists():
        raise SystemExit(f"UltraFace's ONNX release is not at {onnx_path} (--ultraface-onnx)")
    model = UltraFaceSlim()
    load_onnx_weights(model, onnx_path)
    model.eval()
    x1, x8 = torch.zeros(1, 3, 240, 320), torch.zeros(8, 3, 240, 320)
    paths = export_pnnx(model, [x1], ROOT / ".fixture-work" / "bench-int8" / "ultraface", "ultraface", inputs2=[x8])
    out.mkdir(parents=True, exist_ok=True)
    for key in ("param", "bin"):
        (out / f"model.pnnx.{key}").write_bytes(paths[key].read_bytes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x1,), str(out / "model.onnx"), input_names=["in0"], output_names=["out0", "out1"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={"in0": {0: "batch"}, "out0": {0: "batch"}, "out1": {0: "batch"}})


def _calibration(name: str) -> list[np.ndarray]:
    """(1, 3, H, W) float32 inputs: normal noise for the classifiers, photo variants for UltraFace."""
    rng = np.random.default_rng(0)
    if name != "ultraface":
        return [rng.standard_normal((1, 3, 224, 224)).astype(np.float32) for _ in range(CALIBRATION)]
    from engine.quantize.images import read_image, resize_bilinear

    img = read_image(PHOTO)
    h, w = img.shape[:2]
    out = []
    for k in range(CALIBRATION):
        dy, dx = rng.integers(-8, 9, 2)
        a = np.pad(img, ((8, 8), (8, 8), (0, 0)), mode="edge")[8 + dy:8 + dy + h, 8 + dx:8 + dx + w]
        a = np.clip(a.astype(np.float32) * rng.uniform(0.8, 1.2), 0, 255)
        a = a[:, ::-1] if k % 2 else a
        out.append(((resize_bilinear(a, (240, 320)) - 127.0) / 128.0).transpose(2, 0, 1)[None].copy())
    return out


def prepare(name: str, batches: list[int], ultraface_onnx: Path = SHARED_ULTRAFACE) -> Path:
    """bench/models/<name>/int8/: model.pnnx.* and model.onnx (dynamic batch), int8_b<B>.tnn*, model_int8.onnx."""
    out = MODELS / name / "int8"
    if not (out / "model.onnx").exists():
        if name == "ultraface":
            _ultraface_exports(out, ultraface_onnx)
        else:
            from _peers import dynamic_exports

            dyn = dynamic_exports(name)
            out.mkdir(parents=True, exist_ok=True)
            for f in ("model.pnnx.param", "model.pnnx.bin", "model.onnx"):
                (out / f).write_bytes((dyn / f).read_bytes())
    samples = _calibration(name)
    from engine.quantize import QuantizeOptions, quantize

    for b in batches:
        if not (out / f"int8_b{b}.tnnproto").exists():
            print(f"{name}: nnserve quantize (batch {b})", flush=True)
            quantize(out / "model.pnnx.param", [{"in0": x} for x in samples], out / f"int8_b{b}",
                     QuantizeOptions(batch=b, report_samples=0))
    if not (out / "model_int8.onnx").exists():
        print(f"{name}: onnxruntime.quantization.quantize_static (QDQ, per channel)", flush=True)
        _ort_quantize(out / "model.onnx", out / "model_int8.onnx", samples)
    return out


def _ort_quantize(src: Path, dst: Path, samples: list[np.ndarray]) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = dst.with_name("model_pre.onnx")
    quant_pre_process(str(src), str(pre))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"in0": x} for x in samples])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(pre), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    pre.unlink()


# -- workers (one process per engine) --------------------------------------------------------------------------
def worker(engine_name: str, folder: Path, batch: int, out_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((batch, 3) + _hw(folder)).astype(np.float32)
    if engine_name.startswith("nnserve"):
        import engine

        path = folder / ("model.pnnx.param" if engine_name == "nnserve-fp32" else f"int8_b{batch}.tnnproto")
        model = engine.load(path)
        name = model.inputs[0].name
        inst = model.instance(max_shapes={name: x.shape})
        outputs = [o.name for o in model.outputs]
        weights = sum(a.nbytes for n in model.graph.nodes for a in n.attrs.values() if isinstance(a, np.ndarray)) + \
            sum(v.const.nbytes for v in model.graph.values() if v.is_const)
        memory = {"arena": inst.memory_plan.arena_bytes + inst.memory_plan.workspace_bytes, "weights": weights}

        def run():
            out = inst.run({name: x})
            return [out[o] for o in outputs]
    else:
        import onnxruntime as ort

        path = folder / ("model.onnx" if engine_name == "ort-fp32" else "model_int8.onnx")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        memory = {"arena": None, "weights": path.stat().st_size}

        def run():
            return session.run(None, {"in0": x})
    for _ in range(3):
        result = run()
    np.savez(out_path, *[np.asarray(r, np.float32).reshape(batch, -1) for r in result])
    print(json.dumps({"ready": True, **memory}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            return
        times = []
        for _ in range(int(line)):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        print(json.dumps(times), flush=True)


def _hw(folder: Path) -> tuple[int, int]:
    return (240, 320) if folder.parent.name == "ultraface" else (224, 224)


class Worker:
    def __init__(self, engine_name: str, folder: Path, batch: int, tmp: Path):
        self.name, self.out = engine_name, tmp / f"{engine_name}_{folder.parent.name}_{batch}.npz"
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", engine_name, str(folder), str(batch),
                                      str(self.out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.memory = json.loads(self.proc.stdout.readline())

    def run(self, n: int) -> list[float]:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def outputs(self) -> list[np.ndarray]:
        with np.load(self.out) as z:
            return [z[k] for k in sorted(z.files)]

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(60)


def cosine(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    x = np.concatenate([v.ravel() for v in a]).astype(np.float64)
    y = np.concatenate([v.ravel() for v in b]).astype(np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


# The engines' processes live side by side; a pool that spins after its work (ORT's, OpenMP's, ours) would still
# hold a core when the next engine's turn starts (2 cores here), so each turn waits its spin-down out.
SETTLE_S = 0.5


def measure(name: str, folder: Path, batch: int, rounds: int, iters: int, tmp: Path) -> dict:
    workers = [Worker(e, folder, batch, tmp) for e in ENGINES]
    times: dict[str, list[float]] = {w.name: [] for w in workers}
    try:
        for r in range(rounds):
            for w in workers[r % len(workers):] + workers[:r % len(workers)]:
                time.sleep(SETTLE_S)  # the last engine's pool stops spinning before this one's turn
                times[w.name] += w.run(iters)
        ref = {"nnserve": workers[0].outputs(), "ort": workers[2].outputs()}
        cos = {w.name: cosine(w.outputs(), ref[w.name.split("-")[0]]) for w in workers}
        memory = {w.name: w.memory for w in workers}
    finally:
        for w in workers:
            w.close()
    stats = {k: (float(np.median(v)) * 1e3, float(np.percentile(v, 90)) * 1e3) for k, v in times.items()}
    return {"model": name, "batch": batch, "stats": stats, "cosine": cos, "memory": memory}


def _bytes(memory: dict, key: str, ratio: float) -> str:
    mib = [memory[e][key] / 2**20 for e in ("nnserve-int8", "nnserve-fp32")]
    return f"{mib[0]:.2f} / {mib[1]:.2f} ({ratio:.3f}x)"


def report(results: list[dict], rounds: int, iters: int) -> str:
    header = ["model", "batch", "nnserve fp32 ms", "nnserve int8 ms", "ORT fp32 ms", "ORT int8 ms",
              "int8 / our fp32", "int8 / ORT int8", "arena MiB int8 / fp32", "weights MiB int8 / fp32",
              "cosine vs fp32 (ours, ORT)"]
    rows, checks = [], []
    for r in results:
        s, m, c = r["stats"], r["memory"], r["cosine"]
        ours = s["nnserve-int8"][0] / s["nnserve-fp32"][0]
        vs_ort = s["nnserve-int8"][0] / s["ort-int8"][0]
        arena = m["nnserve-int8"]["arena"] / m["nnserve-fp32"]["arena"]
        weights = m["nnserve-int8"]["weights"] / m["nnserve-fp32"]["weights"]
        rows.append([r["model"], str(r["batch"])] + [f"{s[e][0]:.2f} / {s[e][1]:.2f}" for e in ENGINES] +
                    [f"{ours:.2f}x", f"{vs_ort:.2f}x", _bytes(m, "arena", arena), _bytes(m, "weights", weights),
                     f"{c['nnserve-int8']:.4f}, {c['ort-int8']:.4f}"])
        checks.append((r, ours, vs_ort, arena, weights))
    lines = [f"{rounds} rounds x {iters} runs per engine and round, engines in their own processes taking turns; "
             "times are median / p90 over all runs; ratios are of medians.",
             "", markdown_table(header, rows), "", "Targets:", ""]
    for label, idx, limit in (("int8 <= 0.6x our fp32", 1, 0.6), ("int8 <= 1.0x ORT's int8", 2, 1.0),
                              ("arena <= 0.3x of fp32", 3, 0.3), ("weights <= 0.3x of fp32", 4, 0.3)):
        missed = [f"{r['model']} b{r['batch']} ({v[idx - 1]:.3f}x)" for r, *v in checks if v[idx - 1] > limit]
        lines.append(f"- {label}: " + ("met" if not missed else "NOT MET on " + ", ".join(missed)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="name", help=f"{', '.join(NAMES)} (default: all)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--no-record", action="store_true", help="print only; leave bench/RESULTS.md alone")
    parser.add_argument("--ultraface-onnx", type=Path, default=SHARED_ULTRAFACE,
                        help="UltraFace's ONNX release (MIT), rebuilt in PyTorch for the dynamic-batch exports")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(NAMES)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}; choose from {', '.join(NAMES)}")
    tmp = ROOT / ".fixture-work" / "bench-int8" / "outputs"
    tmp.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.names or NAMES:
        folder = prepare(name, args.batches, args.ultraface_onnx)
        for b in args.batches:
            print(f"{name} batch {b}", flush=True)
            results.append(measure(name, folder, b, args.rounds, args.iters, tmp))
    text = report(results, args.rounds, args.iters)
    print(text)
    if not args.no_record:
        append_run("Int8", text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
