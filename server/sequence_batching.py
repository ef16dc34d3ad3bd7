"""A config.pbtxt's `sequence_batching` block as the sequence batcher's SequenceConfig (server/scheduling/sequence.py):
the strategy and its knobs, the control inputs and the implicit states with their initial values. What Triton
refuses in that block is refused here at load, naming the field."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from server import config as cfg
from server.backend import BackendModel, TensorSpec
from server.datatypes import numpy_to_wire
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc
from server.repository_files import read_regular
from server.scheduling.sequence import SequenceConfig
from server.scheduling.sequence_inputs import CORRID, Control, StateSpec
from server.scheduling.sequence_policy import DIRECT, OLDEST, SequencePolicy
from server.security import inside

DEFAULT_IDLE_US = 1_000_000  # Triton's max_sequence_idle_microseconds when the config gives none
INITIAL_STATE_DIR = "initial_state"  # <model>/initial_state/<data_file>, as in Triton
MAX_INITIAL_STATE_BYTES = 2**30
_KINDS = mc.ModelSequenceBatching.Control.Kind
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)


def sequence_config(config: mc.ModelConfig, name: str, model_dir: Path) -> SequenceConfig:
    sb = config.sequence_batching
    controls = tuple(_controls(sb, name))
    states = tuple(_state(s, config, name, model_dir) for s in sb.state)
    taken = {t.name for t in config.input}
    for tensor in [c.name for c in controls] + [s.input_name for s in states]:
        if tensor in taken:
            raise ModelLoadError(f"model '{name}': sequence_batching: the control or state input '{tensor}' is also "
                                 "a model input (the sequence batcher supplies it; clients do not send it)")
        taken.add(tensor)
    return SequenceConfig(name, _policy(config, name), controls, states)


def _policy(config: mc.ModelConfig, name: str) -> SequencePolicy:
    sb = config.sequence_batching
    idle_us = int(sb.max_sequence_idle_microseconds) or DEFAULT_IDLE_US
    common = dict(max_batch_size=int(config.max_batch_size), idle_ns=idle_us * 1000)
    if sb.WhichOneof("strategy_choice") == OLDEST:
        oldest = sb.oldest
        for size in oldest.preferred_batch_size:
            if not 1 <= size <= max(config.max_batch_size, 1):
                raise ModelLoadError(f"model '{name}': sequence_batching.oldest.preferred_batch_size {size} must be "
                                     f"in [1, max_batch_size={config.max_batch_size}]")
        return SequencePolicy(OLDEST, slots_per_instance=max(int(oldest.max_candidate_sequences), 1),
                              max_queue_delay_ns=int(oldest.max_queue_delay_microseconds) * 1000,
                              preferred_batch_sizes=tuple(sorted(set(oldest.preferred_batch_size))), **common)
    direct = sb.direct
    utilization = float(direct.minimum_slot_utilization)
    if not 0.0 <= utilization <= 1.0:
        raise ModelLoadError(f"model '{name}': sequence_batching.direct.minimum_slot_utilization {utilization} "
                             "must be in [0, 1]")
    return SequencePolicy(DIRECT, slots_per_instance=max(int(config.max_batch_size), 1),
                          max_queue_delay_ns=int(direct.max_queue_delay_microseconds) * 1000,
                          minimum_slot_utilization=utilization, **common)


def _controls(sb: mc.ModelSequenceBatching, name: str) -> list[Control]:
    controls, kinds = [], set()
    for i, control_input in enumerate(sb.control_input):
        where = f"model '{name}': sequence_batching.control_input[{i}]"
        if not control_input.name:
            raise ModelLoadError(f"{where}: the control input needs a name")
        if len(control_input.control) != 1:
            raise ModelLoadError(f"{where} '{control_input.name}': expects exactly one control, got "
                                 f"{len(control_input.control)}")
        control = control_input.control[0]
        kind = _KINDS.Name(control.kind)
        if kind in kinds:
            raise ModelLoadError(f"{where} '{control_input.name}': sequence batching specifies multiple {kind} "
                                 "tensors")
        kinds.add(kind)
        controls.append(_control(control_input.name, kind, control, where))
    return controls


def _control(tensor: str, kind: str, control: mc.ModelSequenceBatching.Control, where: str) -> Control:
    if kind == CORRID:
        if control.data_type not in _CORRID_TYPES:
            raise ModelLoadError(f"{where} '{tensor}': the CORRID control's data_type must be TYPE_UINT64, "
                                 "TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
        return Control(tensor, kind, cfg.numpy_dtype(control.data_type))
    given = [(field, list(getattr(control, field))) for field in ("int32_false_true", "fp32_false_true",
                                                                  "bool_false_true") if len(getattr(control, field))]
    if len(given) != 1 or len(given[0][1]) != 2:
        raise ModelLoadError(f"{where} '{tensor}': a {kind} control needs exactly one of int32_false_true, "
                             "fp32_false_true or bool_false_true, with two values (false, true)")
    field, values = given[0]
    dtype = {"int32_false_true": np.dtype(np.int32), "fp32_false_true": np.dtype(np.float32),
             "bool_false_true": np.dtype(np.bool_)}[field]
    return Control(tensor, kind, dtype, (values[0], values[1]))


def _state(state: mc.ModelSequenceBatching.State, config: mc.ModelConfig, name: str, model_dir: Path) -> StateSpec:
    where = f"model '{name}': sequence_batching.state '{state.input_name}'"
    if not state.input_name or not state.output_name:
        raise ModelLoadError(f"model '{name}': sequence_batching.state needs input_name and output_name")
    if len(state.initial_state) > 1:
        raise ModelLoadError(f"{where}: only one initial_state is supported, got {len(state.initial_state)}")
    batch = [1] if config.max_batch_size > 0 else []
    dtype = cfg.numpy_dtype(state.data_type)
    if dtype == np.object_:
        raise ModelLoadError(f"{where}: TYPE_STRING states are not supported")
    if not state.initial_state:  # no initial value given: zeros (a variable dim starts empty)
        return StateSpec(state.input_name, state.output_name,
                         _zeros(batch + [max(int(d), 0) for d in state.dims], dtype, where))
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise ModelLoadError(f"{where}: the data type used for 'initial_state' field of state '{state.input_name}' "
                             "does not match the state data type.")
    if len(initial.dims) != len(state.dims):
        raise ModelLoadError(f"{where}: number of dimensions in 'initial_state' doesn't match the size of 'state' "
                             f"dimensions: {len(initial.dims)} != {len(state.dims)}")
    for have, want in zip(initial.dims, state.dims, strict=True):
        if have < 0 or (want != -1 and have != want):
            raise ModelLoadError(f"{where}: 'initial_state' dims {list(initial.dims)} must be fixed and match the "
                                 f"state's dims {list(state.dims)}")
    shape = batch + [int(d) for d in initial.dims]
    if initial.WhichOneof("state_data") == "data_file":
        return StateSpec(state.input_name, state.output_name, _state_file(initial.data_file, shape, dtype,
                                                                          model_dir, where))
    if initial.WhichOneof("state_data") != "zero_data":
        raise ModelLoadError(f"{where}: initial_state needs zero_data or data_file")
    return StateSpec(state.input_name, state.output_name, _zeros(shape, dtype, where))


def _state_bytes(shape: list[int], dtype: np.dtype, where: str) -> int:
    """A state's size, checked before anything that size is made: a config's dims may ask for exabytes."""
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if nbytes > MAX_INITIAL_STATE_BYTES:
        raise ModelLoadError(f"{where}: a state of shape {shape} {dtype.name} takes {nbytes} bytes, above the "
                             f"{MAX_INITIAL_STATE_BYTES} a state may hold")
    return nbytes


def _zeros(shape: list[int], dtype: np.dtype, where: str) -> np.ndarray:
    _state_bytes(shape, dtype, where)
    return np.zeros(shape, dtype)


def _state_file(file_name: str, shape: list[int], dtype: np.dtype, model_dir: Path, where: str) -> np.ndarray:
    folder = model_dir / INITIAL_STATE_DIR
    path = folder / file_name
    if not inside(folder, path):
        raise ModelLoadError(f"{where}: initial_state data_file '{file_name}' is outside {INITIAL_STATE_DIR}/")
    nbytes = _state_bytes(shape, dtype, where)
    raw = read_regular(path, MAX_INITIAL_STATE_BYTES, f"{where}: {INITIAL_STATE_DIR}/{file_name}")
    if len(raw) < nbytes:
        raise ModelLoadError(f"{where}: initial_state setting expects {nbytes} bytes, but the data provided from "
                             f"{file_name} only has {len(raw)} bytes.")
    return np.frombuffer(raw[:nbytes], dtype=dtype).reshape(shape).copy()


def check_model_tensors(seq: SequenceConfig, model: BackendModel, name: str) -> None:
    """An engine model must have every control and state input (in its dtype) and every state output."""
    inputs = {t.name: t for t in model.inputs}
    outputs = {t.name: t for t in model.outputs}
    for what, tensor, dtype in ([("control input", c.name, c.dtype) for c in seq.controls]
                                + [("state input", s.input_name, s.initial.dtype) for s in seq.states]):
        _check_tensor(name, what, tensor, numpy_to_wire(dtype), inputs, "input")
    for state in seq.states:
        _check_tensor(name, "state output", state.output_name, numpy_to_wire(state.initial.dtype), outputs, "output")


def _check_tensor(name: str, what: str, tensor: str, datatype: str, specs: dict[str, TensorSpec], kind: str) -> None:
    spec = specs.get(tensor)
    if spec is None:
        raise ModelLoadError(f"model '{name}': sequence_batching: {what} '{tensor}' is not an {kind} of the model; "
                             f"it has {sorted(specs)}")
    if spec.datatype != datatype:
        raise ModelLoadError(f"model '{name}': sequence_batching: {what} '{tensor}' is {datatype}, but the model's "
                             f"{kind} is {spec.datatype}")


def engine_input_shapes(seq: SequenceConfig, config: mc.ModelConfig, name: str) -> dict[str, tuple[int, ...]]:
    """The largest shapes of the control and state inputs, which an engine instance plans its arena for."""
    batch = (max(int(config.max_batch_size), 1),) if config.max_batch_size > 0 else ()
    shapes = {c.name: (*batch, 1) for c in seq.controls}
    for state in config.sequence_batching.state:
        if any(d < 0 for d in state.dims):
            raise ModelLoadError(f"model '{name}': sequence_batching.state '{state.input_name}': an engine model's "
                                 f"state needs fixed dims (its arena is planned for them), got {list(state.dims)}")
        shapes[state.input_name] = (*batch, *(int(d) for d in state.dims))
    return shapes
