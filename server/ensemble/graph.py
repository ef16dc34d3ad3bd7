"""An ensemble's steps as a data-flow graph, checked at load as Triton checks it (its messages, where it has one):

- every step names a model, maps inputs and outputs; no ensemble tensor is written twice, no model input is fed
  twice (check_steps);
- every ensemble input is used, every output is written, every tensor a step writes is read, and no steps feed each
  other in a cycle (order_steps, which also gives an order in which the steps can run);
- against the composing models' configs: every mapped input and output exists, every model input is mapped, and a
  tensor that meets several models has one datatype and compatible shapes (check_mappings).

Pure functions of the configs: nothing here loads or runs a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from server.datatypes import config_type_to_wire
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc


@dataclass(frozen=True)
class Step:
    index: int
    model_name: str
    model_version: str  # "" = the newest ready version (Triton's -1)
    input_map: Mapping[str, str]  # model input -> ensemble tensor
    output_map: Mapping[str, str]  # model output -> ensemble tensor

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"


@dataclass(frozen=True)
class Tensor:
    """What one side (the ensemble or a step's model) says of an ensemble tensor."""

    owner: str
    datatype: str
    dims: tuple[int, ...]
    batching: bool

    @property
    def full_dims(self) -> tuple[int, ...]:
        return ((-1,) if self.batching else ()) + self.dims


def steps_of(config: mc.ModelConfig) -> list[Step]:
    return [Step(i, s.model_name, str(s.model_version) if s.model_version > 0 else "", dict(s.input_map),
                 dict(s.output_map)) for i, s in enumerate(config.ensemble_scheduling.step)]


def check_steps(name: str, steps: Sequence[Step]) -> None:
    if not steps:
        raise ModelLoadError(f"must specify 'step' for ensemble '{name}'")
    written: dict[str, Step] = {}
    for step in steps:
        for field, value in (("model_name", step.model_name), ("input_map", step.input_map),
                             ("output_map", step.output_map)):
            if not value:
                raise ModelLoadError(f"must specify '{field}' in step {step.index} of ensemble '{name}'")
        for tensor in step.output_map.values():
            if tensor in written:
                raise ModelLoadError(f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                                     f"'{name}' step {step.index}")
            written[tensor] = step


def order_steps(name: str, inputs: Sequence[str], outputs: Sequence[str], steps: Sequence[Step]) -> list[Step]:
    """The steps in an order where each runs after the steps that write its inputs; every ensemble tensor must be
    used, every output written, and the steps may not feed each other in a cycle."""
    check_steps(name, steps)
    read = {t for s in steps for t in s.input_map.values()}
    written = {t: s for s in steps for t in s.output_map.values()}
    for tensor in inputs:
        if tensor not in read:
            raise ModelLoadError(f"ensemble input '{tensor}' for ensemble '{name}' is not used")
    ready, order, waiting = set(inputs), [], list(steps)
    while True:
        runnable = [s for s in waiting if set(s.input_map.values()) <= ready]
        if not runnable:
            break
        for step in runnable:
            order.append(step)
            waiting.remove(step)
            ready |= set(step.output_map.values())
    if waiting:
        _unrunnable(name, waiting, written, ready)
    for tensor in outputs:
        if tensor not in written and tensor not in inputs:
            raise ModelLoadError(f"output '{tensor}' for ensemble '{name}' is not written")
    for tensor, step in written.items():
        if tensor not in read and tensor not in outputs:
            raise ModelLoadError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}': {step.label} writes it "
                                 "and nothing reads it")
    return order


def _unrunnable(name: str, waiting: list[Step], written: Mapping[str, Step], ready: set[str]) -> None:
    """Steps that never get their inputs: a cycle between them, or an input nothing writes."""
    cycle = _cycle(waiting, written)
    if cycle:
        first = cycle.index(min(cycle, key=lambda s: s.index))  # told from its first step
        cycle = cycle[first:] + cycle[:first]
        path = " -> ".join(s.label for s in [*cycle, cycle[0]])
        raise ModelLoadError(f"in ensemble '{name}', steps feed each other in a cycle: {path}")
    step = waiting[0]
    missing = sorted(t for t in step.input_map.values() if t not in ready and t not in written)
    raise ModelLoadError(f"in ensemble '{name}', {step.label} reads ensemble tensor '{missing[0]}', which is "
                         "neither an ensemble input nor written by any step")


