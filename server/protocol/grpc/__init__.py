"""gRPC adapter (GRPCInferenceService) over the data plane. Stubs are generated on first import."""

from __future__ import annotations

from .gen import load as _load

model_config_pb2, pb2, pb2_grpc, health_pb2, health_pb2_grpc = _load()
