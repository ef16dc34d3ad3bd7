"""A loaded model owns its weights (issue 17, item 1): after `engine.load` no handle or mapping of its files stays
open, and rewriting the files in place (same size, other bytes), truncating or deleting them changes nothing in a
run's outputs and raises no signal (a mapped file truncated under the process used to kill it with SIGBUS).
Every constant of the loaded graph is read-only and 64-byte aligned.

The model runs in a child process, so that a regression that brings SIGBUS back fails this test instead of
killing the test session."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

CHILD = r"""
import json, os, sys
import numpy as np
import engine
from engine.ir.const_arrays import is_frozen

graph_file, inputs_file = sys.argv[1], sys.argv[2]
folder = os.path.dirname(graph_file)
x = dict(np.load(inputs_file))

def held():
    maps = [line.split()[-1] for line in open("/proc/self/maps") if folder in line]
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    return maps + [link for link in fds if folder in link]

model = engine.load(graph_file)
report = {"held_after_load": held()}
arrays = [v.const for v in model.graph.values() if v.const is not None]
arrays += [a for n in model.graph.nodes for a in n.attrs.values() if isinstance(a, np.ndarray)]
report["constants"] = len(arrays)
report["not_frozen"] = sum(not is_frozen(a) for a in arrays if a.nbytes)
instance = model.instance()
before = instance.run(x)
report["held_after_run"] = held()
changed = []
names = sorted(os.listdir(folder))
for step in ("rewrite", "truncate_half", "truncate_empty", "delete"):
    for name in names:
        path = os.path.join(folder, name)
        if step == "rewrite":  # same size, every byte inverted
            with open(path, "r+b") as f:
                data = f.read()
                f.seek(0)
                f.write(bytes(255 - b for b in data))
        elif step == "truncate_half":
            os.truncate(path, os.path.getsize(path) // 2)
        elif step == "truncate_empty":
            os.truncate(path, 0)
        else:
            os.remove(path)
    after = instance.run(x)
    if any(not np.array_equal(before[k], after[k], equal_nan=True) for k in before):
        changed.append(step)
report["changed_by"] = changed
print(json.dumps(report))
"""

MODELS = [("pnnx", "resnet", "model.pnnx.param"), ("pnnx", "transformer", "model.pnnx.param"),
          ("tnn", "misc_conv_resize_v1", "model.tnnproto"), ("tnn", "unet_v1_fp16", "model.tnnproto"),
          ("tnn", "transformer_v2", "model.tnnproto")]


@pytest.mark.parametrize(("kind", "name", "graph_file"), MODELS, ids=[f"{k}-{n}" for k, n, _ in MODELS])
def test_files_changed_after_load_change_nothing(tmp_path: Path, kind: str, name: str, graph_file: str) -> None:
    source = FIXTURES / kind / name
    folder = tmp_path / "model"
    folder.mkdir()
    for f in source.glob("model.*"):
        shutil.copy(f, folder / f.name)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(folder / graph_file), str(source / "inputs.npz")],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode != -signal.SIGBUS, "SIGBUS: a weight was still mapped from the truncated file"
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["held_after_load"] == [] and report["held_after_run"] == [], report
    assert report["changed_by"] == [], report
    assert report["constants"] > 0 and report["not_frozen"] == 0, report
