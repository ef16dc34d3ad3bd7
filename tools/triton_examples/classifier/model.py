"""Triton's example image classifiers (densenet_onnx, inception_graphdef: an ONNX and a TensorFlow model) stood in
for by the repository's small PNNX classifiers (tests/fixtures/pnnx/densenet, googlenet: 64x64 inputs, 10 classes),
run with the nnserve engine from this Python model: it resizes the image it is given (nearest neighbour) to 64x64
NCHW, then runs the network. parameters["layout"] says how the input is laid out: "NCHW" (one image, [3, H, W],
no batching) or "NHWC" (a batch, [N, H, W, 3])."""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

import engine

SIZE = 64


def resize(image):
    """[3, H, W] -> [3, SIZE, SIZE]."""
    rows = np.arange(SIZE) * image.shape[1] // SIZE
    cols = np.arange(SIZE) * image.shape[2] // SIZE
    return image[:, rows][:, :, cols]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.layout = config["parameters"]["layout"]["string_value"]
        self.input = config["input"][0]["name"]
        self.output = config["output"][0]["name"]
        graph = Path(args["model_repository"]) / args["model_version"] / "model.pnnx.param"
        self.network = engine.load(str(graph)).instance("cpu", max_shapes={"in0": (1, 3, SIZE, SIZE)})

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, self.input).as_numpy().astype(np.float32)
            images = [image.transpose(2, 0, 1) for image in data] if self.layout == "NHWC" else [data]
            scores = [self.network.run({"in0": np.ascontiguousarray(resize(i)[None])})["out0"] for i in images]
            out = np.concatenate(scores) if self.layout == "NHWC" else scores[0]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output, out.astype(np.float32))]))
        return responses
