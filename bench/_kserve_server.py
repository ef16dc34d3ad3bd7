"""The KServe Python model server that bench/serve.py compares nnserve with (runs in a venv with `kserve`).

    python bench/_kserve_server.py --http-port P --grpc-port Q identity=/tmp/x/identity.onnx:1,16 \
        resnet18=bench/models/resnet18/dyn/model.onnx:1,3,224,224

Each model is a `kserve.Model` running ONNX Runtime (CPU provider, intra-op threads = cores) on one input
"in0" -> one output "out0". Stock KServe lacks Triton's model-config endpoint that perf_analyzer asks for
first; this wrapper adds just that, over HTTP (GET /v2/models/{m}/config) and gRPC (ModelConfig), and leaves
KServe's own inference path untouched. max_batch_size is 0 (requests carry the full shape), as KServe has
no dynamic batching. Per-request logging is off (no access log, no latency log), as a tuned deployment would.
"""

from __future__ import annotations

import argparse
import logging
import os

import grpc
import kserve
import numpy as np
import onnxruntime as ort
from fastapi.responses import JSONResponse
from kserve import InferOutput, InferRequest, InferResponse
from kserve.protocol.grpc import server as kserve_grpc_server

CORES = os.cpu_count() or 1
SHAPES: dict[str, list[int]] = {}


class OrtModel(kserve.Model):
    def __init__(self, name: str, onnx_path: str, shape: list[int]):
        super().__init__(name)
        self.onnx_path, self.shape = onnx_path, shape
        self.load()

    def load(self) -> bool:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = CORES
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(self.onnx_path, opts, providers=["CPUExecutionProvider"])
        self.ready = True
        return True

    def get_input_types(self) -> list[dict]:
        return [{"name": "in0", "datatype": "FP32", "shape": self.shape}]

    def get_output_types(self) -> list[dict]:
        out = self.session.get_outputs()[0].shape
        return [{"name": "out0", "datatype": "FP32", "shape": [self.shape[0], *out[1:]]}]

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        y = self.session.run(None, {"in0": x})[0]
        out = InferOutput(name="out0", shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(np.ascontiguousarray(y), binary_data=payload.from_grpc)
        # As KServe's own predictors do: binary REST outputs when the request asks (perf_analyzer does).
        return InferResponse(model_name=self.name, infer_outputs=[out], response_id=payload.id,
                             use_binary_outputs=payload.use_binary_outputs,
                             requested_outputs=payload.request_outputs)


def config_json(name: str) -> dict:
    dims = SHAPES[name]
    return {"name": name, "platform": "onnxruntime_onnx", "max_batch_size": 0,
            "input": [{"name": "in0", "data_type": "TYPE_FP32", "dims": dims}],
            "output": [{"name": "out0", "data_type": "TYPE_FP32", "dims": [-1]}]}


def add_rest_config_route() -> None:
    from kserve.model_server import app

    @app.get("/v2/models/{model_name}/config")
    async def model_config(model_name: str):
        if model_name not in SHAPES:
            return JSONResponse({"error": f"Model with name {model_name} does not exist."}, status_code=404)
        return config_json(model_name)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _model_config_request_name(data: bytes) -> str:
    # ModelConfigRequest { string name = 1; string version = 2; }: the first field is the name.
    i, name = 0, ""
    while i < len(data):
        key, i = data[i], i + 1
        length, shift = 0, 0
        while True:
            b, i = data[i], i + 1
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if key >> 3 == 1:
            name = data[i:i + length].decode()
        i += length
    return name


async def model_config_rpc(request: bytes, context) -> bytes:
    # ModelConfigResponse { ModelConfig config = 1 }, ModelConfig { string name = 1; string platform = 2;
    # int32 max_batch_size = 4 } (Triton's field numbers); max_batch_size 0 is the default, left out.
    name = _model_config_request_name(request)
    if name not in SHAPES:
        await context.abort(grpc.StatusCode.NOT_FOUND, f"Model with name {name} does not exist.")
    config = _field(1, name.encode()) + _field(2, b"onnxruntime_onnx")
    return _field(1, config)


def patch_grpc_server() -> None:
    """Registers the ModelConfig rpc next to KServe's servicer when KServe creates its aio server."""
    original = kserve_grpc_server.aio.server

    def server(*args, **kwargs):
        srv = original(*args, **kwargs)
        handler = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
            "ModelConfig": grpc.unary_unary_rpc_method_handler(
                model_config_rpc, request_deserializer=None, response_serializer=None)})
        srv.add_generic_rpc_handlers((handler,))
        return srv

    kserve_grpc_server.aio = type("aio", (), {"server": staticmethod(server)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("models", nargs="+", help="name=path.onnx:d0,d1,...")
    args = ap.parse_args()
    models = []
    for spec in args.models:
        name, rest = spec.split("=", 1)
        path, dims = rest.rsplit(":", 1)
        SHAPES[name] = [int(d) for d in dims.split(",")]
        models.append(OrtModel(name, path, SHAPES[name]))
    add_rest_config_route()
    patch_grpc_server()
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("kserve.trace").disabled = True
    # KServe's gRPC LoggingInterceptor logs every call at INFO: the gRPC access log.
    logging.getLogger("kserve").setLevel(logging.WARNING)
    kserve.ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, workers=1,
                       enable_latency_logging=False, access_log_format=None).start(models)


if __name__ == "__main__":
    main()
