"""The engine's settings, read from the environment in one place (`environment_options`) and passed down:
Model.instance(options=...) hands them to the instance, which gives the device its part.

- ENGINE_DEBUG (default 0): 1 traces every node (op, shapes, arena offsets) at DEBUG on `engine.runtime`, 2 also
  logs output stats (`Instance.debug`); any other non-empty value but 0 counts as 1; the CLI prints an internal
  error's traceback when it is not 0.
- NNSERVE_ONEDNN, NNSERVE_LAYOUT, NNSERVE_WINOGRAD, NNSERVE_BLAS, NNSERVE_NUM_THREADS: the CPU device's
  (`EngineOptions.cpu`, engine/devices/cpu/options.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.devices.cpu.options import CpuOptions


@dataclass(frozen=True)
class EngineOptions:
    debug: int = 0
    cpu: CpuOptions = field(default_factory=CpuOptions)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EngineOptions:
        value = environ.get("ENGINE_DEBUG", "")
        debug = int(value) if value.isdigit() else (1 if value else 0)
        return cls(debug=debug, cpu=CpuOptions.from_env(environ))


def environment_options() -> EngineOptions:
    """The options the process environment sets: the one place the engine reads os.environ."""
    return EngineOptions.from_env(os.environ)
