"""Model repositories for the Python backend, ensemble and decoupled tests: the committed Triton-example models
(tests/server/fixtures/triton/) and small Python models written by the tests themselves."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

TRITON_MODELS = Path(__file__).resolve().parent / "fixtures" / "triton"


def copy_models(root: Path, *names: str) -> Path:
    """Copies committed models (tests/server/fixtures/triton/<name>) into the repository `root`."""
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(TRITON_MODELS / name, root / name)
    return root


def python_model(root: Path, name: str, config: str, source: str, version: str = "1") -> Path:
    """<root>/<name>/config.pbtxt (`backend: "python"` and the name are added) and <version>/model.py."""
    model_dir = root / name
    (model_dir / version).mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config))
    (model_dir / version / "model.py").write_text(textwrap.dedent(source))
    return model_dir


def ensemble(root: Path, name: str, config: str) -> Path:
    """<root>/<name>/config.pbtxt (platform "ensemble") and an empty version directory, as Triton wants one."""
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(f'name: "{name}"\nplatform: "ensemble"\n' + textwrap.dedent(config))
    return model_dir


# A model whose input says what to do: 0 answer (OUT = IN + 1, and the worker's pid in PID), 1 an error response
# (INVALID_ARG), 2 raise, 3 crash the process (SIGSEGV), 4 exit the process, 5 hang.
FAULTY_CONFIG = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
parameters { key: "nnserve_python_timeout_secs" value { string_value: "4" } }
"""
FAULTY_SOURCE = """
import ctypes
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            action = value % 10
            if action == 1:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"value {value} is refused", pb_utils.TritonError.INVALID_ARG)))
                continue
            if action == 2:
                raise ValueError(f"cannot take {value}")
            if action == 3:
                ctypes.string_at(0)  # reads address 0: SIGSEGV
            if action == 4:
                os._exit(3)
            if action == 5:
                while True:
                    time.sleep(1)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([value + 1], np.int32)),
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]))
        return responses
"""

# A model that stops its own process (SIGSTOP, a moment after answering) when IN is 1: the process then reads nothing,
# so a request larger than the socket's buffer cannot be written to it. PAD is any bytes, to make a request large.
STOPPER_CONFIG = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "PAD" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
parameters { key: "nnserve_python_timeout_secs" value { string_value: "4" } }
"""

STOPPER_SOURCE = """
import os
import signal
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _stop_soon():
    time.sleep(0.2)  # after the answer is written
    os.kill(os.getpid(), signal.SIGSTOP)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if value == 1:
                threading.Thread(target=_stop_soon, daemon=True).start()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]))
        return responses
"""

# BLS: OUTPUT0/OUTPUT1 from "simple" (a TNN model) called from execute; with MODE 1, a call to a model that does not
# exist, whose error the model returns as its own; with MODE 2 the decoupled "repeat_int32" called with IN, its
# responses' OUT gathered into one output; with MODE 3, "simple" called twice through async_exec.
BLS_CONFIG = """
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
BLS_SOURCE = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


def simple_request(a, b, model="simple"):
    return pb_utils.InferenceRequest(model_name=model, requested_output_names=["OUTPUT0", "OUTPUT1"],
                                     inputs=[pb_utils.Tensor("INPUT0", a[None]), pb_utils.Tensor("INPUT1", b[None])])


def outputs(response):
    return [pb_utils.get_output_tensor_by_name(response, n).as_numpy().reshape(-1) for n in ("OUTPUT0", "OUTPUT1")]


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 1:
                response = simple_request(a, b, "no_such_model").exec()
                responses.append(pb_utils.InferenceResponse(error=response.error()))
                continue
            if mode == 2:
                call = pb_utils.InferenceRequest(
                    model_name="repeat_int32", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", a), pb_utils.Tensor("DELAY", np.zeros(a.shape, np.uint32)),
                            pb_utils.Tensor("WAIT", np.zeros(1, np.uint32))])
                got = [pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0]
                       for r in call.exec(decoupled=True) if r.output_tensors()]
                values = np.array(got, np.int32)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", values),
                                                             pb_utils.Tensor("OUTPUT1", values)]))
                continue
            if mode == 3:
                first, second = await asyncio.gather(simple_request(a, b).async_exec(),
                                                     simple_request(b, a).async_exec())
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", outputs(first)[0]),
                                                             pb_utils.Tensor("OUTPUT1", outputs(second)[1])]))
                continue
            response = simple_request(a, b).exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            total, difference = outputs(response)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total),
                                                         pb_utils.Tensor("OUTPUT1", difference)]))
        return responses
"""

# auto_complete_config fills in what the config leaves out; initialize checks the config it is given is the
# completed one; the request's id and parameters come back as outputs.
AUTO_SOURCE = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [3]})
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [3]})
        config.add_output({"name": "INFO", "data_type": "TYPE_STRING", "dims": [1]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        assert self.config["max_batch_size"] == 4, self.config
        assert args["model_name"] == "auto" and args["model_instance_kind"] == "CPU", args
        self.scale = float(self.config["parameters"]["scale"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            info = json.dumps({"id": request.request_id(), "parameters": json.loads(request.parameters()),
                               "outputs": sorted(request.requested_output_names())})
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", (x * self.scale).astype(np.float32)),
                pb_utils.Tensor("INFO", np.array([[info.encode()]] * x.shape[0], dtype=object))]))
        return responses
"""
AUTO_CONFIG = """
parameters { key: "scale" value { string_value: "2.5" } }
"""
