"""The CPU device's settings, read from the environment in one place (`CpuOptions.from_env`) and passed down.

Every variable is read as written (case and surrounding blanks aside); empty means the default, and any other value
outside the accepted ones is an error naming the variable and them (`from_env`), never a silent default.

- NNSERVE_ONEDNN (default on): `0` never loads oneDNN; convolutions, pooling and reorders run the numpy/numba
  kernels (and the blocked layout is off). Unset, a missing oneDNN is a warning and the slower kernels run; `1`
  asks for it, and a missing oneDNN is then an error when the device is made.
- NNSERVE_LAYOUT (default `blocked`: blocked where it pays): `nchw` keeps activations NCHW between convolutions.
- NNSERVE_WINOGRAD (default on, `1`): `0` keeps blocked 3x3 convolutions on oneDNN's direct kernel.
- NNSERVE_NATIVE_CALLS (default on, `1`): after a binding's first run, consecutive oneDNN calls run as one native
  program without Python between them (fused_calls.py); `0` runs every kernel's Python (for comparison).
- NNSERVE_BLAS (default `auto`: MKL's sgemm when the `mkl` wheel is installed, else numpy's matmul): `mkl` asks
  for MKL (an error when the device is made without it: the `fast` extra); `numpy` or `openblas` runs GEMMs on
  numpy's matmul.
- NNSERVE_NUM_THREADS (default, or `0`: the CPUs the affinity mask and cgroup quota allow, at most 8, past which
  a 16-core machine measured slower: threads.DEFAULT_MAX_THREADS): the kernel thread pool's size, a whole number.
- NNSERVE_WAIT_POLICY (default `run`): how idle kernel threads wait for the next op. `run` spins through a
  request and sleeps when idle: our kernels run on OpenMP's team (the one oneDNN runs on: one pool, not two), whose
  threads spin NNSERVE_RUN_SPIN_US after each op, long enough to bridge the Python dispatch between two ops, so that
  an op rarely wakes a sleeping thread (ONNX Runtime's pool spins likewise); without oneDNN, our pool's workers spin
  while a run is in progress and NNSERVE_RUN_SPIN_US after it. `short`: two pools (ours and OpenMP's) that each
  spin NNSERVE_SPIN_US after every op and then sleep, so every op after a gap wakes its threads; it gives way
  sooner to other work on a shared or overloaded host (threads.py has the measurements of both). Work is split
  over the threads from the same sizes under both (threads.MIN_WORK, FORK_WORK): smaller splits measured slower on
  a loaded 2-core host.
- NNSERVE_RUN_SPIN_US (default 100): the `run` policy's spin after an op (and after a run), then sleep.
- NNSERVE_SPIN_US (default 2): the `short` policy's spin, ours and OpenMP's (oneDNN), before sleeping; `0` sleeps
  at once (OMP_WAIT_POLICY=PASSIVE). Set OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME yourself and OpenMP keeps
  yours.
- NNSERVE_OPENMP (default `auto`): the OpenMP runtime oneDNN's threads (and ours under `run`) run on
  (onednn/binding.py). `auto`: Intel's (the intel-openmp wheel, a dependency on x86-64 Linux) when installed, else
  GNU's (libgomp, which libdnnl links); `intel`: Intel's or an error; `gnu`: libgomp. Under `run`, Intel's threads
  spin through a request, up to RUN_SPIN_CAP_US (20 ms) after each op, then sleep (KMP_BLOCKTIME), while the host
  is calm (busy_host.py: on a busy one they sleep after each op); libgomp's spin is a count fixed when it loads, so
  it keeps NNSERVE_RUN_SPIN_US. Under `short` both spin NNSERVE_SPIN_US.

OpenMP's own binding variables are read too, only to know whether the user binds OpenMP's threads to CPUs
(`openmp_bound`): then the busy-host guard never moves a thread (colocation.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_SPIN_US = 2
DEFAULT_RUN_SPIN_US = 100
WAIT_POLICIES = ("short", "run")
OPENMP_RUNTIMES = ("auto", "intel", "gnu")
# The `run` policy's bound on one wait of a spinning worker (threads.RUN_SPIN_CAP_US): a run's long serial stretch,
# or a run that never ends, must not keep a core busy. Intel's OpenMP gets it as its blocktime.
RUN_SPIN_CAP_US = 20_000
LAYOUTS = ("blocked", "nchw")
SWITCH = ("0", "1")
BLAS_CHOICES = {"auto": "auto", "mkl": "mkl", "numpy": "numpy", "openblas": "numpy"}  # value -> CpuOptions.blas
# Upper bounds of the number settings: a pool of more threads, or a spin of more than a second between ops, is a
# typo, not a setting (a huge spin would also make GOMP_SPINCOUNT a value libgomp ignores for its own default).
MAX_THREADS = 1024
MAX_SPIN_US = 1_000_000


@dataclass(frozen=True)
class WaitPolicy:
    """How the engine's idle kernel threads wait (NNSERVE_WAIT_POLICY, NNSERVE_SPIN_US, NNSERVE_RUN_SPIN_US)."""
    mode: str = "run"  # "run": spin through a run, run_spin_us after each op; "short": spin spin_us after each op
    spin_us: int = DEFAULT_SPIN_US
    run_spin_us: int = DEFAULT_RUN_SPIN_US

    @property
    def openmp_spin_us(self) -> int:
        """What OpenMP's idle threads spin (GOMP_SPINCOUNT) before sleeping."""
        return self.run_spin_us if self.mode == "run" else self.spin_us

    @property
    def intel_blocktime_us(self) -> int:
        """What Intel's OpenMP threads spin after an op before sleeping (KMP_BLOCKTIME): under `run` the spin cap,
        which carries them through a request's serial stretches (Python between ops, ops too small to split), so a
        split op never waits for a sleeping thread (0 when NNSERVE_RUN_SPIN_US is 0); under `short` its spin."""
        if self.mode == "run":
            return RUN_SPIN_CAP_US if self.run_spin_us > 0 else 0
        return self.spin_us

    @property
    def one_pool(self) -> bool:
        """Whether our kernels run on OpenMP's team (once oneDNN loaded OpenMP) instead of a pool of our own."""
        return self.mode == "run"


