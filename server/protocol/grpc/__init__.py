"""gRPC adapter (GRPCInferenceService) over the data plane; its stubs are committed in _gen/ (tools/gen_protos.py)."""

from server.protocol.grpc._gen import grpc_service_pb2 as pb2
from server.protocol.grpc._gen import grpc_service_pb2_grpc as pb2_grpc
from server.protocol.grpc._gen import health_pb2, health_pb2_grpc

__all__ = ["health_pb2", "health_pb2_grpc", "pb2", "pb2_grpc"]
