"""config.pbtxt: parse (protobuf text format into proto/model_config.proto), auto-complete from the model file,
validate against the model (errors name the field), and derive what the repository needs (max shapes, counts).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

import engine
from server.backend import BackendModel, TensorSpec, data_dependent_outputs
from server.config_fields import BATCH_WAIT_PARAM, MAX_SHAPE_PARAM, PYTHON_BACKEND
from server.datatypes import config_type_to_wire, wire_to_config_type, wire_to_numpy
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc
from server.repository_files import read_regular

CONFIG_FILE = "config.pbtxt"
# A config.pbtxt is a few KiB; a bigger file is not one (and is not read into memory whole).
CONFIG_MAX_BYTES = 4 * 2**20
KIND_AUTO, KIND_GPU, KIND_CPU = (mc.ModelInstanceGroup.KIND_AUTO, mc.ModelInstanceGroup.KIND_GPU,
                                 mc.ModelInstanceGroup.KIND_CPU)
BATCH_WAITS = ("full", "adaptive")
# Bounds no real deployment reaches, so that a config cannot make a load take forever or exhaust the machine: each
# instance is a planned arena (a Python model's, a process) with its own metric series; a warm-up is a few runs of
# one batch the model serves anyway.
MAX_INSTANCES = 128
MAX_WARMUP_COUNT = 1000
IMAGE_FORMATS = (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW)

# Which files make a model version, per backend (the engine's model formats, searched in this order).
MODEL_FILES = {name: fmt.files for name, fmt in engine.FORMATS.items()}


def parse_config_text(text: str, path: Path | str = CONFIG_FILE) -> mc.ModelConfig:
    """Protobuf text format -> ModelConfig; a syntax error names the file and line."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ModelLoadError(f"{path}:{exc.GetLine()}:{exc.GetColumn()}: {exc}") from None
    except Exception as exc:  # whatever else protobuf's parser raises on a malformed file is still a load error
        raise ModelLoadError(f"{path}: cannot parse: {type(exc).__name__}: {exc}") from None
    return config


def parse_config_json(text: str, source: str = "config parameter") -> mc.ModelConfig:
    """The JSON form the repository load API accepts (and /config returns). Unknown fields are refused, as Triton
    refuses them: a misspelt field must not load a model configured otherwise than its author believes."""
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, RecursionError) as exc:
        raise ModelLoadError(f"{source}: invalid model config JSON: {exc}") from None
    return config


def read_config(model_dir: Path) -> tuple[mc.ModelConfig, bool]:
    """(config, has_max_batch_size): a missing file gives an empty config to auto-complete."""
    path = model_dir / CONFIG_FILE
    if not path.exists() and not path.is_symlink():
        return mc.ModelConfig(), False
    raw = read_regular(path, CONFIG_MAX_BYTES, f"{model_dir.name}/{CONFIG_FILE}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{model_dir.name}/{CONFIG_FILE}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at "
                             f"offset {exc.start}") from None
    # proto3 cannot tell "max_batch_size: 0" from absent; auto-complete must only fill the absent case.
    has_max_batch = re.search(r"^\s*max_batch_size\s*:", text, re.M) is not None
    return parse_config_text(text, f"{model_dir.name}/{CONFIG_FILE}"), has_max_batch


def model_files(version_dir: Path, config: mc.ModelConfig, name: str) -> tuple[str, Path, Path]:
    """(backend, graph file, weights file) of one version directory; engine.load is given the graph file and finds
    the weights beside it.

    As in Triton, `default_model_filename` names the model file in each version directory (here the graph file,
    whose suffix says the format; the weights file has the same stem); without it the files are
    model.<suffix>. A `backend` in the config looks for that backend's files only."""
    if config.default_model_filename:
        backend, graph, weights = _named_files(config, name)
        candidates = [(backend, (graph, weights))]
    else:
        wanted = [config.backend] if config.backend else list(MODEL_FILES)
        candidates = [(b, MODEL_FILES[b]) for b in wanted if b in MODEL_FILES]
    for backend, files in candidates:
        if all((version_dir / f).exists() for f in files):
            return backend, version_dir / files[0], version_dir / files[1]
    options = " or ".join("+".join(files) for _, files in candidates)
    raise ModelLoadError(f"model '{name}': {version_dir.parent.name}/{version_dir.name}/ has no {options}")


