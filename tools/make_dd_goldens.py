"""Writes tests/fixtures/pnnx_dd/<case>/: tiny real pnnx exports of detection post-processing after a boolean
mask (x[keep], masked_select): torch.cat of the kept rows along either axis, slices, views, reductions, topk and
shape queries of them, each with torch's outputs for three inputs: some rows kept, none kept, all kept.

Run with the dev environment (torch + pnnx): `<dev venv>/bin/python tools/make_dd_goldens.py [case ...]`.
Each case folder holds model.pnnx.param, model.pnnx.bin and io_<run>.npz (in0, in1, and out0.. or, where torch
raises for that input, `raises` with its message). A case whose name ends in `_dyn` is exported with inputshape2
(dynamic row count), which keeps a view(-1, ...) a -1 where a static export folds it to the traced shape.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pnnx_export import trace_and_convert  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "pnnx_dd"
ROWS = 6


def _keep(s):
    return s > 0.5


def _sorted_plus_index(v):
    values, indices = torch.sort(v, descending=True)
    return values + indices.float()


def _area(boxes):
    x1, y1, x2, y2 = boxes.unbind(1)
    return (x2 - x1) * (y2 - y1)


CASES: dict[str, Callable] = {
    "cat_columns": lambda x, s: torch.cat([x[_keep(s)], s[_keep(s)].unsqueeze(1)], 1),
    "cat_rows_two_masks": lambda x, s: torch.cat([x[_keep(s)], x[s < -0.5]], 0),
    "cat_rows_with_static": lambda x, s: torch.cat([x[_keep(s)], x], 0),
    "cat_rows_then_sum": lambda x, s: torch.cat([x[_keep(s)], x[s < -0.5]], 0).sum(0),
    "slice_columns": lambda x, s: x[_keep(s)][:, :2],
    "slice_rows": lambda x, s: x[_keep(s)][:3],
    "slice_last_rows": lambda x, s: x[_keep(s)][-2:],
    "slice_rows_step": lambda x, s: x[_keep(s)][1::2],
    "view_dyn": lambda x, s: x[_keep(s)].view(-1, 2),
    "view_fixed": lambda x, s: x[_keep(s)].view(-1, 2),
    "flatten": lambda x, s: x[_keep(s)].flatten(),
    "sum_rows": lambda x, s: x[_keep(s)].sum(0),
    "sum_columns": lambda x, s: x[_keep(s)].sum(1),
    "sum_all": lambda x, s: torch.masked_select(s, _keep(s)).sum(),
    "mean_rows": lambda x, s: x[_keep(s)].mean(0),
    "mean_columns": lambda x, s: x[_keep(s)].mean(1),
    "max_rows": lambda x, s: x[_keep(s)].max(0)[0],
    "amax_columns": lambda x, s: x[_keep(s)].amax(1),
    "min_rows": lambda x, s: x[_keep(s)].amin(0),
    "topk_kept": lambda x, s: torch.topk(s[_keep(s)], 2)[0],
    "topk_columns": lambda x, s: torch.topk(x[_keep(s)], 2, dim=1)[0],
    "detections": lambda x, s: torch.cat([x[_keep(s)][:, :4] * 2.0, s[_keep(s)].unsqueeze(1)], 1)[:100],
    "sort_kept": lambda x, s: _sorted_plus_index(s[_keep(s)]),
    "argsort_kept": lambda x, s: torch.argsort(s[_keep(s)]),
    "order_detections": lambda x, s: torch.cat([x[_keep(s)], s[_keep(s)].unsqueeze(1)], 1)[
        s[_keep(s)].argsort(descending=True)][:2],
    "stack_columns": lambda x, s: torch.stack([x[_keep(s)][:, 0], s[_keep(s)]], 1),
    "unbind_columns": lambda x, s: _area(x[_keep(s)]),
    "chunk_columns": lambda x, s: x[_keep(s)].chunk(2, 1)[1] * 2,
    "split_columns": lambda x, s: torch.split(x[_keep(s)], [1, 3], 1)[1],
    "chunk_rows": lambda x, s: x[_keep(s)].chunk(2, 0)[0],
    "size_query_dyn": lambda x, s: torch.arange(x[_keep(s)].size(0)),
    "softmax_kept": lambda x, s: torch.softmax(s[_keep(s)], 0),
}


class Wrap(torch.nn.Module):
    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, x, s):
        return self.fn(x, s)


def inputs(rng: np.random.Generator) -> dict[str, list[np.ndarray]]:
    x = rng.standard_normal((ROWS, 4)).astype(np.float32)
    some = np.array([0.9, -0.8, 0.7, 0.1, 0.95, -0.6], np.float32)
    return {"some": [x, some], "none": [x, np.zeros(ROWS, np.float32)], "all": [x, np.ones(ROWS, np.float32)]}


def run_torch(model: torch.nn.Module, xs: list[np.ndarray]) -> dict[str, np.ndarray]:
    io = {f"in{i}": x for i, x in enumerate(xs)}
    try:
        with torch.no_grad():
            outs = model(*(torch.from_numpy(x.copy()) for x in xs))
    except (RuntimeError, IndexError) as e:
        return io | {"raises": np.array(str(e).splitlines()[0])}
    outs = outs if isinstance(outs, tuple) else (outs,)
    return io | {f"out{i}": o.numpy() for i, o in enumerate(outs)}


def export(name: str, runs: dict[str, list[np.ndarray]]) -> None:
    model = Wrap(CASES[name]).eval()
    xs = runs["some"]
    shapes = f"[{ROWS},4]f32,[{ROWS}]f32"
    shapes2 = f"[{ROWS + 2},4]f32,[{ROWS + 2}]f32" if name.endswith("_dyn") else None
    trace_and_convert(model, xs, shapes, shapes2, OUT / name)
    for run, arrays in runs.items():
        np.savez_compressed(OUT / name / f"io_{run}.npz", **run_torch(model, arrays))
    print(name, "exported")


def main(names: list[str]) -> None:
    runs = inputs(np.random.default_rng(18))
    for name in names or CASES:
        export(name, runs)


if __name__ == "__main__":
    main(sys.argv[1:])
