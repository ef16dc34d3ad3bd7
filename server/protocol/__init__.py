"""Wire formats: InferRequest/InferResponse and the REST and gRPC adapters over the data plane."""
