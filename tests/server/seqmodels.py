"""Sequence (stateful) models for the sequence batcher tests, as Python-backend models: Triton's example models
(simple_sequence, simple_dyna_sequence, simple_string_dyna_sequence: tests/server/fixtures/triton/), a model that
echoes its control inputs, and an accumulator on implicit state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pymodels import copy_models, python_model

# Echoes every control tensor it gets, with their dtypes, plus what pb_utils says of the request (correlation_id,
# flags), the execution's size and the worker's pid (which instance ran it). An execution holding a request whose
# INPUT is negative says so (<gate_dir>/<-INPUT>.held) and waits until the file <gate_dir>/<-INPUT> exists: a test
# holds the instance busy while it queues other requests, with no timing involved.
CONTROLS_TEMPLATE = """
max_batch_size: {max_batch}
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0.5, 2.5 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 7, 9 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "START_OUT" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "END_OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "READY_OUT" data_type: TYPE_BOOL dims: [ 1 ] }},
  {{ name: "CORRID_OUT" data_type: {corrid_type} dims: [ 1 ] }},
  {{ name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: {count} }} ]
parameters {{ key: "gate_dir" value {{ string_value: "{gate_dir}" }} }}
"""
CONTROLS_SOURCE = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.gate_dir = config["parameters"]["gate_dir"]["string_value"]

    def execute(self, requests):
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()[0][0])
            if value < 0:
                open(os.path.join(self.gate_dir, f"{-value}.held"), "w").close()
            while value < 0 and not os.path.exists(os.path.join(self.gate_dir, str(-value))):
                time.sleep(0.01)
        responses = []
        for request in requests:
            def get(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            corrid = get("CORRID")
            if corrid.dtype == np.object_:
                assert request.correlation_id() == corrid[0][0].decode()
            elif corrid.dtype == np.uint64:
                assert request.correlation_id() == int(corrid[0][0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("START_OUT", get("START")),
                pb_utils.Tensor("END_OUT", get("END")),
                pb_utils.Tensor("READY_OUT", get("READY")),
                pb_utils.Tensor("CORRID_OUT", corrid),
                pb_utils.Tensor("FLAGS", np.array([[request.flags()]], np.int32)),
                pb_utils.Tensor("BATCH", np.array([[len(requests)]], np.int32)),
                pb_utils.Tensor("PID", np.array([[os.getpid()]], np.int64)),
                pb_utils.Tensor("OUTPUT", get("INPUT")),
            ]))
        return responses
"""

# An accumulator on implicit state: OUTPUT = OUTPUT_STATE = INPUT_STATE + INPUT; the state starts at zero or, with
# the data file, at 100.
STATE_TEMPLATE = """
max_batch_size: {max_batch}
sequence_batching {{
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [
    {{
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ 1 ]
      {initial}
    }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""
STATE_SOURCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE").as_numpy()
            total = (state + value).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total),
                                                         pb_utils.Tensor("OUTPUT_STATE", total)]))
        return responses
"""
INITIAL_FROM_FILE = ('initial_state [ { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" '
                     'name: "from file" } ]')
INITIAL_ZERO = 'initial_state [ { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } ]'


# name: (strategy, instances, max_batch_size, CORRID type, max_sequence_idle_microseconds)
CONTROL_MODELS = {
    "seq_direct": ("direct { }", 2, 4, "TYPE_UINT64", 60_000_000),
    "seq_oldest": ("oldest { max_candidate_sequences: 4 }", 2, 4, "TYPE_UINT64", 60_000_000),
    "seq_string": ("", 1, 4, "TYPE_STRING", 60_000_000),
    "seq_int32": ("", 1, 4, "TYPE_INT32", 60_000_000),
    "seq_one_slot": ("direct { }", 1, 1, "TYPE_UINT64", 60_000_000),
    "seq_idle": ("direct { }", 1, 1, "TYPE_UINT64", 300_000),
}


def sequence_models(root: Path, gate_dir: Path) -> Path:
    """Every sequence model of the tests, in the repository `root`."""
    copy_models(root, "simple_sequence", "simple_dyna_sequence", "simple_string_dyna_sequence")
    for name, (strategy, count, max_batch, corrid, idle_us) in CONTROL_MODELS.items():
        config = CONTROLS_TEMPLATE.format(idle_us=idle_us, strategy=strategy, count=count, max_batch=max_batch,
                                          corrid_type=corrid, gate_dir=gate_dir)
        python_model(root, name, config, CONTROLS_SOURCE)
    python_model(root, "seq_state", STATE_TEMPLATE.format(max_batch=4, strategy="", initial=INITIAL_ZERO),
                 STATE_SOURCE)
    python_model(root, "seq_state_nobatch", STATE_TEMPLATE.format(max_batch=0, strategy="oldest { }", initial=""),
                 STATE_SOURCE)
    model_dir = python_model(root, "seq_state_file", STATE_TEMPLATE.format(max_batch=4, strategy="",
                                                                           initial=INITIAL_FROM_FILE), STATE_SOURCE)
    (model_dir / "initial_state").mkdir()
    (model_dir / "initial_state" / "hundred").write_bytes(np.array([100], np.int32).tobytes())
    return root
