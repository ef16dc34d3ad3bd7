"""gRPC stubs of the service protos, made by tools/gen_protos.py; do not edit."""
