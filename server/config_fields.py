"""Which of Triton's ModelConfig fields nnserve honours, and why it refuses each other one.

proto/model_config.proto is Triton's whole ModelConfig, so a config written for Triton always parses; this module
then makes parsing mean something: a field nnserve does not implement, when set, fails the model's load with a
message naming the field and saying why, instead of loading a model that silently behaves otherwise. Parameters
(`parameters { key: ... }`) are checked the same way, against the keys nnserve reads.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

import engine
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc

# The backends nnserve has: the engine's model formats, and Triton's Python backend (server/python_backend/).
PYTHON_BACKEND = "python"
BACKENDS = (*engine.FORMATS, PYTHON_BACKEND)
# An ensemble is a platform of its own (no backend, no model files): its steps run other models.
ENSEMBLE_PLATFORM = "ensemble"

# The parameters nnserve reads; "max_shape:" is a prefix (one key per input).
MAX_SHAPE_PARAM = "max_shape:"  # parameters { key: "max_shape:<input>" value { string_value: "3,640,640" } }
BATCH_WAIT_PARAM = "dynamic_batching_wait"  # parameters { key: "dynamic_batching_wait" value { string_value: ... } }

# Per message type (its name inside the package), the fields nnserve honours; every other field of that message,
# when set, is refused.
HONOURED: dict[str, frozenset[str]] = {
    "ModelConfig": frozenset({"name", "platform", "backend", "version_policy", "max_batch_size", "input", "output",
                              "dynamic_batching", "instance_group", "default_model_filename", "parameters",
                              "model_warmup", "model_transaction_policy", "response_cache", "ensemble_scheduling",
                              "sequence_batching", "optimization"}),
    # Pinned host buffers are a GPU-copy setting with no effect on results; Triton's own config answer holds them
    # (enable: true), so a config saved from Triton loads. Every other optimization field is the engine's own.
    "ModelOptimizationPolicy": frozenset({"input_pinned_memory", "output_pinned_memory"}),
    "ModelOptimizationPolicy.PinnedMemoryBuffer": frozenset({"enable"}),
    # Triton's sequence batcher (server/sequence_batching.py, server/scheduling/sequence.py).
    "ModelSequenceBatching": frozenset({"direct", "oldest", "max_sequence_idle_microseconds", "control_input",
                                        "state"}),
    "ModelSequenceBatching.StrategyDirect": frozenset({"max_queue_delay_microseconds", "minimum_slot_utilization"}),
    "ModelSequenceBatching.StrategyOldest": frozenset({"max_candidate_sequences", "preferred_batch_size",
                                                       "max_queue_delay_microseconds"}),
    "ModelSequenceBatching.ControlInput": frozenset({"name", "control"}),
    "ModelSequenceBatching.Control": frozenset({"kind", "int32_false_true", "fp32_false_true", "bool_false_true",
                                                "data_type"}),
    "ModelSequenceBatching.State": frozenset({"input_name", "output_name", "data_type", "dims", "initial_state"}),
    "ModelSequenceBatching.InitialState": frozenset({"data_type", "dims", "zero_data", "data_file", "name"}),
    "ModelEnsembling": frozenset({"step"}),
    "ModelEnsembling.Step": frozenset({"model_name", "model_version", "input_map", "output_map"}),
    "ModelInput": frozenset({"name", "data_type", "format", "dims", "reshape"}),
    "ModelOutput": frozenset({"name", "data_type", "dims", "reshape", "label_filename"}),
    "ModelInstanceGroup": frozenset({"name", "kind", "count", "gpus"}),
    "ModelDynamicBatching": frozenset({"preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering",
                                       "priority_levels", "default_priority_level", "default_queue_policy"}),
    "ModelQueuePolicy": frozenset({"timeout_action", "default_timeout_microseconds", "allow_timeout_override",
                                   "max_queue_size"}),
    "ModelVersionPolicy": frozenset({"latest", "all", "specific"}),
    "ModelVersionPolicy.Latest": frozenset({"num_versions"}),
    "ModelVersionPolicy.All": frozenset(),
    "ModelVersionPolicy.Specific": frozenset({"versions"}),
    "ModelTensorReshape": frozenset({"shape"}),
    "ModelWarmup": frozenset({"name", "batch_size", "inputs", "count"}),
    "ModelWarmup.Input": frozenset({"data_type", "dims", "zero_data", "random_data", "input_data_file"}),
    "ModelParameter": frozenset({"string_value"}),
    # `decoupled: true` for a Python-backend model only (check_backend)
    "ModelTransactionPolicy": frozenset({"decoupled"}),
    "ModelResponseCache": frozenset({"enable"}),  # with the server's --cache-config (server/response_cache.py)
}

_ENGINE_OWN = ("not supported: the engine plans and optimises every model itself (see the NNSERVE_* environment "
               "variables)")
# Why each refused field is refused: (message type, field) or field alone; the default says it is not implemented.
REASONS: dict[tuple[str, str] | str, str] = {
    ("ModelConfig", "runtime"): "not supported: nnserve has no backend libraries to choose from (`backend` picks "
                                "the model format)",
    ("ModelSequenceBatching.StrategyOldest", "preserve_ordering"): "not implemented: a sequence's responses come in "
                                                                   "its order, those of different sequences as "
                                                                   "their executions end",
    ("ModelSequenceBatching", "iterative_sequence"): "iterative sequences (request rescheduling) are not "
                                                     "implemented",
    ("ModelSequenceBatching.State", "use_same_buffer_for_input_output"): "not supported: a state is copied between "
                                                                         "requests",
    ("ModelSequenceBatching.State", "use_growable_memory"): "not supported: a state is copied between requests",
    **{("ModelOptimizationPolicy", f): _ENGINE_OWN for f in ("graph", "priority", "cuda", "execution_accelerators",
                                                             "gather_kernel_buffer_threshold", "eager_batching")},
    ("ModelConfig", "batch_input"): "ragged batching is not supported",
    ("ModelConfig", "batch_output"): "ragged batching is not supported",
    ("ModelConfig", "cc_model_filenames"): "not supported: there are no per-compute-capability model files; use "
                                           "default_model_filename",
    ("ModelConfig", "metric_tags"): "per-model metric tags are not implemented (metrics carry model and version)",
    ("ModelConfig", "model_operations"): "custom operation libraries are not loaded from configs: register ops "
                                         "with an NNSERVE_PLUGINS module",
    ("ModelConfig", "model_repository_agents"): "repository agents are not supported",
    ("ModelConfig", "model_metrics"): "per-model metric settings are not supported",
    ("ModelEnsembling.Step", "model_namespace"): "model namespaces are not supported: name the model alone",
    ("ModelInput", "optional"): "optional inputs are not supported: every model input is required",
    ("ModelInput", "allow_ragged_batch"): "ragged batching is not supported: requests batch when their shapes "
                                          "agree",
    ("ModelInstanceGroup", "rate_limiter"): "the rate limiter is not implemented",
    ("ModelInstanceGroup", "passive"): "passive instances are not supported: every instance takes requests",
    ("ModelInstanceGroup", "host_policy"): "host policies are not supported",
    ("ModelInstanceGroup", "secondary_devices"): "secondary devices (NVDLA) are not supported",
    ("ModelDynamicBatching", "priority_queue_policy"): "per-priority queue policies are not implemented: "
                                                       "default_queue_policy applies to every priority level",
    "is_shape_tensor": "not supported: shape tensors are a TensorRT feature",
    "is_non_linear_format_io": "not supported: non-linear I/O formats are a TensorRT feature",
    "profile": "not supported: optimization profiles are a TensorRT feature",
}


def check_supported(config: mc.ModelConfig, name: str) -> None:
    """Refuse the first field that is set and not honoured, naming it (e.g. `input[0].optional`) and why."""
    for path, message, field in _set_fields(config, ""):
        kind = _type_name(message)
        if field.name in HONOURED.get(kind, frozenset()):
            continue
        reason = REASONS.get((kind, field.name)) or REASONS.get(field.name) or "not implemented by nnserve"
        raise ModelLoadError(f"model '{name}': {path}: {reason}")
    check_parameters(config, name)
    check_backend(config, name)


def _set_fields(message: Message, prefix: str) -> Iterator[tuple[str, Message, FieldDescriptor]]:
    """(path, message, field) of every field set in `message`, walking into the messages nnserve honours. A
    refused message field counts as set when anything in it is, or, for a oneof choice (sequence_batching { }),
    when it is present at all."""
    honoured = HONOURED.get(_type_name(message), frozenset())
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            yield path, message, field
            continue
        if field.name not in honoured:
            if field.containing_oneof is not None:  # the choice itself is the setting (a scheduler)
                yield path, message, field
            elif _anything_set(field, value):
                yield _first_set_path(field, value, path), message, field
            continue
        for key, item in _items(field, value):
            yield from _set_fields(item, f"{path}{key}.")


def _type_name(message: Message) -> str:
    return message.DESCRIPTOR.full_name.removeprefix(message.DESCRIPTOR.file.package + ".")


def _items(field: FieldDescriptor, value: object) -> Iterator[tuple[str, Message]]:
    """The sub-messages of a message field: itself, each element ([i]) of a repeated one, each value ([key]) of a
    map whose values are messages."""
    if field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        if value_field.type == FieldDescriptor.TYPE_MESSAGE:
            yield from ((f"[{k!r}]", v) for k, v in value.items())  # type: ignore[attr-defined]
    elif field.is_repeated:
        yield from ((f"[{i}]", v) for i, v in enumerate(value))  # type: ignore[arg-type]
    else:
        yield "", value  # type: ignore[misc]


def _anything_set(field: FieldDescriptor, value: object) -> bool:
    if field.is_repeated:
        return len(value) > 0  # type: ignore[arg-type]
    return bool(value.ListFields())  # type: ignore[attr-defined]


def _first_set_path(field: FieldDescriptor, value: object, path: str) -> str:
    """`optimization.input_pinned_memory.enable` rather than `optimization`: the setting the user wrote."""
    if field.is_repeated or not isinstance(value, Message):
        return path
    while isinstance(value, Message) and value.ListFields():
        sub, value = value.ListFields()[0]
        path += f".{sub.name}"
        if sub.type != FieldDescriptor.TYPE_MESSAGE or sub.is_repeated:
            break
    return path


def check_parameters(config: mc.ModelConfig, name: str) -> None:
    """The engine's models take only the parameters nnserve reads; a Python model reads its own (its initialize
    gets the whole config), so any key is its."""
    if config.backend == PYTHON_BACKEND:
        if "EXECUTION_ENV_PATH" in config.parameters:  # Triton's: the model would run elsewhere than it expects
            raise ModelLoadError(f"model '{name}': parameters['EXECUTION_ENV_PATH']: custom execution environments "
                                 "are not supported: a Python model runs in the server's Python")
        return
    for key in config.parameters:
        if key != BATCH_WAIT_PARAM and not key.startswith(MAX_SHAPE_PARAM):
            raise ModelLoadError(f"model '{name}': parameters['{key}'] is not a parameter nnserve reads; it reads "
                                 f"'{MAX_SHAPE_PARAM}<input>' and '{BATCH_WAIT_PARAM}'")


def check_backend(config: mc.ModelConfig, name: str) -> None:
    """`backend` and `platform` must name one of nnserve's backends (Triton's platform names, such as
    onnxruntime_onnx, are other servers' backends), and agree with each other; an ensemble is platform "ensemble"
    with ensemble_scheduling, and only a Python model may be decoupled."""
    if config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling"):
        check_ensemble(config, name)
        return
    if config.model_transaction_policy.decoupled and config.backend != PYTHON_BACKEND:
        raise ModelLoadError(f"model '{name}': model_transaction_policy.decoupled: decoupled models (several "
                             f"responses per request) need the Python backend (backend: \"{PYTHON_BACKEND}\"): a "
                             "TNN or PNNX model answers each request once")
    known = ", ".join(f'"{b}"' for b in BACKENDS)
    for field in ("backend", "platform"):
        value = getattr(config, field)
        if value and value not in BACKENDS:
            raise ModelLoadError(f"model '{name}': {field} \"{value}\" is not a backend nnserve has; it has {known} "
                                 "(TNN and PNNX model files)")
    if config.backend and config.platform and config.backend != config.platform:
        raise ModelLoadError(f"model '{name}': backend \"{config.backend}\" and platform \"{config.platform}\" "
                             "disagree")


def check_ensemble(config: mc.ModelConfig, name: str) -> None:
    """What Triton refuses in an ensemble's config (its steps are checked against the models they name at load)."""
    if config.platform != ENSEMBLE_PLATFORM:
        raise ModelLoadError(f"model '{name}': ensemble_scheduling cannot be set for a model whose platform is not "
                             f"\"{ENSEMBLE_PLATFORM}\"")
    if not config.HasField("ensemble_scheduling"):
        raise ModelLoadError(f"model '{name}': platform \"{ENSEMBLE_PLATFORM}\" needs ensemble_scheduling (the "
                             "steps to run)")
    for field in ("backend", "instance_group", "model_warmup", "default_model_filename"):
        if _is_set(config, field):
            raise ModelLoadError(f"model '{name}': {field} should not be specified for ensemble '{name}'")
    if config.model_transaction_policy.decoupled:
        raise ModelLoadError(f"model '{name}': model_transaction_policy.decoupled: decoupled ensembles are not "
                             "supported")


def _is_set(config: mc.ModelConfig, field: str) -> bool:
    value = getattr(config, field)
    return len(value) > 0 if not isinstance(value, str) else bool(value)
