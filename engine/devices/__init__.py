"""Devices by name. CPU is built in; CUDA is imported on first use, so CPU-only installs never need numba-cuda."""

from __future__ import annotations

import importlib

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
    if key == "cpu":
        return CpuDevice(cpu_options)
    try:
        module = importlib.import_module("engine.devices.cuda")
        return module.CudaDevice(name)
    except EngineError:
        raise
    except Exception as e:  # ImportError without numba-cuda, driver errors without a GPU
        raise EngineError(f"CUDA device support is not installed/available: {type(e).__name__}: {e}") from None


__all__ = ["CpuDevice", "CpuOptions", "Device", "get_device"]
