"""Devices by name. CPU is built in; CUDA is imported on first use, so CPU-only installs never need numba-cuda."""

from __future__ import annotations

import importlib
from types import ModuleType

from engine.devices import toolchain
from engine.devices.base import Device
from engine.devices.cpu import CpuDevice, CpuOptions
from engine.errors import EngineError

_ALIASES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}


def get_device(name: str = "cpu", cpu_options: CpuOptions | None = None) -> Device:
    """The Device for "cpu", "cuda" or "gpu" (EngineError for anything else or an unavailable CUDA); the CPU takes
    `cpu_options` (default: CpuOptions())."""
    key = _ALIASES.get(str(name).lower().split(":")[0])
    if key is None:
        raise EngineError(f"unknown device {name!r}; supported devices: cpu, cuda (gpu)")
    toolchain.check()  # before any kernel of the device is compiled
    if key == "cpu":
        return CpuDevice(cpu_options)
    try:
        return _cuda_module().CudaDevice(name)
    except EngineError:
        raise
    except Exception as e:  # driver errors without a GPU
        raise EngineError(f"CUDA device support is not installed/available: {type(e).__name__}: {e}") from None


def cuda_device_count() -> int:
    """CUDA devices the engine can use (0: none found); EngineError naming the `cuda` extra where CUDA support is
    not installed."""
    return int(_cuda_module().device_count())


def _cuda_module() -> ModuleType:
    """engine.devices.cuda, imported only when CUDA is asked for."""
    try:
        return importlib.import_module("engine.devices.cuda")
    except ImportError as e:  # numba-cuda missing
        raise EngineError(f"CUDA support is not installed ({e}): install nnserve[cuda]") from None


__all__ = ["CpuDevice", "CpuOptions", "Device", "cuda_device_count", "get_device"]
