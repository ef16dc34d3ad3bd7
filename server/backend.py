"""The seam between the server and what runs a model: what the server needs from a loaded model and from one of its
instances. The engine's Model and Instance implement it (structurally: they never import the server); a Python
backend (Triton's TritonPythonModel) would implement the same two protocols.

An instance is used by one thread at a time and preallocates its memory when it is created; `run_timed` reports
where a run's time went as Triton's phases (engine.RunTimings), which the statistics and metrics split by.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from engine import RunTimings

__all__ = ["BackendInstance", "BackendModel", "RunTimings", "TensorSpec"]


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

    # Optional (the engine's Instance has them; the data plane refuses profiling for a backend without them):
    # start_profile() -> Profile, stop_profile() -> Profile | None and the `profile` being collected
    # (engine/runtime/profile.py: merge, as_dict, table).


class BackendModel(Protocol):
    """A loaded model: its declared tensors, and instances made from it."""

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    def instance(self, device: str, max_shapes: Mapping[str, tuple[int, ...]]) -> BackendInstance:
        """An instance on `device` ("cpu", "cuda:N") planned for inputs up to `max_shapes`."""
