"""Load time and peak memory of model loading, each model in a fresh process.

    python tools/measure_load.py MODEL.pnnx.param|MODEL.tnnproto ...
    python tools/measure_load.py --synthetic DIR   # also writes and measures large synthetic models in DIR

For each model, each step in its own process: the format reader alone (`read`), the whole `engine.load` (read,
lower, passes) and `instance` (load, then compile for the CPU, which touches the weights it packs): wall seconds,
and the peak RSS the step added over the process's RSS just before it (VmHWM is reset through
/proc/self/clear_refs first, so the peak is the step's own). The synthetic models hold one large table
(a 30522 x 768 float32 embedding, BERT-base's, 94 MB) plus a 768 x 768 linear layer, as pnnx and as TNN (fp32
and fp16), so that weight copies show in the numbers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys, time
from pathlib import Path
import engine
from engine.formats.registry import format_of

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

path, step = sys.argv[1], sys.argv[2]
fn = {"read": format_of(path).read, "load": engine.load, "instance": lambda p: engine.load(p).instance()}[step]
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current RSS
before = status("VmRSS:")
t0 = time.perf_counter()
result = fn(path)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "peak_added": status("VmHWM:") - before,
                  "rss_added": status("VmRSS:") - before}))
"""

MB = 1 << 20
PARAM = """7767517
4 4
pnnx.Input               pnnx_input_0             0 1 0 #0=(1,8)i64
nn.Embedding             embed                    1 1 0 1 embedding_dim=768 num_embeddings=30522 @weight=(30522,768)f32 #0=(1,8)i64 #1=(1,8,768)f32
nn.Linear                fc                       1 1 1 2 bias=True in_features=768 out_features=768 @bias=(768)f32 @weight=(768,768)f32 #1=(1,8,768)f32 #2=(1,8,768)f32
pnnx.Output              pnnx_output_0            1 0 2
"""  # noqa: E501


def write_synthetic(folder: Path) -> list[Path]:
    import engine
    from engine.formats.pnnx.writer import write_pnnx
    from engine.formats.tnn.writer.write import write_tnn

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    weights = {"embed.weight": rng.standard_normal((30522, 768), np.float32),
               "fc.weight": rng.standard_normal((768, 768), np.float32),
               "fc.bias": rng.standard_normal(768, np.float32)}
    pnnx = write_pnnx(folder / "embed.pnnx.param", PARAM, weights)
    graph = engine.load(pnnx).graph
    tnn32, _ = write_tnn(graph, folder / "embed_fp32", version=2)
    tnn16, _ = write_tnn(graph, folder / "embed_fp16", version=2, fp16=True)
    return [pnnx, tnn32, tnn16]


def measure(path: Path, step: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), step], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--synthetic", type=Path, help="write the synthetic models into this folder and measure them")
    ap.add_argument("--repeat", type=int, default=3, help="processes per model and step; the median is shown")
    args = ap.parse_args()
    models = list(args.models) + (write_synthetic(args.synthetic) if args.synthetic else [])
    print(f"{'model':48} {'weights MB':>10} {'step':>8} {'seconds':>8} {'peak +MB':>9} {'kept +MB':>9}")
    for path in models:
        weights = sum(p.stat().st_size for p in path.parent.glob(path.name.split(".")[0] + ".*")
                      if p.suffix in (".bin", ".tnnmodel"))
        for step in ("read", "load", "instance"):
            runs = sorted((measure(path, step) for _ in range(args.repeat)), key=lambda r: r["seconds"])
            mid = runs[len(runs) // 2]
            print(f"{str(path)[-48:]:48} {weights / MB:10.1f} {step:>8} {mid['seconds']:8.3f} "
                  f"{mid['peak_added'] / MB:9.1f} {mid['rss_added'] / MB:9.1f}")


if __name__ == "__main__":
    main()
