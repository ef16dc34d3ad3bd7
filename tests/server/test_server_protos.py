"""The modules generated from proto/ are committed: regenerating them gives the same bytes, importing them runs no
protoc, and they match Triton's field numbers."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import tritonclient.grpc.model_config_pb2 as triton_mc
import tritonclient.grpc.service_pb2 as triton_pb2

from server.model_config import model_config_pb2
from server.protocol.grpc import pb2

ROOT = Path(__file__).resolve().parents[2]
# Makes grpc_tools (protoc) unimportable, then imports every generated module and the server's gRPC adapter.
WITHOUT_PROTOC = """
import sys
class NoProtoc:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "grpc_tools":
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, NoProtoc())
import server.model_config.model_config_pb2, server.protocol.grpc, server.protocol.grpc.servicer
print(server.protocol.grpc.pb2.ModelInferRequest.DESCRIPTOR.full_name)
"""


def test_regenerating_gives_the_committed_bytes():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_generator_is_the_pinned_one():
    """Deterministic output needs one protoc: the test extra pins grpcio-tools, and this environment has it."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    (pinned,) = re.findall(r'"grpcio-tools==([\d.]+)"', pyproject)
    assert version("grpcio-tools") == pinned


def test_the_runtime_lower_bounds_match_the_generated_code():
    """Generated code refuses a protobuf runtime or grpcio older than its generator's: the server extra's lower
    bounds must not admit one."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    stubs = (ROOT / "server" / "protocol" / "grpc" / "_gen" / "grpc_service_pb2.py").read_text()
    gencode = ".".join(re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", stubs).groups())
    grpc_gencode = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'",
                             (ROOT / "server/protocol/grpc/_gen/grpc_service_pb2_grpc.py").read_text()).group(1)
    assert f'"protobuf>={gencode}"' in pyproject, gencode
    assert f'"grpcio>={grpc_gencode}"' in pyproject, grpc_gencode


def test_importing_the_stubs_runs_no_protoc(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WITHOUT_PROTOC], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "inference.ModelInferRequest"


# Fields Triton added after the tritonclient release in the test environment (2.41): checked by number only.
NEWER_THAN_TRITONCLIENT = {("ModelStatistics", "response_stats"): 9, ("ModelConfig", "runtime"): 25,
                           ("ModelConfig", "model_metrics"): 26, ("ModelInput", "is_non_linear_format_io"): 9,
                           ("ModelOutput", "is_non_linear_format_io"): 7,
                           ("ModelEnsembling", "max_inflight_requests"): 2}


def fields(desc) -> dict[str, tuple[int, int]]:
    return {f.name: (f.number, f.type) for f in desc.fields
            if NEWER_THAN_TRITONCLIENT.get((desc.name, f.name)) != f.number}


@pytest.mark.parametrize("name", ["ModelInferRequest", "ModelInferResponse", "ModelStreamInferResponse",
                                  "InferTensorContents", "InferParameter", "ModelMetadataResponse",
                                  "ModelStatistics", "InferStatistics", "InferBatchStatistics",
                                  "RepositoryIndexRequest", "RepositoryModelLoadRequest", "ServerMetadataResponse"])
def test_messages_match_tritonclient(name):
    ours = getattr(pb2, name).DESCRIPTOR
    theirs = getattr(triton_pb2, name).DESCRIPTOR
    assert fields(ours).items() <= fields(theirs).items()
    for nested in ours.nested_types:
        if nested.name == "ResponseStatsEntry":  # map entry of the newer response_stats field
            continue
        assert fields(nested).items() <= fields(theirs.nested_types_by_name[nested.name]).items()


@pytest.mark.parametrize("name", ["ModelConfig", "ModelInput", "ModelOutput", "ModelDynamicBatching",
                                  "ModelQueuePolicy", "ModelInstanceGroup", "ModelWarmup", "ModelVersionPolicy"])
def test_model_config_matches_tritonclient(name):
    assert fields(getattr(model_config_pb2, name).DESCRIPTOR).items() <= fields(
        getattr(triton_mc, name).DESCRIPTOR).items()


def message_types(module) -> dict[str, object]:  # noqa: ANN001 - a generated module
    """Every message of a generated module by its name in the package, nested ones included."""
    out = {}
    todo = [(d.name, d) for d in module.DESCRIPTOR.message_types_by_name.values()]
    while todo:
        name, desc = todo.pop()
        out[name] = desc
        todo += [(f"{name}.{n.name}", n) for n in desc.nested_types]
    return out


def test_model_config_is_tritons_whole_schema():
    """Every message and field of Triton's ModelConfig is in ours, with its number and type, so every config written
    for Triton parses (then config_fields honours or refuses each field)."""
    ours, theirs = message_types(model_config_pb2), message_types(triton_mc)
    assert set(theirs) <= set(ours), sorted(set(theirs) - set(ours))
    for name, desc in theirs.items():
        assert fields(desc).items() <= fields(ours[name]).items(), name


def test_service_rpcs_match():
    ours = pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for m in ours.methods:
        t = theirs.methods_by_name[m.name]
        assert (m.input_type.full_name, m.output_type.full_name) == (t.input_type.full_name, t.output_type.full_name)
        assert (m.client_streaming, m.server_streaming) == (t.client_streaming, t.server_streaming)
