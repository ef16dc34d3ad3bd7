"""Config names for a PNNX model's tensors. pnnx names every input and output by position (in0, in1, ..., out0,
...), so a config written for Triton (INPUT0, OUTPUT0) cannot use the model's names. When none of a config's input
and output names is a model name, the config's tensors are the model's in order: config input i is model input i,
config output j model output j. The counts must agree; datatypes and dims are then checked as for named tensors
(config.validate), and everything the server shows (metadata, statistics, requests, responses) uses the config's
names.

A config that names some tensors as the model does and others not (inputs and outputs together) is refused: it is
a typo, not a mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine import RunTimings
from server.backend import BackendInstance, BackendModel, TensorSpec, data_dependent_outputs, quantized_inputs
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc

POSITIONAL_BACKENDS = ("pnnx",)


def bind_names(config: mc.ModelConfig, name: str, model: BackendModel) -> BackendModel:
    """`model`, or a view of it under the config's tensor names when the config names them by position."""
    if config.backend not in POSITIONAL_BACKENDS:
        return model
    kinds = (("input", [t.name for t in config.input], [s.name for s in model.inputs]),
             ("output", [t.name for t in config.output], [s.name for s in model.outputs]))
    check_not_mixed(name, kinds)
    inputs, outputs = (positional(name, kind, ours, theirs) for kind, ours, theirs in kinds)
    if not inputs and not outputs:
        return model
    return RenamedModel(model, inputs, outputs)


def check_not_mixed(model: str, kinds: Sequence[tuple[str, list[str], list[str]]]) -> None:
    """A config names every tensor it lists as the model does, or none: a config that names some as the model does
    and others not has a typo (a misspelt input of a one-input model would otherwise become a mapping)."""
    named = [(kind, i, n) for kind, ours, theirs in kinds for i, n in enumerate(ours) if n in theirs]
    unknown = [(kind, i, n, theirs) for kind, ours, theirs in kinds for i, n in enumerate(ours) if n not in theirs]
    if named and unknown:
        kind, i, n, theirs = unknown[0]
        other_kind, j, other = named[0]
        raise ModelLoadError(f"model '{model}': {kind}[{i}].name '{n}' is not a model {kind} (the model's: "
                             f"{theirs}), while {other_kind}[{j}].name '{other}' is named as the model names it; name "
                             "the inputs and outputs all as the model does, or none of them (they are then the "
                             "model's in order)")


def positional(model: str, kind: str, config_names: list[str], model_names: list[str]) -> dict[str, str]:
    """{config name: model name} when the config's names are none of the model's, else {} (names match, or the
    config lists none: auto-complete fills the model's)."""
    unknown = [n for n in config_names if n not in model_names]
    if not unknown:
        return {}
    if len(unknown) != len(config_names):
        first = config_names.index(unknown[0])
        raise ModelLoadError(f"model '{model}': {kind}[{first}].name '{unknown[0]}' is not a model {kind}, while "
                             f"other {kind}s are named as the model names them ({model_names}); name them all as the "
                             f"model does, or none of them (they are then the model's {kind}s in order)")
    if len(config_names) != len(model_names):
        raise ModelLoadError(f"model '{model}': the config's {kind}s {config_names} are not the model's "
                             f"{model_names}; taken in order, there must be as many ({len(config_names)} in the "
                             f"config, {len(model_names)} in the model)")
    return dict(zip(config_names, model_names, strict=True))


@dataclass(frozen=True)
class _Spec:
    name: str
    datatype: str
    shape: tuple[int, ...]


def _renamed(specs: Sequence[TensorSpec], names: Mapping[str, str]) -> list[_Spec]:
    back = {m: c for c, m in names.items()}
    return [_Spec(back.get(s.name, s.name), s.datatype, tuple(s.shape)) for s in specs]


class RenamedModel:
    """A BackendModel whose tensors carry the config's names; its instances translate at each run."""

    def __init__(self, model: BackendModel, inputs: Mapping[str, str], outputs: Mapping[str, str]):
        self.model = model
        self.input_names = dict(inputs)  # config name -> model name
        self.output_names = {m: c for c, m in outputs.items()}  # model name -> config name
        self._inputs = _renamed(model.inputs, inputs)
        self._outputs = _renamed(model.outputs, outputs)

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        return self._inputs

    @property
    def outputs(self) -> Sequence[TensorSpec]:
        return self._outputs

    @property
    def data_dependent_outputs(self) -> list[str]:
        return [self.output_names.get(n, n) for n in data_dependent_outputs(self.model)]

    @property
    def quantized_inputs(self) -> list[str]:
        back = {m: c for c, m in self.input_names.items()}
        return [back.get(n, n) for n in quantized_inputs(self.model)]

    def instance(self, device: str, max_shapes: Mapping[str, tuple[int, ...]]) -> BackendInstance:
        shapes = {self.input_names.get(k, k): v for k, v in max_shapes.items()}
        return RenamedInstance(self.model.instance(device, max_shapes=shapes), self.input_names, self.output_names)


class RenamedInstance:
    def __init__(self, instance: BackendInstance, inputs: Mapping[str, str], outputs: Mapping[str, str]):
        self.instance = instance
        self.inputs, self.outputs = inputs, outputs

    @property
    def device_name(self) -> str:
        return self.instance.device_name

    @property
    def memory_bytes(self) -> int:
        return self.instance.memory_bytes

    @property
    def device_memory_bytes(self) -> int | None:
        return self.instance.device_memory_bytes

    def device_memory(self) -> tuple[int, int] | None:
        return self.instance.device_memory()

    def run_timed(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RunTimings]:
        feed = {self.inputs.get(k, k): v for k, v in inputs.items()}
        outputs, timings = self.instance.run_timed(feed)
        return {self.outputs.get(k, k): v for k, v in outputs.items()}, timings