def _cycle(steps: list[Step], written: Mapping[str, Step]) -> list[Step]:
    """A cycle among `steps` in run order (A before B when B reads what A writes), or []."""
    members = {s.index for s in steps}
    feeders = {s.index: [written[t] for t in s.input_map.values() if t in written and written[t].index in members]
               for s in steps}
    state: dict[int, str] = {}
    path: list[Step] = []

    def visit(step: Step) -> list[Step]:
        state[step.index] = "open"
        path.append(step)
        for feeder in feeders[step.index]:
            if state.get(feeder.index) == "open":
                return list(reversed(path[path.index(feeder):]))
            if feeder.index not in state and (found := visit(feeder)):
                return found
        state[step.index] = "done"
        path.pop()
        return []

    for step in steps:
        if step.index not in state and (found := visit(step)):
            return found
    return []


def check_mappings(name: str, config: mc.ModelConfig, steps: Sequence[Step],
                   composing: Mapping[int, mc.ModelConfig]) -> None:
    """Every step against its model's config (`composing`, by step index)."""
    batching = config.max_batch_size > 0
    tensors: dict[str, Tensor] = {}
    for t in config.input:
        tensors[t.name] = Tensor(f"ensemble '{name}'", config_type_to_wire(t.data_type), _dims(t), batching)
    for t in config.output:
        tensors[t.name] = Tensor(f"ensemble '{name}'", config_type_to_wire(t.data_type), _dims(t), batching)
    for step in steps:
        model = composing[step.index]
        if model.model_transaction_policy.decoupled:
            raise ModelLoadError(f"in ensemble '{name}', {step.label}: decoupled models in ensembles are not "
                                 "supported")
        if 0 < model.max_batch_size < config.max_batch_size:
            raise ModelLoadError(f"ensemble '{name}' allows maximum batch size {config.max_batch_size}, but it "
                                 f"contains model {step.model_name} which only allows maximum batch size to be "
                                 f"{model.max_batch_size}")
        _check_side(name, step, "input", step.input_map, model, tensors)
        _check_side(name, step, "output", step.output_map, model, tensors)


def _check_side(name: str, step: Step, kind: str, mapping: Mapping[str, str], model: mc.ModelConfig,
                tensors: dict[str, Tensor]) -> None:
    declared = {t.name: t for t in (model.input if kind == "input" else model.output)}
    for model_tensor, ensemble_tensor in mapping.items():
        if model_tensor not in declared:
            verb = "mapping to non-existing input" if kind == "input" else "mapped from non-existing output"
            raise ModelLoadError(f"in ensemble '{name}', ensemble tensor {ensemble_tensor} is {verb} {model_tensor} "
                                 f"in model {step.model_name}")
    if kind == "input":
        for model_input in declared:
            if model_input not in mapping:
                raise ModelLoadError(f"in ensemble '{name}', input {model_input} in model {step.model_name} is not "
                                     "mapped to any ensemble tensors")
    for model_tensor, ensemble_tensor in mapping.items():
        t = declared[model_tensor]
        seen = Tensor(f"model '{step.model_name}'", config_type_to_wire(t.data_type), _dims(t),
                      model.max_batch_size > 0)
        known = tensors.setdefault(ensemble_tensor, seen)
        if known is not seen:
            _consistent(name, ensemble_tensor, known, seen)


def _consistent(name: str, tensor: str, a: Tensor, b: Tensor) -> None:
    if a.datatype != b.datatype:
        raise ModelLoadError(f"in ensemble '{name}', ensemble tensor {tensor}: inconsistent data type: {a.datatype} "
                             f"is inferred from {a.owner} while {b.datatype} is inferred from {b.owner}")
    if not (_same_dims(a.dims, b.dims) or _same_dims(a.full_dims, b.full_dims)):
        raise ModelLoadError(f"in ensemble '{name}', ensemble tensor {tensor}: inconsistent shape: "
                             f"{list(a.full_dims)} is inferred from {a.owner} while {list(b.full_dims)} is inferred "
                             f"from {b.owner}")


def _same_dims(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Equal, a -1 matching any size (checked when the request runs)."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _dims(t: mc.ModelInput | mc.ModelOutput) -> tuple[int, ...]:
    return tuple(t.reshape.shape) if t.HasField("reshape") else tuple(t.dims)