def _named_files(config: mc.ModelConfig, name: str) -> tuple[str, str, str]:
    filename = config.default_model_filename
    if Path(filename).name != filename or filename in (".", ".."):
        raise ModelLoadError(f"model '{name}': default_model_filename '{filename}' must be a file name in the version "
                             "directory, without a path")
    fmt = engine.format_of(filename)
    if fmt is None:
        suffixes = ", ".join(f.graph_suffix for f in engine.FORMATS.values())
        raise ModelLoadError(f"model '{name}': default_model_filename '{filename}' must end in one of {suffixes} "
                             "(the graph file; the weights file has the same stem)")
    if config.backend and config.backend != fmt.name:
        raise ModelLoadError(f"model '{name}': default_model_filename '{filename}' is a {fmt.name} model, but the "
                             f"backend is \"{config.backend}\"")
    stem = filename[: -len(fmt.graph_suffix)]
    return fmt.name, filename, stem + fmt.weights_suffix


def config_to_dict(config: mc.ModelConfig) -> dict[str, Any]:
    """ModelConfig as Triton prints it: proto field names, every field without presence printed even at its
    default (`"max_batch_size": 0`, `"format": "FORMAT_NONE"`, empty lists; clients such as image_client read
    them), and 64-bit integers as JSON numbers where protobuf would quote them."""
    doc = json_format.MessageToDict(config, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)
    return _unquote_ints(config, doc)


def config_to_json(config: mc.ModelConfig) -> str:
    return json.dumps(config_to_dict(config))


_INT64_TYPES = frozenset({FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64})


def _unquote_ints(message: Message, doc: dict[str, Any]) -> dict[str, Any]:
    """The 64-bit integer fields of `doc` (the JSON of `message`) as numbers, found through the descriptors: a
    string value that merely looks like a number (a parameter's string_value "16") stays a string."""
    fields = message.DESCRIPTOR.fields_by_name
    for key, value in doc.items():
        field = fields.get(key)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for k, v in value.items():
                if value_field.message_type is not None:
                    _unquote_ints(getattr(message, key)[k], v)
                elif value_field.cpp_type in _INT64_TYPES:
                    value[k] = int(v)
        elif field.message_type is not None:
            items = zip(getattr(message, key), value, strict=True) if field.is_repeated else [(getattr(message, key),
                                                                                                value)]
            for sub, sub_doc in items:
                _unquote_ints(sub, sub_doc)
        elif field.cpp_type in _INT64_TYPES:
            doc[key] = [int(v) for v in value] if field.is_repeated else int(value)
    return doc


@dataclass
class TensorConfig:
    """One input or output as the server sees it: wire datatype and the shape a request must have."""

    name: str
    datatype: str  # KServe wire name, "FP32"
    dims: list[int]  # without the batch dim when max_batch_size > 0
    reshape: list[int] | None = None  # the model's own shape when it differs from `dims` (the API shape)

    def wire_shape(self, batching: bool) -> list[int]:
        return ([-1] if batching else []) + list(self.dims)

    def to_model(self, array: np.ndarray, batching: bool) -> np.ndarray:
        """A request tensor (API shape) as the model takes it."""
        return _reshaped(array, batching, self.dims, self.reshape)

    def to_api(self, array: np.ndarray, batching: bool) -> np.ndarray:
        """A model output as the API returns it."""
        return _reshaped(array, batching, self.reshape, self.dims)


def _reshaped(array: np.ndarray, batching: bool, src: list[int] | None, dst: list[int] | None) -> np.ndarray:
    if src is None or dst is None:
        return array
    lead = list(array.shape[:1]) if batching else []
    return array.reshape(lead + map_shape(list(array.shape[len(lead):]), src, dst))


def map_shape(shape: list[int], src: list[int], dst: list[int]) -> list[int]:
    """A concrete shape matching pattern `src` -> the one matching `dst`: validation made both patterns hold the
    same element count and the same number of variable (-1) dims, which keep their order."""
    variable = iter(s for s, d in zip(shape, src, strict=True) if d == -1)
    return [next(variable) if d == -1 else d for d in dst]


def tensor_configs(config: mc.ModelConfig) -> tuple[list[TensorConfig], list[TensorConfig]]:
    def one(t: Any) -> TensorConfig:
        reshape = list(t.reshape.shape) if t.HasField("reshape") else None
        return TensorConfig(t.name, config_type_to_wire(t.data_type), list(t.dims), reshape)

    return [one(t) for t in config.input], [one(t) for t in config.output]


