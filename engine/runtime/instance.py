"""Instance: a model compiled for one device at max input shapes, with its one arena and workspace.

An instance is used by one thread at a time (concurrent `run` calls raise EngineError); create one instance
per worker thread. Kernels release the GIL where they can, so instances on several threads do run in parallel.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.devices import get_device
from engine.devices.cpu import threads as _threads
from engine.devices.cpu.options import WaitPolicy
from engine.errors import ArenaOverflowError, EngineError, KernelError
from engine.ir import Graph, Value
from engine.memory.planner import MemoryPlan
from engine.ops.registry import TensorInfo
from engine.passes.infer_shapes import infer_infos
from engine.runtime.bind import Bound, bind
from engine.runtime.compile import compile_graph
from engine.runtime.inputs import check_inputs, host_input, resolve_max_shapes
from engine.runtime.options import EngineOptions, environment_options
from engine.runtime.profile import Profile, kernel_label

log = logging.getLogger("engine.runtime")

BOUND_CACHE_SIZE = 16
# A binding's calls are merged (Device.fuse_calls: ~2-3 ms for EfficientNet-B0, a third of its run) once it has run
# this many times: a binding used once (a client cycling through more input shapes than BOUND_CACHE_SIZE keeps)
# never pays for a merge it would not use.
FUSE_AFTER_RUNS = 2


@dataclass(frozen=True)
class RunTimings:
    """Where one run's time went, in Triton's phases (nanoseconds): the inputs checked and bound (copied into the
    arena on a device that cannot read them where they are), the kernels, the outputs copied out."""

    copy_in_ns: int
    compute_ns: int
    copy_out_ns: int


class Instance:
    def __init__(self, graph: Graph, device: str = "cpu", max_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 threads: int | None = None, options: EngineOptions | None = None):
        self.options = options if options is not None else environment_options()
        # ENGINE_DEBUG: 1 traces every node before its call, 2 also logs output stats after it (may be changed live)
        self.debug = self.options.debug
        self.graph = graph
        # Kernel/BLAS threads are process-wide. Every instance runs on the count its primitives are made for (a oneDNN
        # primitive must not run on more threads than it was created for: its scratchpad and split are per thread):
        # its own, or the process's count when it was built; applied before a run where another instance changed it.
        requested = None if threads is None else max(1, int(threads))
        _apply_threads(requested, self.options.cpu.threads, self.options.cpu.wait_policy)
        self.threads = _threads.get_threads() if requested is None else requested
        self.device = get_device(device, self.options.cpu)
        graph = self.graph = self.device.prepare(graph)
        self.max_shapes = resolve_max_shapes(graph, max_shapes)
        infos = infer_infos(graph, self._input_infos(self.max_shapes), ops=self.device.ops)
        self._compiled = compile_graph(graph, infos, self.device)
        self.memory_plan: MemoryPlan = self._compiled.plan
        try:
            self._arena = self.device.allocate(self.memory_plan.arena_bytes)
            self.workspace = self.device.allocate(self.memory_plan.workspace_bytes).buffer
        except ArenaOverflowError as e:
            raise ArenaOverflowError(f"{graph.path or 'model'}: max shapes {self.max_shapes}: {e}; give the instance "
                                     "smaller max shapes") from None
        self.arena: np.ndarray = self._arena.buffer  # the one activation buffer; never replaced
        self._bound: OrderedDict[tuple, Bound] = OrderedDict()
        self._lock = threading.Lock()
        self.last_timings: dict[str, object] = {}
        self.profile: Profile | None = None  # per-node times of every run while profiling is on

    # -- profiling ------------------------------------------------------------------------------------
    def start_profile(self) -> Profile:
        """From now on every run adds its per-node times to a fresh `profile` (until stop_profile)."""
        self.profile = Profile.for_nodes((c.node.name, c.node.op_type, kernel_label(c.kernel))
                                         for c in self._compiled.nodes if not c.alias)
        return self.profile

    def stop_profile(self) -> Profile | None:
        """Ends profiling; returns what was collected."""
        profile, self.profile = self.profile, None
        return profile

    # -- public ---------------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, np.ndarray], timings: bool = False) -> dict[str, np.ndarray]:
        """Runs the model; the returned arrays are copies owned by the caller.

        `last_timings` afterwards holds copy_in_s / compute_s / copy_out_s / total_s, plus per-node
        (name, op, seconds) under "nodes" when `timings` is true.
        """
        return self.run_timed(inputs, timings)[0]

    def run_timed(self, inputs: Mapping[str, np.ndarray],
                  timings: bool = False) -> tuple[dict[str, np.ndarray], RunTimings]:
        """run(), also returning where the time went (what a server reports as Triton's phases)."""
        if not self._lock.acquire(blocking=False):
            raise EngineError("this instance is already running on another thread; use one instance per thread")
        try:
            if _threads.get_threads() != self.threads:
                _threads.set_threads(self.threads)
            with self.device.activate():
                return self._run(inputs, timings)
        finally:
            self._lock.release()

    @property
    def device_name(self) -> str:
        return self.device.name

    @property
    def memory_bytes(self) -> int:
        """Activation memory preallocated on the instance's device: the arena plus the kernels' workspace."""
        return self.memory_plan.arena_bytes + self.memory_plan.workspace_bytes

    @property
    def device_memory_bytes(self) -> int | None:
        """What the instance holds on a device with its own memory (arena, workspace, uploaded weights); None on
        the host."""
        return self.device.memory_used_bytes

    def device_memory(self) -> tuple[int, int] | None:
        """(used, total) bytes of the instance's whole device, from its driver; None where there are no such
        figures (the CPU, the CUDA simulator)."""
        return self.device.device_memory()

    @property
    def fallback_nodes(self) -> list[str]:
        """Nodes that run the numpy reference (allocating) because their op has no kernel."""
        return [c.node.name for c in self._compiled.nodes
                if c.kernel is not None and getattr(c.kernel, "is_fallback", False)]

    # -- internals ------------------------------------------------------------------------------------
    def _run(self, inputs, timings: bool) -> tuple[dict[str, np.ndarray], RunTimings]:
        t0 = time.perf_counter()
        arrays = check_inputs(self.graph, self.max_shapes, inputs)
        signature = tuple(a.shape for a in arrays)
        bound = self._bind(signature)
        hosted = [] if bound.input_views else [host_input(a) for a in arrays]
        if bound.input_views:  # a device that cannot read the caller's memory: the inputs are in its arena
            for view, a in zip(bound.input_views, arrays, strict=True):
                self.device.copy_in(view, a)
        else:
            bound.attach(hosted)
        attached = [bound]
        try:
            bound.attach_outputs()
            t1 = time.perf_counter()
            profile = self.profile
            trace = timings or profile is not None
            if bound.stops:
                node_times, bound = self._execute_extents(bound, signature, hosted, attached, trace)
            else:
                node_times = execute(bound, self.workspace, trace, self.debug)[0]
                if bound.fused is None and not trace and not self.debug:
                    bound.runs += 1
                    if bound.runs >= FUSE_AFTER_RUNS:
                        bound.fused = self._fuse(bound)
            if profile is not None:
                profile.add_run(node_times)
            t2 = time.perf_counter()
            out = {name: a if bound.owned(j) else self.device.copy_out(a)
                   for j, (name, a) in enumerate(bound.outputs)}
            t3 = time.perf_counter()
        finally:
            for b in attached:
                b.detach()
        self.last_timings = {"copy_in_s": t1 - t0, "compute_s": t2 - t1, "copy_out_s": t3 - t2, "total_s": t3 - t0}
        if timings:
            self.last_timings["nodes"] = node_times
        return out, RunTimings(int((t1 - t0) * 1e9), int((t2 - t1) * 1e9), int((t3 - t2) * 1e9))

    def _fuse(self, bound: Bound) -> list | bool:
        """The device's merged call list for this binding (Device.fuse_calls), False for none: a fusion that fails
        is logged and the binding keeps its kernels' own calls (this run's outputs are already computed)."""
        try:
            return self.device.fuse_calls(bound.calls, bound.call_nodes, bound.varying(), self.workspace) or False
        except Exception:
            log.exception("%s: merging the kernels' calls failed; they run as they are", self.graph.path or "model")
            return False

    def _execute_extents(self, bound: Bound, signature: tuple, hosted: list, attached: list[Bound],
                         trace: bool) -> tuple[list, Bound]:
        """Runs the call list up to each op whose output size depends on the data, then goes on with the binding
        for the actual shapes its kernel returned (extents.py); returns the node times and the last binding."""
        node_times, extents, start = [], {}, 0
        for stop in bound.stops:
            times, shapes = execute(bound, self.workspace, trace, self.debug, start, stop + 1)
            node_times += times
            node = bound.call_nodes[stop]
            if shapes is None or len(shapes) != len(node.outputs):
                raise KernelError(f"{node.where()}: the kernel of {node.op_type} node {node.name!r} returned "
                                  f"{shapes!r}, not the actual shapes of its {len(node.outputs)} output(s)")
            extents.update(zip(node.outputs, (tuple(int(d) for d in s) for s in shapes), strict=True))
            bound = self._bind(signature, extents)
            if all(b is not bound for b in attached):
                if hosted:
                    bound.attach(hosted)
                attached.append(bound)
            start = stop + 1
        node_times += execute(bound, self.workspace, trace, self.debug, start)[0]
        return node_times, bound

    def _bind(self, signature: tuple, extents: Mapping[Value, tuple[int, ...]] | None = None) -> Bound:
        key = (signature, tuple((v.name, s) for v, s in extents.items())) if extents else signature
        bound = self._bound.get(key)
        if bound is not None:
            self._bound.move_to_end(key)
            return bound
        shapes = dict(zip(self.graph.inputs, signature, strict=True))
        infos = infer_infos(self.graph, {v: TensorInfo(s, v.dtype) for v, s in shapes.items()}, ops=self.device.ops,
                            extents=extents)
        host_outputs = self.device.host_outputs and not self._compiled.bounded  # one binding's arrays per run
        bound = bind(self.graph, self._compiled, self._arena, infos, host_outputs)
        self._bound[key] = bound
        if len(self._bound) > BOUND_CACHE_SIZE:
            self._bound.popitem(last=False)
        return bound

    def _input_infos(self, shapes: dict[str, tuple[int, ...]]) -> dict[Value, TensorInfo]:
        return {v: TensorInfo(shapes[v.name], v.dtype) for v in self.graph.inputs}


def execute(bound: Bound, workspace: np.ndarray, timings: bool = False, debug: int = 0, start: int = 0,
            stop: int | None = None) -> tuple[list, object]:
    """The hot loop: prebuilt (fn, inputs, outputs) calls (those from `start` to `stop`), nothing else unless
    tracing or timing. Returns the node times (when timing) and what the last call returned (the actual shapes,
    from a kernel whose output size depends on the data).

    debug 1 logs node#, op, shapes and output offsets before each call; 2 adds output stats after it.
    """
    if timings or debug:
        calls = bound.calls if start == 0 and stop is None else bound.calls[start:stop]
        return _execute_traced(bound, workspace, timings, debug, start, calls)
    if bound.fused and start == 0 and stop is None:  # runs of calls merged by the device (Device.fuse_calls)
        calls, first = bound.fused
        k = 0
        try:
            for fn, ins, outs in calls:
                fn(ins, outs, workspace)
                k += 1
        except Exception as e:
            raise _kernel_error(bound, first[k], e) from e
        return [], None
    calls = bound.calls if start == 0 and stop is None else bound.calls[start:stop]
    i, result = start, None
    try:
        for fn, ins, outs in calls:
            result = fn(ins, outs, workspace)
            i += 1
    except Exception as e:
        raise _kernel_error(bound, i, e) from e
    return [], result


def _execute_traced(bound: Bound, workspace, timings: bool, debug: int, start: int,
                    calls: list) -> tuple[list, object]:
    node_times, result = [], None
    for i, (fn, ins, outs) in enumerate(calls, start):
        node = bound.call_nodes[i]
        if debug:
            log.debug("#%d %s %s in=%s out=%s offset=%s", i, node.op_type, node.name,
                      [np.shape(a) for a in ins], [o.shape for o in outs], bound.offsets[i])
        t = time.perf_counter()
        try:
            result = fn(ins, outs, workspace)
        except Exception as e:
            raise _kernel_error(bound, i, e) from e
        if timings:
            node_times.append((node.name, node.op_type, time.perf_counter() - t))
        if debug >= 2:
            log.debug("#%d %s", i, "; ".join(_stats(o) for o in outs))
    return node_times, result


def _stats(a: np.ndarray) -> str:
    if not isinstance(a, np.ndarray) and hasattr(a, "copy_to_host"):  # a CUDA device array
        a = a.copy_to_host()
    if a.size == 0 or a.dtype.kind not in "fiub":
        return f"{a.dtype}{list(a.shape)}"
    return f"min={a.min():.4g} max={a.max():.4g} mean={a.mean(dtype=np.float64):.4g}"


def _kernel_error(bound: Bound, i: int, e: Exception) -> Exception:
    if isinstance(e, EngineError):
        return e
    node = bound.call_nodes[i]
    return KernelError(f"{node.where()}: kernel of {node.op_type} node {node.name!r} failed: "
                       f"{type(e).__name__}: {e}")


def release_thread() -> bool:
    """Let the calling thread's kernel threads go (the CPU's OpenMP team): call it on a thread that ran instances
    and will not run any for a while (a loader after its warm-up, a worker gone idle), so that the threads that do
    run keep their spin between ops (engine/devices/cpu/threads.py, release_thread). The next run on this thread
    makes a new team (0.4-1 ms). False only when it must be tried again later (inside a parallel region;
    threads.release_thread)."""
    return _threads.release_thread()


def _apply_threads(threads: int | None, setting: int | None, policy: WaitPolicy) -> None:
    """The pool gets its process default once (`setting`: NNSERVE_NUM_THREADS, else the CPUs the cgroup allows,
    at most 8; its wait policy, NNSERVE_WAIT_POLICY / NNSERVE_SPIN_US / NNSERVE_RUN_SPIN_US), BLAS one thread;
    threads= then wins."""
    _threads.configure(setting, policy)
    if threads is not None:
        _threads.set_threads(threads)
