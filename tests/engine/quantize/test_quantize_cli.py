"""`nnserve quantize` on the command line: calibration files, the progress bar, the report, the JSON report, and
errors as one line."""

from __future__ import annotations

import json

import numpy as np

import engine
from engine.cli import main


def test_quantize_command(tmp_path, load_fixture, capsys):
    fx = load_fixture("resnet")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(3)
    for k in range(5):  # without the batch axis: the command adds it
        np.save(calib / f"x{k}.npy", rng.standard_normal((3, 64, 64)).astype(np.float32))
    (calib / "notes.txt").write_text("not an input")
    out, report = tmp_path / "int8" / "resnet", tmp_path / "report.json"
    status = main(["quantize", str(fx.param), "-c", str(calib), "-o", str(out), "--method", "percentile",
                   "--report", str(report), "--report-samples", "2"])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    assert "calibrating" in printed.err and "calibration ranges [" in printed.err
    assert "calibration histograms [" in printed.err and "5/5" in printed.err
    assert "output out0: cosine" in printed.out and "TnnQConv" in printed.out
    rows = json.loads(report.read_text())
    assert rows["layers"] and {"name", "op", "cosine", "max_abs"} <= set(rows["layers"][0])
    model = engine.load(out.with_suffix(".tnnproto"))
    assert model.op_counts()["TnnQConv"] >= 10


def test_quantize_errors_are_one_line(tmp_path, load_fixture, capsys):
    fx = load_fixture("resnet")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["quantize", str(fx.param), "-c", str(empty), "-o", str(tmp_path / "q")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {empty}: no .npy, .npz or image files to calibrate on"
    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "x.npy", np.zeros((1, 3, 32, 32), np.float32))
    assert main(["quantize", str(fx.param), "-c", str(bad), "-o", str(tmp_path / "q")]) == 2
    assert "does not fit input 'in0'" in capsys.readouterr().err
