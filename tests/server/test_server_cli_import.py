"""`nnserve import`: the model's files under the names the server looks for (engine.FORMATS), a config.pbtxt the
server's own reading leaves as printed, refusals that leave the repository as it was, and a served import that
answers as PyTorch did (the committed export of docs/models.md and PyTorch's outputs for it)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from serverproc import ServerProcess

import engine
from server import config as cfg
from server import model_import as mi
from server.cli import main

REPO = Path(__file__).resolve().parents[2]
SMALLNET = REPO / "docs" / "smallnet"
DYNAMIC_BATCH = SMALLNET / "smallnet.pnnx.param"  # in0 [-1, 3, 64, 64] -> out0 [-1, 10]
ANY_SIZE = SMALLNET / "smallnet_anysize.pnnx.param"  # in0 [-1, 3, -1, -1]
BATCH_ONE_TNN = REPO / "tests" / "fixtures" / "tnn" / "two_inputs_v2" / "model.tnnproto"  # dim 0 fixed to 1
BATCH_TWO_TNN = REPO / "tests" / "fixtures" / "tnn" / "misc_shapes_v2" / "model.tnnproto"  # dim 0 fixed to 2


def nnserve(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def imported(capsys: pytest.CaptureFixture, model: Path, repo: Path, name: str, *flags: object) -> str:
    code, out, err = nnserve(capsys, "import", model, "--repository", repo, "--name", name, *flags)
    assert code == 0, err
    return out


def server_reading(model_dir: Path) -> tuple:
    """The config as a load completes it from the written config.pbtxt (server/config.py), and the model."""
    config, has_max_batch = cfg.read_config(model_dir)
    backend, graph, _ = cfg.model_files(model_dir / "1", config, model_dir.name)
    model = engine.load(graph)
    cfg.auto_complete(config, model_dir.name, backend, model, has_max_batch=has_max_batch, default_max_batch_size=4)
    cfg.validate(config, model_dir.name, model)
    return config, model


def test_files_get_the_servers_names_and_the_printed_config_is_what_the_server_reads(tmp_path, capsys):
    repo = tmp_path / "models"
    out = imported(capsys, DYNAMIC_BATCH, repo, "smallnet", "--max-batch-size", "8")
    graph, weights = engine.FORMATS["pnnx"].files
    assert (repo / "smallnet" / "1" / graph).read_bytes() == DYNAMIC_BATCH.read_bytes()
    assert (repo / "smallnet" / "1" / weights).read_bytes() == (SMALLNET / "smallnet.pnnx.bin").read_bytes()
    text = (repo / "smallnet" / "config.pbtxt").read_text()
    assert out.startswith(f"# {repo / 'smallnet' / 'config.pbtxt'}\n{text}")
    assert f"wrote {repo / 'smallnet' / '1' / graph}" in out
    config, _ = server_reading(repo / "smallnet")
    plan = mi.plan_import(DYNAMIC_BATCH, repo, "smallnet", max_batch_size=8, default_max_batch_size=4)
    assert config == plan.config, "auto-complete must leave the written config as the import inferred it"
    assert config.backend == "pnnx" and config.max_batch_size == 8
    assert [(t.name, list(t.dims)) for t in config.input] == [("in0", [3, 64, 64])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("out0", [10])]


def test_without_flags_auto_complete_decides_max_batch_size(tmp_path, capsys):
    imported(capsys, DYNAMIC_BATCH, tmp_path, "dynamic")
    assert server_reading(tmp_path / "dynamic")[0].max_batch_size == 4
    imported(capsys, BATCH_TWO_TNN, tmp_path, "fixed")  # dim 0 fixed to 2: not a batch, full shapes
    config, _ = server_reading(tmp_path / "fixed")
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [2, 8, 6, 6]
    assert "max_batch_size: 0\n" in (tmp_path / "fixed" / "config.pbtxt").read_text(), "0 must not read as absent"


def test_a_model_fixing_batch_one_gets_max_batch_size_one(tmp_path, capsys):
    code, out, err = nnserve(capsys, "import", BATCH_ONE_TNN, "--repository", tmp_path, "--name", "tnn")
    assert code == 0 and "note: the model fixes dim 0 to 1, so max_batch_size is 1" in err
    config, _ = server_reading(tmp_path / "tnn")
    assert config.backend == "tnn" and config.max_batch_size == 1
    assert [list(t.dims) for t in config.input] == [[4, 8, 8], [6]]
    code, _, err = nnserve(capsys, "import", BATCH_ONE_TNN, "--repository", tmp_path, "--name", "tnn4",
                           "--max-batch-size", "4")
    assert code == 2 and "dim 0 is fixed to 1" in err and "--max-batch-size 1" in err
    assert not (tmp_path / "tnn4").exists()


def test_dynamic_dims_need_max_shape_and_it_becomes_the_parameter(tmp_path, capsys):
    code, _, err = nnserve(capsys, "import", ANY_SIZE, "--repository", tmp_path, "--name", "anysize")
    assert code == 2 and err == ("error: input 'in0' has dynamic dims [3, -1, -1]: pass --max-shape in0=3xDxD with "
                                 "the largest value of each D (without the batch dim), so the server can size the "
                                 "model's memory\n")
    assert not (tmp_path / "anysize").exists()
    out = imported(capsys, ANY_SIZE, tmp_path, "anysize", "--max-shape", "in0=3x128x96")
    assert 'parameters { key: "max_shape:in0" value { string_value: "3,128,96" } }' in out
    config, _ = server_reading(tmp_path / "anysize")
    assert cfg.max_shapes(config, "anysize") == {"in0": [4, 3, 128, 96]}
    code, _, err = nnserve(capsys, "import", DYNAMIC_BATCH, "--repository", tmp_path, "--name", "nobatch",
                           "--max-batch-size", "0")
    assert code == 2 and "--max-shape in0=Dx3x64x64" in err and "without the batch dim" not in err


def test_an_existing_model_is_replaced_only_with_force(tmp_path, capsys):
    imported(capsys, BATCH_ONE_TNN, tmp_path, "m")
    before = {p: p.read_bytes() for p in (tmp_path / "m").rglob("*") if p.is_file()}
    code, _, err = nnserve(capsys, "import", DYNAMIC_BATCH, "--repository", tmp_path, "--name", "m")
    assert code == 2 and "model 'm' already has" in err and "pass --force" in err
    assert {p: p.read_bytes() for p in (tmp_path / "m").rglob("*") if p.is_file()} == before
    code, out, _ = nnserve(capsys, "import", DYNAMIC_BATCH, "--repository", tmp_path, "--name", "m", "--dry-run")
    assert code == 0 and "would replace" in out and "(needs --force)" in out
    imported(capsys, DYNAMIC_BATCH, tmp_path, "m", "--force")
    # the TNN files would be loaded before the new PNNX ones (TNN is searched first): they are gone
    assert sorted(p.name for p in (tmp_path / "m" / "1").iterdir()) == sorted(engine.FORMATS["pnnx"].files)
    assert server_reading(tmp_path / "m")[0].backend == "pnnx"


def test_dry_run_prints_the_config_and_writes_nothing(tmp_path, capsys):
    code, out, _ = nnserve(capsys, "import", DYNAMIC_BATCH, "--repository", tmp_path / "models", "--name", "s",
                           "--model-version", "3", "--dry-run")
    assert code == 0 and 'name: "s"\nbackend: "pnnx"\nmax_batch_size: 4\n' in out
    assert f"would write {tmp_path / 'models' / 's' / '3' / 'model.pnnx.param'}" in out
    assert not (tmp_path / "models").exists()


def without_weights(tmp_path: Path) -> Path:
    shutil.copy(DYNAMIC_BATCH, tmp_path / "alone.pnnx.param")
    return tmp_path / "alone.pnnx.param"


def malformed(tmp_path: Path) -> Path:
    (tmp_path / "bad.pnnx.param").write_text("7767517\n2 1\npnnx.Input in 0 1 0\nnot a layer line\n")
    (tmp_path / "bad.pnnx.bin").write_bytes(b"")
    return tmp_path / "bad.pnnx.param"


@pytest.mark.parametrize("make_model, flags, message", [
    (lambda tmp: tmp / "model.onnx", [], r"model\.onnx: not a model graph file \(expected MODEL\.tnnproto, "
                                         r"MODEL\.pnnx\.param"),
    (lambda tmp: tmp / "absent.pnnx.param", [], r"absent\.pnnx\.param: no such file"),
    (without_weights, [], r"alone\.pnnx\.param: its weights file .*alone\.pnnx\.bin does not exist"),
    (malformed, [], r"bad\.pnnx\.param.*line"),
    (lambda tmp: DYNAMIC_BATCH, ["--name", "../up"], r"--name '\.\./up': a model name is a directory name"),
    (lambda tmp: DYNAMIC_BATCH, ["--model-version", "0"], r"--model-version 0: version directories are numbered"),
    (lambda tmp: DYNAMIC_BATCH, ["--max-shape", "x=3x4"], r"--max-shape x=\.\.\.: the model's inputs are in0"),
    (lambda tmp: DYNAMIC_BATCH, ["--max-batch-size", "-1"], r"max_batch_size must be >= 0"),
    (lambda tmp: ANY_SIZE, ["--max-shape", "in0=8x3x128x128"], r"--max-shape in0=8x3x128x128: give one positive "
                                                               r"value per dim of \[3, -1, -1\] \(without the batch"),
    (lambda tmp: ANY_SIZE, ["--max-shape", "in0=4x128x128"], r"in0=4x128x128: .* equal to the fixed ones"),
])
def test_mistakes_are_one_line_errors(tmp_path, capsys, make_model, flags, message):
    args = ["import", make_model(tmp_path), "--repository", tmp_path / "models", "--name", "m", *flags]
    if "--name" in flags:
        args[4:6] = []  # the case gives its own --name
    code, out, err = nnserve(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert re.search(message, err), err
    assert not (tmp_path / "models").exists()


def test_a_repository_that_cannot_be_written_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    code, _, err = nnserve(capsys, "import", DYNAMIC_BATCH, "--repository", tmp_path / "file", "--name", "m")
    assert code == 2 and err.startswith("error: cannot write ") and "Not a directory" in err, err


def test_the_guides_table_of_file_names_is_engine_formats():
    guide = (REPO / "docs" / "models.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `([\w.]+)` \| `([\w.]+)` \|$", guide, re.M)
    assert {name: (graph, weights) for name, graph, weights in rows} == {
        name: fmt.files for name, fmt in engine.FORMATS.items()}


@pytest.mark.slow
def test_imported_models_serve_the_answers_pytorch_gave(tmp_path, capsys):
    repo = tmp_path / "models"
    imported(capsys, DYNAMIC_BATCH, repo, "smallnet", "--max-batch-size", "8")
    imported(capsys, ANY_SIZE, repo, "anysize", "--max-shape", "in0=3x128x128")
    srv = ServerProcess(repo)
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        for model, x, expected in (("smallnet", "input.npy", "expected.npy"),
                                   ("anysize", "input_96.npy", "expected_96.npy")):
            inp = httpclient.InferInput("in0", list(np.load(SMALLNET / x).shape), "FP32")
            inp.set_data_from_numpy(np.load(SMALLNET / x))
            got = client.infer(model, [inp]).as_numpy("out0")
            np.testing.assert_allclose(got, np.load(SMALLNET / expected), rtol=1e-4, atol=1e-6)
        client.close()
    finally:
        assert srv.stop() == 0, srv.log_text
