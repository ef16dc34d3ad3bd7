"""Bit-identity check of the int8 bench models across a kernel change: runs every bench/models/<name>/int8/
int8_b<B>.tnnproto (made by bench/int8.py) on fixed inputs, on one thread and on two, and saves the outputs, or
compares them with saved ones byte for byte.

    .venv/bin/python bench/int8_exact.py save /tmp/int8-before      # on the source before the change
    .venv/bin/python bench/int8_exact.py compare /tmp/int8-before   # after it: exit status 1 on any difference

Inputs are seeded normal noise at three amplitudes (the larger ones saturate the input quantization and push
sums to their extremes), so that every conv way, tile and rounding path sees both typical and extreme values.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [p for p in sys.path if p not in (str(ROOT), "")]

import engine  # noqa: E402
from engine.devices.cpu import threads  # noqa: E402

MODELS = ROOT / "bench" / "models"
AMPLITUDES = (0.5, 1.0, 4.0)


def outputs(thread_count: int) -> dict[str, np.ndarray]:
    """'<model>/b<B>/t<T>/<amplitude>/<output>' -> the output, for every int8 bench model found."""
    threads.set_threads(thread_count)
    found: dict[str, np.ndarray] = {}
    for path in sorted(MODELS.glob("*/int8/int8_b*.tnnproto")):
        name, batch = path.parents[1].name, int(path.stem.rpartition("_b")[2])
        hw = (240, 320) if name == "ultraface" else (224, 224)
        model = engine.load(path)
        x_name = model.inputs[0].name
        inst = model.instance(max_shapes={x_name: (batch, 3) + hw})
        noise = np.random.default_rng(batch).standard_normal((batch, 3) + hw).astype(np.float32)
        for amp in AMPLITUDES:
            for out_name, a in inst.run({x_name: noise * np.float32(amp)}).items():
                found[f"{name}/b{batch}/t{thread_count}/{amp}/{out_name}"] = np.array(a)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["save", "compare"])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    got = {**outputs(1), **outputs(2)}
    if not got:
        raise SystemExit(f"no int8 bench models under {MODELS} (bench/int8.py prepares them)")
    saved = args.folder / "outputs.npz"
    if args.mode == "save":
        args.folder.mkdir(parents=True, exist_ok=True)
        np.savez(saved, **got)
        print(f"saved {len(got)} outputs to {saved}")
        return 0
    with np.load(saved) as z:
        want = {k: z[k] for k in z.files}
    bad = sorted(k for k in want.keys() | got.keys()
                 if k not in want or k not in got or want[k].dtype != got[k].dtype
                 or want[k].shape != got[k].shape or want[k].tobytes() != got[k].tobytes())
    for k in bad:
        print(f"DIFFERS: {k}")
    print(f"{len(want.keys() & got.keys()) - len(bad)} of {len(want.keys() | got.keys())} outputs bit-identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
