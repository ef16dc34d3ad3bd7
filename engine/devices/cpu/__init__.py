"""The CPU device (`Model.instance("cpu")`): numpy arena, kernels on numba, oneDNN and BLAS, the blocked layout.

device.py is the Device; kernels.py the kernel table (one module per op family beside it, conv/ for the
convolutions, layout/ for the blocked layout, onednn/ and blas.py for the libraries, threads.py for the pool);
options.py its settings.
"""

from engine.devices.cpu.numba_cache import stamp_with_kernel_sources

stamp_with_kernel_sources()  # before any kernel module below defines a cached numba function

from engine.devices.cpu.device import CpuDevice  # noqa: E402
from engine.devices.cpu.kernels import KERNELS, register_kernel  # noqa: E402
from engine.devices.cpu.options import CpuOptions  # noqa: E402

__all__ = ["KERNELS", "CpuDevice", "CpuOptions", "register_kernel"]
