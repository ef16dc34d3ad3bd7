"""tools/run_triton_examples.py: the repositories it builds load whole in nnserve, and an example it runs against them
passes or fails as the example itself says (a stand-in example written here: Triton's are not in this repository)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "server"))
runner = importlib.import_module("run_triton_examples")
from serverproc import ServerProcess  # noqa: E402 - found through the path set above

EXAMPLE = """
import sys
import numpy as np
import tritonclient.http as httpclient

client = httpclient.InferenceServerClient("localhost:8000")
a = httpclient.InferInput("INPUT0", [1, 16], "INT32")
b = httpclient.InferInput("INPUT1", [1, 16], "INT32")
a.set_data_from_numpy(np.arange(16, dtype=np.int32)[None])
b.set_data_from_numpy(np.full((1, 16), {delta}, np.int32))
total = client.infer("simple", [a, b]).as_numpy("OUTPUT0")
if not (total == np.arange(16)[None] + 1).all():
    print("error: incorrect sum")
    sys.exit(1)
print("PASS: stand-in")
"""


@pytest.mark.parametrize("label", sorted(runner.REPOSITORIES))
def test_every_model_of_the_repositories_loads(tmp_path, label):
    repository = runner.build_repository(tmp_path / "repo", runner.REPOSITORIES[label])
    srv = ServerProcess(repository, "--exit-on-error", "false", "--strict-readiness", "false")
    try:
        index = httpx.post(f"http://{srv.http_url}/v2/repository/index", timeout=30).json()
        not_ready = {r["name"]: r.get("reason", "") for r in index if r.get("state") != "READY"}
        assert len(index) == len(runner.REPOSITORIES[label])
        if importlib.util.find_spec("PIL") is None:  # the decoding step needs Pillow, and says so
            for name in ("image_preprocess", "preprocess_inception_ensemble") if label == "qa" else ():
                assert "pip install Pillow" in not_ready.pop(name), not_ready
        assert not not_ready, not_ready
    finally:
        assert srv.stop() == 0, srv.log_text


def test_the_runner_points_an_example_at_the_server_and_judges_it(tmp_path):
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "simple_good.py").write_text(EXAMPLE.format(delta=1))
    (examples / "simple_bad.py").write_text(EXAMPLE.format(delta=2))
    results = runner.run_with("examples", {"simple": runner.REPOSITORIES["examples"]["simple"]},
                              sorted(examples.glob("*.py")), tmp_path / "work", sys.executable)
    assert [(r.example, r.passed) for r in results] == [("simple_bad.py", False), ("simple_good.py", True)]
    assert results[0].reason == "error: incorrect sum"
    assert "simple_good.py" in runner.table(results, tmp_path) and "1 of 2 runs pass" in runner.table(results, tmp_path)
