"""The CPU device's settings, read from the environment in one place (`CpuOptions.from_env`) and passed down.

- NNSERVE_ONEDNN (default on): `0` never loads oneDNN; convolutions, pooling and reorders run the numpy/numba
  kernels (and the blocked layout is off).
- NNSERVE_LAYOUT (default: blocked where it pays): `nchw` keeps activations NCHW between convolutions.
- NNSERVE_WINOGRAD (default on): `0` keeps blocked 3x3 convolutions on oneDNN's direct kernel.
- NNSERVE_BLAS (default: MKL's sgemm when the `mkl` wheel is installed): `numpy` or `openblas` runs GEMMs on
  numpy's matmul.
- NNSERVE_NUM_THREADS (default: the CPUs the affinity mask and cgroup quota allow): the kernel thread pool's size.
- NNSERVE_SPIN_US (default 2): how long idle kernel threads, ours and OpenMP's (oneDNN), spin-wait for the next
  op before sleeping (threads.py says why so short); `0` sleeps at once (OMP_WAIT_POLICY=PASSIVE). Set
  OMP_WAIT_POLICY or GOMP_SPINCOUNT yourself and OpenMP keeps yours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_SPIN_US = 2


@dataclass(frozen=True)
class CpuOptions:
    onednn: bool = True
    layout: str = "blocked"  # "blocked": the blocked layout where it pays; "nchw": plain throughout
    winograd: bool = True
    blas: str = "auto"  # "auto": MKL's sgemm when the wheel is installed; "numpy": numpy's matmul
    threads: int | None = None  # None: the CPUs the process may use
    spin_us: int = DEFAULT_SPIN_US  # idle threads spin this long, then sleep

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> CpuOptions:
        threads = environ.get("NNSERVE_NUM_THREADS", "").strip()
        spin = environ.get("NNSERVE_SPIN_US", "").strip()
        return cls(
            onednn=environ.get("NNSERVE_ONEDNN", "").strip() != "0",
            layout="nchw" if environ.get("NNSERVE_LAYOUT", "").strip().lower() == "nchw" else "blocked",
            winograd=environ.get("NNSERVE_WINOGRAD", "").strip() != "0",
            blas="numpy" if environ.get("NNSERVE_BLAS", "").lower() in ("numpy", "openblas") else "auto",
            threads=int(threads) if threads.isdigit() and int(threads) > 0 else None,
            spin_us=int(spin) if spin.isdigit() else DEFAULT_SPIN_US,
        )
