"""Load time against op count: generated .pnnx.param chains of N element-wise ops, timed through engine.load()
(read, lowering, passes). Not a test. Linear bookkeeping shows as a flat time per op across N.

    python bench/load_scaling.py [--sizes 1000 5000 20000] [--profile]

Each chain alternates the kinds of node the lowering handles differently: a module op turned into its canonical op
in place (nn.ReLU), a functional op with a scalar argument (torch.mul by an input-less expression), a
pnnx.Expression lowered to several nodes (`add(@0,1.0)` and a residual `add(@0,@1)` reading the graph input, whose
consumer list grows with N), and an identity (nn.Dropout) the lowering bypasses.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before bench/engine.py

import engine  # noqa: E402

SHAPE = "(1,8)f32"


def chain_param(n: int) -> str:
    """A .pnnx.param text with `n` element-wise operators between one input and one output."""
    lines = [f"pnnx.Input in0 0 1 v0 #v0={SHAPE}"]
    cur, k = "v0", 0
    for i in range(n):
        k += 1
        out = f"v{k}"
        kind = i % 4
        if kind == 0:
            lines.append(f"nn.ReLU relu_{i} 1 1 {cur} {out} #{cur}={SHAPE} #{out}={SHAPE}")
        elif kind == 1:
            lines.append(f"pnnx.Expression expr_{i} 1 1 {cur} {out} expr=add(@0,1.000000e+00) "
                         f"#{cur}={SHAPE} #{out}={SHAPE}")
        elif kind == 2:
            lines.append(f"pnnx.Expression res_{i} 2 1 {cur} v0 {out} expr=add(@0,@1) "
                         f"#{cur}={SHAPE} #v0={SHAPE} #{out}={SHAPE}")
        else:
            lines.append(f"nn.Dropout drop_{i} 1 1 {cur} {out} #{cur}={SHAPE} #{out}={SHAPE}")
        cur = out
    lines.append(f"pnnx.Output out0 1 0 {cur} #{cur}={SHAPE}")
    return f"7767517\n{len(lines)} {k + 1}\n" + "\n".join(lines) + "\n"


def write_chain(directory: Path, n: int) -> Path:
    path = directory / f"chain{n}.pnnx.param"
    path.write_text(chain_param(n))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000])
    ap.add_argument("--profile", action="store_true", help="cProfile the largest size; print the top functions")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine.load(write_chain(Path(tmp), 8))  # first use: imports and compiled kernels, not counted below
        for n in args.sizes:
            path = write_chain(Path(tmp), n)
            t0 = time.perf_counter()
            model = engine.load(path)
            dt = time.perf_counter() - t0
            print(f"N={n:6d}  load {dt:7.2f} s  {dt / n * 1e6:7.1f} us/op  nodes after passes: "
                  f"{len(model.graph.nodes)}", flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(engine.load, write_chain(Path(tmp), max(args.sizes)))
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