def auto_complete(config: mc.ModelConfig, name: str, backend: str, model: BackendModel, *, has_max_batch: bool,
                  default_max_batch_size: int) -> mc.ModelConfig:
    """Fill what the config leaves out from the model: name, backend, max_batch_size, inputs, outputs."""
    config.name = config.name or name
    config.backend = config.backend or backend
    config.platform = config.platform or backend
    if not has_max_batch and not config.input:
        config.max_batch_size = default_max_batch_size if batchable(model) else 0
    skip = 1 if config.max_batch_size > 0 else 0
    supplied, taken_back = sequence_tensors(config)  # the sequence batcher's, not the client's
    if not config.input:
        for s in model.inputs:
            if s.name not in supplied:
                config.input.add(name=s.name, data_type=wire_to_config_type(s.datatype), dims=list(s.shape)[skip:])
    if not config.output:
        for s in model.outputs:
            if s.name in taken_back:
                continue
            config.output.add(name=s.name, data_type=wire_to_config_type(s.datatype), dims=list(s.shape)[skip:])
    if not config.instance_group:
        config.instance_group.add(count=1, kind=KIND_CPU)
    kinds = {g.kind for g in config.instance_group}
    gpus = gpu_count(name, needed=KIND_GPU in kinds) if kinds & {KIND_AUTO, KIND_GPU} else 0
    if config.backend == PYTHON_BACKEND and KIND_GPU not in kinds:  # a Python model uses no GPU of ours by itself
        gpus = 0
    for group in config.instance_group:
        group.count = group.count or 1
        if group.kind == KIND_AUTO:  # Triton's rule: GPUs when there are any, else CPU
            group.kind = KIND_GPU if gpus > 0 else KIND_CPU
        if group.kind == KIND_GPU and not group.gpus:  # default: every device
            group.gpus.extend(range(gpus))
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    return config


def sequence_tensors(config: mc.ModelConfig) -> tuple[set[str], set[str]]:
    """A sequence model's inputs that the sequence batcher supplies (its control and state inputs) and the outputs it
    takes back (the state outputs): they are not the client's, so auto-complete leaves them out."""
    sb = config.sequence_batching
    return {c.name for c in sb.control_input} | {s.input_name for s in sb.state}, {s.output_name for s in sb.state}


def batchable(model: BackendModel) -> bool:
    """Triton's auto-complete rule: a model batches when every input and output has a variable first dim. A model
    whose dim 0 is fixed (to 1, as a traced export fixes it) runs that shape only: max_batch_size 0; so does one
    with an output whose size depends on the data (validate refuses batching it)."""
    specs = list(model.inputs) + list(model.outputs)
    return (bool(specs) and all(len(s.shape) > 0 and s.shape[0] == -1 for s in specs)
            and not data_dependent_outputs(model))


def validate(config: mc.ModelConfig, name: str, model: BackendModel) -> None:
    """Reject a config that contradicts the model; every message names the config field."""
    if config.name != name:
        raise ModelLoadError(f"model '{name}': config.name '{config.name}' must match the directory name")
    if config.max_batch_size < 0:
        raise ModelLoadError(f"model '{name}': max_batch_size must be >= 0, got {config.max_batch_size}")
    dependent = data_dependent_outputs(model)
    if config.max_batch_size > 0 and dependent:
        raise ModelLoadError(f"model '{name}': max_batch_size {config.max_batch_size} needs outputs that split per "
                             f"request along dim 0, but the size of output(s) {', '.join(map(repr, dependent))} "
                             "depends on the input's values (NonZero, NonMaxSuppression: rows of the whole batch); "
                             "set max_batch_size: 0")
    _check_tensors(config, name, "input", config.input, {s.name: s for s in model.inputs})
    _check_tensors(config, name, "output", config.output, {s.name: s for s in model.outputs})
    for i, group in enumerate(config.instance_group):
        if group.kind == KIND_GPU:
            _check_gpus(name, i, list(group.gpus))
        if group.kind == mc.ModelInstanceGroup.KIND_MODEL:
            raise ModelLoadError(f"model '{name}': instance_group[{i}].kind KIND_MODEL is not supported")
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        raise ModelLoadError(f"model '{name}': dynamic_batching needs max_batch_size > 0")
    for size in config.dynamic_batching.preferred_batch_size:
        if not 0 < size <= config.max_batch_size:
            raise ModelLoadError(f"model '{name}': dynamic_batching.preferred_batch_size {size} is outside "
                                 f"1..max_batch_size ({config.max_batch_size})")
    batch_wait(config, name)
    max_shapes(config, name)  # raises on a missing or malformed max_shape parameter
    _check_bounds(config, name)
    _check_response_cache(config, name)


