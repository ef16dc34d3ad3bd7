"""The engine CLI as a user runs it: a subprocess on a tiny PNNX model written by the test, and on a committed
TNN fixture."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from engine.formats.pnnx.writer import write_pnnx

# Every case starts a Python process that imports numpy and numba: a few seconds each.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
rng = np.random.default_rng(7)
W = rng.standard_normal((3, 4)).astype(np.float32)
B = rng.standard_normal(3).astype(np.float32)

PARAM = """7767517
4 4
pnnx.Input               pnnx_input_0             0 1 0 #0=(?,4)f32
nn.Linear                fc                       1 1 0 1 bias=True in_features=4 out_features=3 \
@bias=(3)f32 @weight=(3,4)f32 #0=(?,4)f32 #1=(?,3)f32
{act:<24} act                      1 1 1 2 #1=(?,3)f32 #2=(?,3)f32
pnnx.Output              pnnx_output_0            1 0 2 #2=(?,3)f32
"""


def write_model(folder: Path, act: str = "nn.ReLU") -> Path:
    text = PARAM.format(act=act)
    return write_pnnx(folder / "model.pnnx.param", text, {"fc.weight": W, "fc.bias": B})


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def model(tmp_path) -> Path:
    return write_model(tmp_path)


def test_run_writes_outputs_matching_numpy(model, tmp_path):
    x = rng.standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    r = cli("run", model, "--input", f"in0={tmp_path / 'x.npy'}", "--output-dir", out_dir, "--max-shape", "in0=8x4")
    assert r.returncode == 0, r.stderr
    (name,) = [p.stem for p in out_dir.glob("*.npy")]
    got = np.load(out_dir / f"{name}.npy")
    np.testing.assert_allclose(got, np.maximum(x @ W.T + B, 0), rtol=1e-5, atol=1e-6)
    assert "time: compute" in r.stdout and f"{name}: float32 [5, 3]" in r.stdout


def test_run_profile_prints_time_per_op_kind_and_node(tmp_path):
    model = write_model(tmp_path, "nn.Hardswish")
    x = rng.standard_normal((5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("run", model, "--input", f"in0={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out", "--repeat", "4",
            "--profile", "--profile-nodes", "0")
    assert r.returncode == 0, r.stderr
    report = r.stdout.split("profile: ", 1)[1]
    assert report.startswith("4 run(s),")
    kinds, nodes = report.split("\n\n")[1:3]
    assert kinds.splitlines()[0].split()[:4] == ["op", "nodes", "ms/run", "share"]
    assert kinds.splitlines()[1].split()[0] == "Gemm"  # the activation is fused into it: one node
    assert nodes.splitlines()[1].split()[:2] == ["fc", "Gemm"]
    assert nodes.splitlines()[1].split()[-1].startswith(("onednn:", "cpu/linear"))  # the kernel that ran it
    assert "fallback (numpy reference" not in r.stdout


def test_inspect_shows_specs_ops_and_memory_plan(model):
    r = cli("inspect", model, "--max-shape", "in0=16x4")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "format: pnnx" in out and "in0  FP32  [-1, 4]" in out
    for label in ("naive", "peak live", "arena", "workspace", "weights"):
        assert f"  {label} " in out
    assert "max shapes in0=16x4" in out
    r = cli("inspect", model)  # dynamic input without a max: still a summary, plan explains what is missing
    assert r.returncode == 0 and "memory plan: not available" in r.stdout and "max_shapes" in r.stdout


def test_inspect_lists_unsupported_ops_without_crashing(tmp_path):
    model = write_model(tmp_path, act="nn.Frobnicate")
    r = cli("inspect", model)
    assert r.returncode == 0, r.stderr
    assert "unsupported ops (1 nodes):" in r.stdout and "Frobnicate" in r.stdout and "model.pnnx.param:" in r.stdout
    r = cli("run", model, "--output-dir", tmp_path)
    assert r.returncode == 2 and "Frobnicate" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "refused").mkdir()
    refused = write_model(tmp_path / "refused", act="aten::zero")  # refused on purpose: the reason is listed too
    r = cli("inspect", refused)
    assert r.returncode == 0 and "aten::zero  node 'act'  at model.pnnx.param:5 (an in-place zero_()" in r.stdout


def test_user_errors_are_one_line_and_exit_2(model, tmp_path):
    np.save(tmp_path / "x64.npy", np.zeros((2, 4)))
    cases = [
        (("run", tmp_path / "model.onnx"), "supported: MODEL.pnnx.param, MODEL.tnnproto"),
        (("run", model, "--input", f"in0={tmp_path / 'missing.npy'}"), "cannot read input array"),
        (("run", model, "--input", f"in0={tmp_path / 'x64.npy'}"), "expected dtype float32, got float64"),
        (("run", model, "--max-shape", "in0=axb"), "NAME=DxDx...D"),
    ]
    # independent processes that read and write nothing shared: started at once, their imports overlap
    with ThreadPoolExecutor(len(cases)) as pool:
        runs = list(pool.map(lambda case: cli(*case[0]), cases))
    for (args, message), r in zip(cases[:-1], runs, strict=False):
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and message in r.stderr and "Traceback" not in r.stderr
    r = runs[-1]
    assert r.returncode == 2 and "NAME=DxDx...D" in r.stderr


@pytest.mark.parametrize("extra", [[], ["--fp16", "--tnn-version", "1"]], ids=["v2_fp32", "v1_fp16"])
def test_convert_to_tnn_then_run_the_converted_model(model, tmp_path, extra):
    r = cli("convert", model, "--to", "tnn", "--output", tmp_path / "conv", *extra)
    assert r.returncode == 2 and "--input-shape" in r.stderr  # the test model's batch dim is dynamic
    r = cli("convert", model, "--to", "tnn", "--output", tmp_path / "conv", "--input-shape", "in0=2x4", *extra)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "conv.tnnproto").exists() and (tmp_path / "conv.tnnmodel").exists()
    import engine

    converted = engine.load(tmp_path / "conv.tnnproto")
    (spec,) = converted.inputs
    x = rng.standard_normal(spec.shape).astype(np.float32)  # TNN protos hold fixed shapes
    (y,) = converted.instance().run({spec.name: x}).values()
    tol = 2e-3 if extra else 1e-5  # fp16 weights
    np.testing.assert_allclose(y.reshape(x.shape[0], 3), np.maximum(x @ W.T + B, 0), rtol=tol, atol=tol)


# -- TNN: a committed fixture (tests/fixtures/tnn, made by tools/make_tnn_fixtures.py from PyTorch) ----------------
TNN_FIXTURE = REPO / "tests" / "fixtures" / "tnn" / "misc_conv_resize_v1"


def test_run_tnn_fixture_matches_pytorch_and_reports_the_median(tmp_path):
    inputs, expected = np.load(TNN_FIXTURE / "inputs.npz"), np.load(TNN_FIXTURE / "expected.npz")
    feeds = []
    for name in inputs.files:
        np.save(tmp_path / f"{name}.npy", inputs[name])
        feeds += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    out_dir = tmp_path / "out"
    r = cli("run", TNN_FIXTURE / "model.tnnproto", *feeds, "--output-dir", out_dir, "--warmup", "1", "--repeat", "3")
    assert r.returncode == 0, r.stderr
    assert "(median of 3 runs after 1 warm-up)" in r.stdout
    assert sorted(p.stem for p in out_dir.glob("*.npy")) == sorted(expected.files)
    for name in expected.files:
        ref = expected[name]
        scale = max(float(np.abs(ref).max()), 1e-12)
        assert float(np.abs(np.load(out_dir / f"{name}.npy") - ref).max()) / scale < 1e-4, name
    r = cli("run", TNN_FIXTURE / "model.tnnproto", *feeds, "--output-dir", out_dir, "--repeat", "0")
    assert r.returncode == 2 and "expected an integer >= 1" in r.stderr


def test_inspect_tnn_fixture(tmp_path):
    r = cli("inspect", TNN_FIXTURE / "model.tnnproto")
    assert r.returncode == 0, r.stderr
    assert "format: tnn" in r.stdout and "in0  FP32  [1, 8, 16, 12]" in r.stdout
    assert "  Conv " in r.stdout and "  arena " in r.stdout and "  weights " in r.stdout


def test_inspect_graph_only_needs_no_weights(tmp_path):
    (tmp_path / "model.tnnproto").write_bytes((TNN_FIXTURE / "model.tnnproto").read_bytes())  # no .tnnmodel
    r = cli("inspect", "--graph-only", tmp_path / "model.tnnproto")
    assert r.returncode == 0, r.stderr
    assert "no weights read" in r.stdout and "in0  float32  [1, 8, 16, 12]" in r.stdout
    assert "tnn:Convolution" in r.stdout and "memory plan" not in r.stdout
    r = cli("inspect", tmp_path / "model.tnnproto")  # the full inspect does need them
    assert r.returncode == 2 and "weights file missing" in r.stderr


def test_truncated_tnnmodel_is_one_line_naming_the_byte_offset(tmp_path):
    (tmp_path / "model.tnnproto").write_bytes((TNN_FIXTURE / "model.tnnproto").read_bytes())
    (tmp_path / "model.tnnmodel").write_bytes((TNN_FIXTURE / "model.tnnmodel").read_bytes()[:3000])
    for command in ("run", "inspect"):
        r = cli(command, tmp_path / "model.tnnproto")
        assert r.returncode == 2, (command, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr
        assert "model.tnnmodel at byte " in lines[0] and "truncated" in lines[0]


@pytest.mark.parametrize("variable, value, accepted", [
    ("NNSERVE_NUM_THREADS", "two", "expected a whole number of threads"),
    ("NNSERVE_LAYOUT", "nhwc", "expected one of blocked, nchw"),
    ("NNSERVE_WAIT_POLICY", "spin", "expected one of short, run"),
])
def test_an_invalid_setting_stops_the_cli_naming_it(model, variable, value, accepted):
    r = subprocess.run([sys.executable, "-m", "engine.cli", "inspect", str(model)], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env={**os.environ, variable: value})
    assert r.returncode != 0 and f"{variable}={value!r}: {accepted}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not r.stdout
