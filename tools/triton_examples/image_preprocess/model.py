"""Decodes encoded images (BYTES: PNG, JPEG, ...) into the 64x64 NCHW input of the repository's small classifiers,
scaled as Inception's inputs are ((x / 127.5) - 1): the preprocessing step of Triton's ensemble image example.
Decoding needs Pillow in the server's Python."""

import io

import numpy as np
import triton_python_backend_utils as pb_utils

try:
    from PIL import Image
except ImportError:  # refused in initialize, with the package to install
    Image = None


class TritonPythonModel:
    def initialize(self, args):
        if Image is None:
            raise pb_utils.TritonModelException("image_preprocess decodes images with Pillow: pip install Pillow")

    def execute(self, requests):
        responses = []
        for request in requests:
            encoded = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            images = []
            for item in encoded.reshape(-1):
                image = Image.open(io.BytesIO(bytes(item))).convert("RGB").resize((64, 64), Image.BILINEAR)
                images.append((np.asarray(image, np.float32) / 127.5 - 1).transpose(2, 0, 1))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("IMAGE", np.stack(images))]))
        return responses