def _check_bounds(config: mc.ModelConfig, name: str) -> None:
    """The instance count and the warm-up's size (see MAX_INSTANCES), before anything is built from them."""
    total = sum(max(g.count, 1) * (max(len(g.gpus), 1) if g.kind == KIND_GPU else 1) for g in config.instance_group)
    if total > MAX_INSTANCES:
        raise ModelLoadError(f"model '{name}': instance_group asks for {total} instances; at most {MAX_INSTANCES} "
                             "per model are allowed")
    largest = max(config.max_batch_size, 1)
    for warmup in config.model_warmup:
        if warmup.count > MAX_WARMUP_COUNT:
            raise ModelLoadError(f"model '{name}': model_warmup '{warmup.name}' count {warmup.count} is above "
                                 f"{MAX_WARMUP_COUNT}, the most runs a warm-up may take")
        if warmup.batch_size > largest:
            raise ModelLoadError(f"model '{name}': model_warmup '{warmup.name}' batch_size {warmup.batch_size} is "
                                 f"above the model's max_batch_size ({config.max_batch_size})")


def _check_response_cache(config: mc.ModelConfig, name: str) -> None:
    """Triton refuses a cached model whose requests are not independent (a sequence's depend on its state) or
    whose answers are streams (decoupled), in these words."""
    if not config.response_cache.enable:
        return
    if config.HasField("sequence_batching"):
        raise ModelLoadError(f"Response Cache does not currently support model {name} with sequence batching "
                             "scheduler. Please disable the response cache.")
    if config.model_transaction_policy.decoupled:
        raise ModelLoadError(f"Response Cache does not currently support model {name} with 'decoupled' "
                             "transaction policy. Please disable the response cache.")


def batch_wait(config: mc.ModelConfig, name: str) -> str:
    """The dynamic batcher's wait policy (server/scheduling/config.py): "full" (Triton's, the default) or
    "adaptive", from parameters["dynamic_batching_wait"]."""
    if BATCH_WAIT_PARAM not in config.parameters:
        return "full"
    value = config.parameters[BATCH_WAIT_PARAM].string_value
    if value not in BATCH_WAITS:
        raise ModelLoadError(f"model '{name}': parameters['{BATCH_WAIT_PARAM}'] = '{value}' must be one of "
                             f"{', '.join(BATCH_WAITS)}")
    return value


def _check_gpus(name: str, index: int, gpus: list[int]) -> None:
    """A GPU group must name devices that exist: there is no silent CPU fallback."""
    count = gpu_count(name, needed=True)
    where = "this machine has no CUDA device" if count == 0 else f"the devices here are cuda:0..cuda:{count - 1}"
    for gpu in gpus or [0]:  # empty after auto-complete only when there is no device at all
        if not 0 <= gpu < count:
            raise ModelLoadError(f"model '{name}': instance_group[{index}] (KIND_GPU) places instances on "
                                 f"cuda:{gpu}, but {where}; use KIND_CPU, or KIND_AUTO to pick GPU when present")


def _check_tensors(config: mc.ModelConfig, name: str, kind: str, tensors: Any, specs: dict[str, TensorSpec]) -> None:
    batching = config.max_batch_size > 0
    for i, t in enumerate(tensors):
        field = f"{kind}[{i}]"
        spec = specs.get(t.name)
        if spec is None:
            raise ModelLoadError(f"model '{name}': {field}.name '{t.name}' is not a model {kind}; the model has "
                                 f"{sorted(specs)}")
        if config_type_to_wire(t.data_type) != spec.datatype:
            raise ModelLoadError(f"model '{name}': {field}.data_type {mc.DataType.Name(t.data_type)} does not match "
                                 f"the model's {spec.datatype} for '{t.name}'")
        model_shape = list(spec.shape)
        if batching:
            if not model_shape or model_shape[0] not in (-1, 1):
                raise ModelLoadError(f"model '{name}': max_batch_size {config.max_batch_size} needs a leading batch "
                                     f"dim on '{t.name}', but the model's shape is {model_shape}")
            model_shape = model_shape[1:]
        if kind == "input" and t.format in IMAGE_FORMATS and len(t.dims) != 3:  # Triton's rule for image formats
            raise ModelLoadError(f"model '{name}': {field}.format {mc.ModelInput.Format.Name(t.format)} needs 3 dims "
                                 f"(without the batch dim), got {list(t.dims)}")
        if t.HasField("reshape"):  # dims is the API's shape, reshape.shape the model's
            _check_dims(name, f"{field}.reshape.shape", t.name, list(t.reshape.shape), model_shape)
            _check_reshape(name, field, t.name, list(t.dims), list(t.reshape.shape))
        else:
            _check_dims(name, f"{field}.dims", t.name, list(t.dims), model_shape)