@dataclass(frozen=True)
class CpuOptions:
    onednn: bool = True
    onednn_required: bool = False  # NNSERVE_ONEDNN=1 said so: a missing oneDNN is an error, not a warning
    layout: str = "blocked"  # "blocked": the blocked layout where it pays; "nchw": plain throughout
    winograd: bool = True
    native_calls: bool = True  # runs of oneDNN calls replayed as one native program (fused_calls.py)
    blas: str = "auto"  # "auto": MKL's sgemm when the wheel is installed; "mkl": MKL or an error; "numpy"
    threads: int | None = None  # None: the CPUs the process may use, at most 8 (threads.default_threads)
    spin_us: int = DEFAULT_SPIN_US  # idle threads spin this long, then sleep
    wait: str = "run"  # WAIT_POLICIES
    run_spin_us: int = DEFAULT_RUN_SPIN_US
    openmp: str = "auto"  # OPENMP_RUNTIMES
    # the user binds OpenMP's threads (openmp_bound): none is ever pinned by us. OpenMP reads the process's own
    # environment whatever options the device was given, so options made in code default to it too.
    openmp_bound: bool = field(default_factory=lambda: environment_binds_openmp(os.environ))

    @property
    def wait_policy(self) -> WaitPolicy:
        return WaitPolicy(self.wait, self.spin_us, self.run_spin_us)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> CpuOptions:
        """The settings `environ` holds; an empty or unset variable means its default. A value outside a variable's
        accepted ones raises ValueError naming the variable and them: a misspelt setting must stop the server at
        start, not run it silently on the default."""
        def get(name: str) -> str:
            return environ.get(name, "").strip().lower()

        return cls(
            onednn=_switch("NNSERVE_ONEDNN", get("NNSERVE_ONEDNN")),
            onednn_required=get("NNSERVE_ONEDNN") == "1",
            layout=_choice("NNSERVE_LAYOUT", get("NNSERVE_LAYOUT") or "blocked", LAYOUTS),
            winograd=_switch("NNSERVE_WINOGRAD", get("NNSERVE_WINOGRAD")),
            native_calls=_switch("NNSERVE_NATIVE_CALLS", get("NNSERVE_NATIVE_CALLS")),
            blas=BLAS_CHOICES[_choice("NNSERVE_BLAS", get("NNSERVE_BLAS") or "auto", tuple(BLAS_CHOICES))],
            threads=_count("NNSERVE_NUM_THREADS", get("NNSERVE_NUM_THREADS"), 0, MAX_THREADS,
                           "a whole number of threads (0: the CPUs the process may use, at most 8)") or None,
            spin_us=_count("NNSERVE_SPIN_US", get("NNSERVE_SPIN_US"), DEFAULT_SPIN_US, MAX_SPIN_US),
            wait=_choice("NNSERVE_WAIT_POLICY", get("NNSERVE_WAIT_POLICY") or "run", WAIT_POLICIES),
            run_spin_us=_count("NNSERVE_RUN_SPIN_US", get("NNSERVE_RUN_SPIN_US"), DEFAULT_RUN_SPIN_US, MAX_SPIN_US),
            openmp=_choice("NNSERVE_OPENMP", get("NNSERVE_OPENMP") or "auto", OPENMP_RUNTIMES),
            openmp_bound=environment_binds_openmp(environ),
        )


