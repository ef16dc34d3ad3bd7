"""What the sequence batcher adds to a request's inputs: the control tensors (Triton's CONTROL_SEQUENCE_START, _END,
_READY and _CORRID) and the implicit state (the model's output fed back as an input on the sequence's next request).

A control tensor has shape [1] ([1, 1] for a model that batches), as Triton's: START, END and READY hold the
control's false or true value (fp32_false_true, int32_false_true or bool_false_true), CORRID the request's
correlation id in the control's data_type (a string id as a BYTES element).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from server.backend import SequenceFlags
from server.errors import InvalidArgumentError

START, END, READY, CORRID = "CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY", \
    "CONTROL_SEQUENCE_CORRID"


@dataclass(frozen=True)
class Control:
    """One control input: its tensor name, kind, and values (false, true) of its dtype; CORRID has no values."""

    name: str
    kind: str
    dtype: np.dtype
    false_true: tuple[object, object] = (0, 1)


@dataclass(frozen=True)
class StateSpec:
    """One implicit state: fed to the model as `input_name`, taken back from its `output_name`; `initial` is the
    value on the sequence's first request (its START), shaped as the model takes it (batch dim included)."""

    input_name: str
    output_name: str
    initial: np.ndarray


def control_tensors(controls: tuple[Control, ...], flags: SequenceFlags, batched: bool) -> dict[str, np.ndarray]:
    """The control inputs of one ready request (READY true)."""
    shape = (1, 1) if batched else (1,)
    tensors = {}
    for control in controls:
        if control.kind == CORRID:
            tensors[control.name] = _corrid(control, flags.correlation_id, shape)
            continue
        on = {START: flags.start, END: flags.end, READY: True}[control.kind]
        tensors[control.name] = np.full(shape, control.false_true[int(on)], dtype=control.dtype)
    return tensors


def _corrid(control: Control, correlation_id: int | str, shape: tuple[int, ...]) -> np.ndarray:
    if control.dtype == np.object_:
        value: object = correlation_id.encode() if isinstance(correlation_id, str) else str(correlation_id).encode()
        return np.full(shape, value, dtype=np.object_)
    # a 32-bit control takes the id's low-order 32 bits (Triton's truncation); a string id was checked to be a number
    value = np.array([int(correlation_id)], dtype=np.uint64).astype(control.dtype)
    return np.full(shape, value[0], dtype=control.dtype)


def check_correlation_id(controls: tuple[Control, ...], correlation_id: int | str, model: str) -> None:
    """A string id reaches an integer CORRID control only when it is a number."""
    for control in controls:
        if control.kind != CORRID or control.dtype == np.object_ or not isinstance(correlation_id, str):
            continue
        if not correlation_id.isdigit() or int(correlation_id) >= 2**64:
            raise InvalidArgumentError(f"inference request to model '{model}': the correlation ID "
                                       f"'{correlation_id[:64]}' is a string, but its CORRID control "
                                       f"'{control.name}' takes an unsigned integer")


def initial_states(states: tuple[StateSpec, ...]) -> dict[str, np.ndarray]:
    """Every state's value for the first request of a sequence (copies: a model may write into its inputs)."""
    return {s.input_name: s.initial.copy() for s in states}
