"""A feature asked for without its optional dependency fails with a message naming the extra to install, never a
silent downgrade: `nnserve serve` without the `server` extra, a KIND_GPU instance group (or a CUDA instance) without
the `cuda` extra. Each case runs in a child process in which those packages are made unimportable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

AFFINE = Path(__file__).resolve().parent / "fixtures" / "affine" / "1" / "model.pnnx.param"

BLOCKER = """
import sys
BLOCKED = sys.argv[1].split(",")


class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, Block())
"""

SERVE = BLOCKER + """
from server.cli import main
sys.exit(main(sys.argv[2:]))
"""

GPU = BLOCKER + """
import engine
from server import config as cfg
from server.errors import ModelLoadError

model = engine.load(sys.argv[2])
gpu = cfg.parse_config_text("instance_group [ { kind: KIND_GPU count: 1 } ]")
try:
    cfg.auto_complete(gpu, "m", "pnnx", model, has_max_batch=False, default_max_batch_size=4)
except ModelLoadError as exc:
    print("config:", exc.message)
try:
    model.instance("cuda", max_shapes={"in0": (2, 4)})
except engine.EngineError as exc:
    print("engine:", exc)
auto = cfg.parse_config_text("instance_group [ { kind: KIND_AUTO count: 1 } ]")
cfg.auto_complete(auto, "m", "pnnx", model, has_max_batch=False, default_max_batch_size=4)
print("auto:", cfg.mc.ModelInstanceGroup.Kind.Name(auto.instance_group[0].kind))
"""


def child(code: str, blocked: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, blocked, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.parametrize("missing", ["fastapi", "grpc", "uvloop", "prometheus_client"])
def test_serve_without_the_server_extra_names_it(tmp_path, missing):
    proc = child(SERVE, missing, "serve", "--model-repository", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"the '{missing}' package is not installed: install nnserve[server]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_engine_commands_need_no_server_extra(tmp_path):
    proc = child(SERVE, "fastapi,uvicorn,grpc,google.protobuf,prometheus_client,httptools,uvloop", "inspect",
                 str(AFFINE), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "in0" in proc.stdout


def test_kind_gpu_without_cuda_support_names_the_cuda_extra(tmp_path):
    proc = child(GPU, "numba_cuda,numba.cuda", str(AFFINE), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert lines["config"].startswith("model 'm': instance_group KIND_GPU: CUDA support is not installed")
    assert lines["config"].endswith("install nnserve[cuda]")
    assert "install nnserve[cuda]" in lines["engine"]
    assert lines["auto"] == "KIND_CPU"  # KIND_AUTO takes GPUs only where there are any