# OpenMP's variables that bind its threads to CPUs (libgomp's and Intel's runtime's).
OPENMP_BINDING = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def openmp_bound(values: Mapping[str, str]) -> bool:
    """Whether OpenMP's binding variables (`values`: lower case, blank when unset) bind its threads: KMP_AFFINITY
    naming a binding type (its modifiers and `none`, the default type, do not bind; Intel's runtime lets it
    override OMP_PROC_BIND); else OMP_PROC_BIND other than `false`; else OMP_PLACES or GOMP_CPU_AFFINITY (with which
    libgomp binds when OMP_PROC_BIND is unset)."""
    kmp = [word.strip() for word in values.get("KMP_AFFINITY", "").split(",")]
    if "disabled" not in kmp and any(word in KMP_BINDING_TYPES or word.startswith("proclist") for word in kmp):
        return True
    bind = values.get("OMP_PROC_BIND", "")
    if bind:
        return bind != "false"
    return bool(values.get("OMP_PLACES") or values.get("GOMP_CPU_AFFINITY"))


def environment_binds_openmp(environ: Mapping[str, str]) -> bool:
    """openmp_bound over `environ`'s variables, read as from_env reads every variable."""
    return openmp_bound({name: environ.get(name, "").strip().lower() for name in OPENMP_BINDING})


KMP_BINDING_TYPES = {"compact", "scatter", "explicit", "balanced", "logical", "physical"}


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
    return value


def _switch(name: str, value: str) -> bool:
    """An on/off setting whose default is on: `0` turns it off, `1` (or unset) keeps it on."""
    return _choice(name, value or "1", SWITCH) == "1"


def _count(name: str, value: str, default: int, most: int, what: str = "a whole number of microseconds") -> int:
    """ASCII digits only (str.isdigit also takes '²' and '٣'), at most `most`."""
    if not value:
        return default
    if not (value.isascii() and value.isdigit()) or len(value) > len(str(most)) or int(value) > most:
        raise ValueError(f"{name}={value!r}: expected {what}, at most {most}")
    return int(value)
