"""The seam between the server and what runs a model: what the server needs from a loaded model and from one of its
instances. The engine's Model and Instance implement it (structurally: they never import the server); the Python
backend (server/python_backend/: Triton's TritonPythonModel in a worker process) implements the same protocols.

An instance is used by one thread at a time and preallocates its memory when it is created; `run_timed` reports
where a run's time went as Triton's phases (engine.RunTimings), which the statistics and metrics split by.

A backend that takes a batch's requests one by one, as Triton's backend API hands them over (the Python backend:
each request has its own id, parameters and requested outputs, and a decoupled model answers each with 0..n
responses), also implements RequestsInstance; the scheduler then passes it the requests unmerged, each with its
RequestContext. An instance that holds something beyond memory (a process) implements ClosableInstance, which
the repository calls when the model is unloaded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from engine import RunTimings

__all__ = ["FRONT_END_PARAMETERS", "BackendInstance", "BackendModel", "Cancellation", "ClosableInstance", "OpProfile",
           "ProfilingInstance", "RequestContext", "RequestsInstance", "ResponseSink", "RunTimings", "SequenceFlags",
           "TensorSpec", "data_dependent_outputs", "quantized_inputs"]

# Request parameters the protocol front ends consume; a model never sees them (as in Triton).
FRONT_END_PARAMETERS = frozenset({"binary_data_output", "priority", "timeout", "triton_enable_empty_final_response",
                                  "sequence_id", "sequence_start", "sequence_end"})


class TensorSpec(Protocol):
    """One input or output as the model declares it."""

    @property
    def name(self) -> str: ...

    @property
    def datatype(self) -> str:
        """The KServe name ("FP32", ...)."""

    @property
    def shape(self) -> tuple[int, ...]:
        """-1 marks a dynamic dimension."""


class BackendInstance(Protocol):
    """One executor of a loaded model on one device, with memory of its own."""

    @property
    def device_name(self) -> str:
        """"cpu", "cuda:0", ...: the label of its metrics."""

    @property
    def memory_bytes(self) -> int:
        """Activation memory preallocated on its device (arena and workspace)."""

    @property
    def device_memory_bytes(self) -> int | None:
        """What it holds on a device with its own memory, weights included; None on the host."""

    def device_memory(self) -> tuple[int, int] | None:
        """(used, total) bytes of its whole device from the driver, read now; None where there are no such
        figures."""

    def run_timed(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RunTimings]:
        """Runs the model on `inputs`; the outputs are the caller's (nothing of them is reused by a later run)."""



class BackendModel(Protocol):
    """A loaded model: its declared tensors, and instances made from it."""

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    def instance(self, device: str, max_shapes: Mapping[str, tuple[int, ...]]) -> BackendInstance:
        """An instance on `device` ("cpu", "cuda:N") planned for inputs up to `max_shapes`."""


def data_dependent_outputs(model: BackendModel) -> list[str]:
    """The outputs whose size depends on the input's values (an engine model's NonZero, NonMaxSuppression: the
    engine's `Model.data_dependent_outputs`); a BackendModel declares them optionally, a model without the
    attribute has none (its outputs' shapes follow from the inputs' alone)."""
    return list(getattr(model, "data_dependent_outputs", ()))


def quantized_inputs(model: BackendModel) -> list[str]:
    """The inputs from which an int8 quantization is reached (the engine's `Model.quantized_inputs`), in which a NaN
    is refused per request before batching (a run that met it would fail every request batched with it); optional,
    like data_dependent_outputs."""
    return list(getattr(model, "quantized_inputs", ()))


class ResponseSink(Protocol):
    """Where a decoupled model's responses to one request go, from any thread; the last one has final=True (and
    may carry no outputs: a final flag alone)."""

    def send(self, outputs: dict[str, np.ndarray] | None, error: Exception | None, final: bool,
             parameters: Mapping[str, Any]) -> None:
        """`outputs` None: no response, the final flag alone (or an error)."""

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """`callback` runs once (on any thread) when the request is cancelled before its final response: its client
        went away or stopped reading; at once when it already was."""


class Cancellation:
    """One request's cancellation: hooks a backend registers (from any thread) run once when the request's client
    goes away before its answer (an HTTP disconnect, a gRPC cancel or deadline, a stream that stops reading)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._hooks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """`callback` runs once when the request is cancelled; at once when it already was."""
        with self._lock:
            if not self._cancelled:
                self._hooks.append(callback)
                return
        callback()

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled, hooks, self._hooks = True, self._hooks, []
        for hook in hooks:
            hook()


@dataclass(frozen=True)
class SequenceFlags:
    """A request's place in its sequence (a stateful model's): Triton's correlation id (a non-zero uint64 or a
    non-empty string) and the START and END flags."""

    correlation_id: int | str
    start: bool = False
    end: bool = False

    @property
    def triton_flags(self) -> int:
        """TRITONSERVER_REQUEST_FLAG_SEQUENCE_START (1) | _END (2), as a Python model's request.flags() gives them."""
        return int(self.start) | (2 if self.end else 0)


@dataclass(frozen=True)
class RequestContext:
    """What a backend taking requests one by one may know of a request besides its inputs."""

    request_id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    requested_outputs: tuple[str, ...] = ()  # empty: every output
    responses: ResponseSink | None = None  # a decoupled model's responses go there, not into the run's result
    sequence: SequenceFlags | None = None  # the request's sequence, when it names one
    # set when the client goes away while the request waits or runs (a decoupled one's: through its sink)
    cancellation: Cancellation = field(default_factory=Cancellation)

    def model_parameters(self) -> dict[str, bool | int | str]:
        """The parameters the model sees: the request's, less the front end's, of the types a model can read."""
        return {k: v for k, v in self.parameters.items()
                if k not in FRONT_END_PARAMETERS and isinstance(v, bool | int | str)}


@runtime_checkable
class RequestsInstance(BackendInstance, Protocol):
    """An instance that runs a batch as the separate requests it is made of."""

    def run_requests(self, requests: Sequence[tuple[Mapping[str, np.ndarray], RequestContext]]
                     ) -> tuple[list[dict[str, np.ndarray] | Exception], RunTimings]:
        """Each request's outputs (or the error that fails that request alone), in order, and the run's phases. A
        decoupled model's outputs go to its requests' ResponseSinks instead (the lists are then empty)."""


class OpProfile(Protocol):
    """Time per node and per op kind over the runs of a profiling window (the engine's, engine/runtime/profile.py)."""

    def merge(self, other: OpProfile) -> OpProfile: ...

    def as_dict(self) -> dict[str, Any]: ...

    def table(self, top: int | None = 20) -> str: ...


@runtime_checkable
class ProfilingInstance(Protocol):
    """An instance that can time each node of the runs that follow (the engine's; the data plane refuses profiling
    for one that cannot)."""

    @property
    def profile(self) -> OpProfile | None: ...

    def start_profile(self) -> OpProfile: ...

    def stop_profile(self) -> OpProfile | None: ...


@runtime_checkable
class ClosableInstance(Protocol):
    """An instance holding resources beyond memory (a worker process), released when its model is unloaded."""

    def close(self) -> None: ...
