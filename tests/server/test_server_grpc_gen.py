"""The gRPC stubs are generated from proto/ (never committed) and match Triton's field numbers."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.grpc.model_config_pb2 as triton_mc
import tritonclient.grpc.service_pb2 as triton_pb2

from server.protocol.grpc import gen, model_config_pb2, pb2


def test_generate_into_fresh_dir_and_staleness(tmp_path):
    out = tmp_path / "_gen"
    assert gen.is_stale(gen.PROTO_DIR, out)
    gen.generate(gen.PROTO_DIR, out)
    assert not gen.is_stale(gen.PROTO_DIR, out)
    assert "from . import model_config_pb2" in (out / "grpc_service_pb2.py").read_text()
    protos = tmp_path / "proto"
    protos.mkdir()
    for name in gen.PROTOS:
        (protos / name).write_text((gen.PROTO_DIR / name).read_text())
    assert not gen.is_stale(protos, out)
    (protos / "grpc_service.proto").write_text((protos / "grpc_service.proto").read_text() + "\n// edited\n")
    assert gen.is_stale(protos, out)


def test_stubs_made_for_another_protobuf_runtime_are_stale(tmp_path, monkeypatch):
    """A checkout shared by two environments: stubs from one protoc must be remade for the other's runtime."""
    out = tmp_path / "_gen"
    gen.generate(gen.PROTO_DIR, out)
    assert not gen.is_stale(gen.PROTO_DIR, out)
    monkeypatch.setattr(gen, "runtime_version", lambda: "0.0.1")
    assert gen.is_stale(gen.PROTO_DIR, out)
    gen.generate(gen.PROTO_DIR, out)
    assert not gen.is_stale(gen.PROTO_DIR, out)
    assert (out / "PROTO_SHA256").read_text().split()[-1] == "0.0.1"


def test_installed_stubs_are_kept_when_a_foreign_proto_dir_sits_beside_them(tmp_path):
    """Installed, the protos' directory resolves to site-packages/proto, which proto-plus and others also ship:
    without our .proto files there the generated stubs are kept (no crash reading a missing file)."""
    out = tmp_path / "_gen"
    gen.generate(gen.PROTO_DIR, out)
    foreign = tmp_path / "proto"
    foreign.mkdir()
    (foreign / "__init__.py").write_text("")
    assert not gen.is_stale(foreign, out)


def test_generated_package_imports_in_a_new_process(tmp_path):
    pkg = tmp_path / "stubs_pkg"
    gen.generate(gen.PROTO_DIR, pkg / "_gen")
    (pkg / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module("stubs_pkg._gen.grpc_service_pb2_grpc")
        assert hasattr(mod, "GRPCInferenceServiceServicer")
    finally:
        sys.path.remove(str(tmp_path))


RACER = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from server.protocol.grpc import gen
gen.runtime_version = lambda: sys.argv[3]  # as if this environment had its own protobuf runtime
mods = gen.load(gen.PROTO_DIR, gen.Path(sys.argv[1]) / "stubs_pkg" / "_gen", "stubs_pkg._gen")
stamps = {m.__name__: m.NNSERVE_STAMP.split()[-1] for m in mods}
assert set(stamps.values()) == {sys.argv[3]}, stamps
"""


def test_environments_starting_at_once_each_import_stubs_made_for_their_runtime(tmp_path):
    """Two environments with different protobuf runtimes on one checkout, servers starting together: each
    process takes the lock, (re)generates for its runtime and imports before the next one regenerates."""
    (tmp_path / "stubs_pkg").mkdir()
    (tmp_path / "stubs_pkg" / "__init__.py").write_text("")
    root = str(Path(gen.__file__).resolve().parents[3])
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), root, f"0.0.{i % 2}"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(6)]
    failures = [out for p in racers if (out := p.communicate(timeout=120)[0]) and p.returncode != 0]
    assert all(p.returncode == 0 for p in racers), failures


# Fields Triton added after the tritonclient release in the test environment (2.41): checked by number only.
NEWER_THAN_TRITONCLIENT = {("ModelStatistics", "response_stats"): 9, ("ModelConfig", "runtime"): 25}


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


def test_service_rpcs_match():
    ours = pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for m in ours.methods:
        t = theirs.methods_by_name[m.name]
        assert (m.input_type.full_name, m.output_type.full_name) == (t.input_type.full_name, t.output_type.full_name)
        assert (m.client_streaming, m.server_streaming) == (t.client_streaming, t.server_streaming)
