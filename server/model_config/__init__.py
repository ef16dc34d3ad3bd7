"""The model-configuration schema (proto/model_config.proto, Triton's): model_config_pb2 is generated from it by
tools/gen_protos.py. The server core reads configs through it; the gRPC adapter's stubs build on it."""