def _check_reshape(name: str, field: str, tensor: str, dims: list[int], shape: list[int]) -> None:
    """The API and model shapes must hold the same elements; variable dims map one to one, in order."""
    fixed = [int(np.prod([d for d in x if d != -1])) for x in (dims, shape)]
    if fixed[0] != fixed[1] or dims.count(-1) != shape.count(-1) or any(d < -1 for d in dims + shape):
        raise ModelLoadError(f"model '{name}': {field}.dims {dims} and {field}.reshape.shape {shape} for '{tensor}' "
                             "must hold the same number of elements (with the same number of -1 dims, which "
                             "map to each other in order)")


def _check_dims(name: str, field: str, tensor: str, dims: list[int], model_shape: list[int]) -> None:
    ok = len(dims) == len(model_shape) and all(m in (-1, d) or d == -1 for d, m in zip(dims, model_shape, strict=True))
    if not ok:
        raise ModelLoadError(f"model '{name}': {field} {dims} for '{tensor}' contradicts the model's shape "
                             f"{model_shape}")


def max_shapes(config: mc.ModelConfig, name: str) -> dict[str, list[int]]:
    """Per input, the largest shape a request may have (batch = max_batch_size): this sizes the arena. A Python
    model has no arena: its dynamic inputs have no max (they are left out)."""
    out = {}
    for t in config.input:
        dims = list(t.dims)
        key = MAX_SHAPE_PARAM + t.name
        if key in config.parameters and config.backend != PYTHON_BACKEND:
            dims = _parse_max_shape(name, key, config.parameters[key].string_value, dims)
        elif -1 in dims and config.backend == PYTHON_BACKEND:
            continue
        elif -1 in dims:
            raise ModelLoadError(f"model '{name}': input '{t.name}' has dynamic dims {dims}; add "
                                 f'parameters {{ key: "{key}" value: {{ string_value: "..." }} }} with the max of each '
                                 "dim so the arena can be sized")
        out[t.name] = ([config.max_batch_size] if config.max_batch_size > 0 else []) + dims
    return out


def _parse_max_shape(name: str, key: str, text: str, dims: list[int]) -> list[int]:
    try:
        values = [int(v) for v in text.replace("x", ",").split(",") if v.strip()]
    except ValueError:
        values = []
    if len(values) != len(dims) or any(v <= 0 or (d != -1 and v != d) for v, d in zip(values, dims, strict=False)):
        raise ModelLoadError(f"model '{name}': parameters['{key}'] = '{text}' must give one positive value per dim "
                             f"of {dims} (equal to the fixed ones)")
    return values


def engine_max_shapes(config: mc.ModelConfig, name: str) -> dict[str, tuple[int, ...]]:
    """max_shapes in the model's own shapes (what the engine plans with): an input's reshape applied."""
    shapes = max_shapes(config, name)
    lead = 1 if config.max_batch_size > 0 else 0
    for t in config.input:
        if t.HasField("reshape") and t.name in shapes:
            full = shapes[t.name]
            shapes[t.name] = full[:lead] + map_shape(full[lead:], list(t.dims), list(t.reshape.shape))
    return {k: tuple(v) for k, v in shapes.items()}


def within_max(shape: list[int], limit: list[int]) -> bool:
    return len(shape) == len(limit) and all(s <= m for s, m in zip(shape, limit, strict=True))


def instance_devices(config: mc.ModelConfig) -> list[str]:
    """The engine device of every instance, in order: `count` per listed GPU for KIND_GPU, `count` CPUs else."""
    devices = []
    for group in config.instance_group:
        count = max(group.count, 1)
        if group.kind == KIND_GPU:
            devices += [f"cuda:{gpu}" for gpu in group.gpus for _ in range(count)]
        else:
            devices += ["cpu"] * count
    return devices or ["cpu"]


def instance_count(config: mc.ModelConfig) -> int:
    return len(instance_devices(config))


def gpu_count(name: str, needed: bool) -> int:
    """CUDA devices here. Where CUDA support is not installed, a group that needs a GPU (KIND_GPU) is a load error
    naming the extra to install; KIND_AUTO, which takes GPUs only when there are any, then finds none."""
    try:
        return cuda_device_count()
    except engine.EngineError as exc:
        if needed:
            raise ModelLoadError(f"model '{name}': instance_group KIND_GPU: {exc}") from None
        return 0


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices the engine can use (counted once: they do not come and go while the server runs)."""
    return engine.cuda_device_count()


def numpy_dtype(config_type: int) -> np.dtype:
    return wire_to_numpy(config_type_to_wire(config_type))
