"""One loaded model version: engine model, config, instances with preallocated arenas, scheduler, statistics."""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from server import config as cfg
from server.backend import BackendInstance, BackendModel, ClosableInstance, RequestContext, quantized_inputs
from server.classification import read_labels
from server.config_fields import ENSEMBLE_PLATFORM, PYTHON_BACKEND
from server.ensemble.graph import Step
from server.ensemble.scheduler import EnsembleScheduler
from server.errors import ModelLoadError
from server.metrics import ServerMetrics
from server.model_calls import ModelCalls
from server.model_config import model_config_pb2 as mc
from server.repository_files import read_regular
from server.scheduling import Execution, InferResult, Scheduler, SchedulerConfig
from server.scheduling.sequence import SequenceScheduler
from server.security import inside
from server.sequence_batching import check_model_tensors, engine_input_shapes, sequence_config
from server.stats import ModelStats

log = logging.getLogger("nnserve.repository")
READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"


class VersionScheduler(Protocol):
    """What runs a version's requests: the Scheduler of its instances, or an ensemble's (server/ensemble/)."""

    async def start(self) -> None: ...

    async def stop(self, drain: bool = True) -> None: ...

    async def submit(self, inputs: dict[str, np.ndarray], *, priority: int = 0, timeout_us: int | None = None,
                     context: RequestContext | None = None) -> InferResult: ...


# Each loaded copy of a version has its own number (a reload of the same version, maybe from other files, is
# another copy): the response cache keys answers by the copies that gave them.
_LOAD_IDS = itertools.count(1)


@dataclass
class ModelVersion:
    name: str
    version: str
    config: mc.ModelConfig
    instances: list[BackendInstance]
    scheduler: VersionScheduler
    stats: ModelStats
    arena_bytes: list[int]
    load_seconds: float
    state: str = READY
    inputs: list[cfg.TensorConfig] = field(default_factory=list)
    outputs: list[cfg.TensorConfig] = field(default_factory=list)
    max_shapes: dict[str, list[int]] = field(default_factory=dict)
    labels: dict[str, list[str]] = field(default_factory=dict)  # output -> its label_filename's lines
    quantized_inputs: frozenset[str] = frozenset()  # inputs an int8 quantization is reached from: NaN refused
    load_id: int = field(default_factory=lambda: next(_LOAD_IDS))

    # Looked up on every request: computed once (a loaded version's config does not change; a reload makes a new
    # ModelVersion), not read from the protobuf each time.
    @functools.cached_property
    def max_batch_size(self) -> int:
        return int(self.config.max_batch_size)

    @functools.cached_property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @functools.cached_property
    def decoupled(self) -> bool:
        """0..n responses per request (Triton's decoupled transaction policy): streams only."""
        return bool(self.config.model_transaction_policy.decoupled)

    @functools.cached_property
    def sequence(self) -> bool:
        """A stateful model: its requests belong to sequences (Triton's sequence batcher)."""
        return self.config.HasField("sequence_batching")

    @functools.cached_property
    def takes_requests(self) -> bool:
        """Its scheduler takes each request with its RequestContext (id, parameters, requested outputs)."""
        return self.config.backend == PYTHON_BACKEND or self.config.platform == ENSEMBLE_PLATFORM

    @property
    def steps(self) -> list[Step]:
        """An ensemble's steps (none for any other model)."""
        return self.scheduler.steps if isinstance(self.scheduler, EnsembleScheduler) else []

    @functools.cached_property
    def input_configs(self) -> dict[str, cfg.TensorConfig]:
        return {t.name: t for t in self.inputs}

    @functools.cached_property
    def output_configs(self) -> dict[str, cfg.TensorConfig]:
        return {t.name: t for t in self.outputs}


def build_instances(model: BackendModel, config: mc.ModelConfig, name: str,
                    extra_shapes: dict[str, tuple[int, ...]] | None = None
                    ) -> tuple[list[BackendInstance], dict[str, list[int]]]:
    """Instance per instance_group count (per listed GPU for KIND_GPU), each planning its arena for
    max_batch_size x max dims up front; `extra_shapes`: inputs the client does not send (a sequence model's)."""
    shapes = cfg.max_shapes(config, name)  # the API's shapes; the engine's differ where an input has a reshape
    engine_shapes = {**cfg.engine_max_shapes(config, name), **(extra_shapes or {})}
    instances: list[BackendInstance] = []
    for device in cfg.instance_devices(config):
        try:
            instances.append(model.instance(device, max_shapes=engine_shapes))
        except Exception as exc:  # engine errors name the device ("no CUDA device 1 ...") or the refused node
            close_instances(instances)
            if isinstance(exc, ModelLoadError):  # says what failed already (a Python model's initialize)
                raise
            raise ModelLoadError(f"model '{name}': creating an instance on {device} for max shapes {shapes} "
                                 f"failed: {exc}") from exc
    return instances, shapes


def close_instances(instances: list[BackendInstance]) -> None:
    """Release what instances hold beyond memory (a Python model's worker processes); blocking."""
    for instance in instances:
        if isinstance(instance, ClosableInstance):
            try:
                instance.close()
            except Exception:  # one instance's trouble must not keep the others' processes alive
                log.exception("closing an instance failed")


def warm_up(instances: list[BackendInstance], config: mc.ModelConfig, name: str, version_dir: Path,
            cancel: threading.Event | None = None) -> None:
    """Run every model_warmup sample on every instance; the model is not READY until this succeeds. Whatever goes
    wrong (a missing file, a shape the model refuses, a kernel that raises) is this model's load error; `cancel`
    (set by an unload or the shutdown) stops it between runs, as a load error too."""
    rng = np.random.default_rng(0)
    for warmup in config.model_warmup:
        try:
            feed = _warmup_feed(warmup, config, name, version_dir, rng)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"model '{name}': model_warmup '{warmup.name}': {type(exc).__name__}: {exc}") from None
        for instance in instances:
            for _ in range(max(int(warmup.count), 1)):
                if cancel is not None and cancel.is_set():
                    raise ModelLoadError(f"model '{name}': load cancelled during model_warmup '{warmup.name}' (the "
                                         "model is being unloaded or the server is stopping)")
                try:
                    instance.run_timed(feed)
                except Exception as exc:
                    raise ModelLoadError(f"model '{name}': model_warmup '{warmup.name}' failed: {exc}") from None


def _warmup_feed(warmup: mc.ModelWarmup, config: mc.ModelConfig, name: str, version_dir: Path,
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One warm-up sample's inputs, in the model's shapes; none bigger than the max shape the arena holds."""
    tensors = {t.name: t for t in cfg.tensor_configs(config)[0]}
    limits = cfg.max_shapes(config, name)
    batch = max(int(warmup.batch_size), 1)
    feed = {}
    for input_name, spec in warmup.inputs.items():
        shape = ([batch] if config.max_batch_size > 0 else []) + list(spec.dims)
        limit = limits.get(input_name)
        if limit is not None and not cfg.within_max(shape, limit):
            raise ModelLoadError(f"model '{name}': model_warmup '{warmup.name}' input '{input_name}' has shape "
                                 f"{shape}, beyond the max shape {limit} the model is loaded for")
        dtype = cfg.numpy_dtype(spec.data_type)
        kind = spec.WhichOneof("input_data_type")
        if kind == "input_data_file":
            path = _warmup_file(version_dir.parent / "warmup", spec.input_data_file, name)
            feed[input_name] = _read_warmup_file(path, shape, dtype, name)
        elif kind == "random_data":
            feed[input_name] = rng.random(shape).astype(dtype)
        else:
            feed[input_name] = np.zeros(shape, dtype=dtype)
        if input_name in tensors:  # warm-up dims are the API's, as a request's
            feed[input_name] = tensors[input_name].to_model(feed[input_name], config.max_batch_size > 0)
    return feed


def _read_warmup_file(path: Path, shape: list[int], dtype: np.dtype, name: str) -> np.ndarray:
    """The raw tensor in a warm-up file, which must hold exactly the sample's bytes."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    label = f"model '{name}': warmup/{path.name}"
    raw = read_regular(path, nbytes, label)
    if len(raw) != nbytes:
        raise ModelLoadError(f"{label} holds {len(raw)} bytes, expected {nbytes} for shape {shape} {dtype.name}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _warmup_file(warmup_dir: Path, file_name: str, name: str) -> Path:
    """model_warmup input files live in <model>/warmup/; a config (maybe sent through the load API) must not point
    anywhere else."""
    path = warmup_dir / file_name
    if not inside(warmup_dir, path):
        raise ModelLoadError(f"model '{name}': model_warmup input_data_file '{file_name}' is outside "
                             f"{warmup_dir.name}/")
    return path


class VersionMetrics:
    """The scheduler's metrics hooks for one model version: executions feed /stats batch_stats and Prometheus."""

    def __init__(self, stats: ModelStats, metrics: ServerMetrics | None, name: str, version: str):
        self.stats, self.metrics, self.name, self.version = stats, metrics, name, version

    def on_queue_depth(self, depth: int) -> None:
        if self.metrics is not None:
            self.metrics.pending.labels(self.name, self.version).set(depth)

    def on_execution(self, execution: Execution) -> None:
        self.stats.record_execution(execution.batch_size, execution.compute_input_ns, execution.compute_infer_ns,
                                    execution.compute_output_ns)
        if self.metrics is not None:
            self.metrics.execution(self.name, self.version, execution.batch_size)

    def on_request_done(self, outcome: str, queue_ns: int) -> None:
        """Per-request success/failure is recorded by the data plane, which also sees validation failures."""


def scheduler_config(config: mc.ModelConfig) -> SchedulerConfig:
    """The scheduling policy a config asks for: Triton's dynamic batcher with a dynamic_batching block, else direct
    execution (Triton's default scheduler)."""
    inline = config.backend != PYTHON_BACKEND  # its runs wait on a worker process (and its BLS calls on the loop)
    if not config.HasField("dynamic_batching"):
        return SchedulerConfig(dynamic_batching=False, max_batch_size=config.max_batch_size, may_run_inline=inline)
    db = config.dynamic_batching
    policy = db.default_queue_policy
    return SchedulerConfig(
        max_batch_size=config.max_batch_size,
        preferred_batch_sizes=tuple(db.preferred_batch_size),
        max_queue_delay_us=int(db.max_queue_delay_microseconds),
        max_queue_size=int(policy.max_queue_size),
        default_timeout_us=int(policy.default_timeout_microseconds),
        timeout_action=mc.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action),
        allow_timeout_override=policy.allow_timeout_override,
        priority_levels=int(db.priority_levels),
        default_priority_level=int(db.default_priority_level),
        preserve_ordering=db.preserve_ordering,
        wait_policy=cfg.batch_wait(config, config.name),
        may_run_inline=inline,
    )


def load_version(model: BackendModel, config: mc.ModelConfig, name: str, version: str, version_dir: Path,
                 metrics: ServerMetrics | None, cancel: threading.Event | None = None) -> ModelVersion:
    """Blocking: instances + warmup (which `cancel` stops). The scheduler is created here and started by the
    repository."""
    t0 = time.perf_counter()
    seq_config, extra_shapes = None, None
    if config.HasField("sequence_batching"):
        seq_config = sequence_config(config, name, version_dir.parent)
        if config.backend != PYTHON_BACKEND:  # a Python model declares no more than its config
            check_model_tensors(seq_config, model, name)
            extra_shapes = engine_input_shapes(seq_config, config, name)
    instances, shapes = build_instances(model, config, name, extra_shapes)
    try:
        warm_up(instances, config, name, version_dir, cancel)
    except Exception:
        close_instances(instances)
        raise
    stats = ModelStats(name, version)
    arenas = [i.memory_bytes for i in instances]
    stats.memory_bytes = sum(arenas)
    if metrics is not None:  # before the repository's model_loaded, which sets the per-instance gauges
        metrics.instances_placed(name, version, instances)
    hooks = VersionMetrics(stats, metrics, name, version)
    scheduler: VersionScheduler
    if seq_config is not None:
        scheduler = SequenceScheduler(seq_config, instances, metrics=hooks)
    else:
        scheduler = Scheduler(scheduler_config(config), instances, metrics=hooks)
    ins, outs = cfg.tensor_configs(config)
    labels = output_labels(config, version_dir.parent, name)
    return ModelVersion(name, version, config, instances, scheduler, stats, arenas, time.perf_counter() - t0,
                        inputs=ins, outputs=outs, max_shapes=shapes, labels=labels,
                        quantized_inputs=frozenset(quantized_inputs(model)))



def output_labels(config: mc.ModelConfig, model_dir: Path, name: str) -> dict[str, list[str]]:
    """The label file of each output that names one (the classification extension's labels)."""
    return {o.name: read_labels(model_dir, o.label_filename, o.name, name) for o in config.output if o.label_filename}


def load_ensemble_version(config: mc.ModelConfig, name: str, version: str, steps: list[Step], calls: ModelCalls,
                          metrics: ServerMetrics | None, model_dir: Path) -> ModelVersion:
    """An ensemble's version: no instances, its steps run by an EnsembleScheduler (started by the repository)."""
    stats = ModelStats(name, version)
    ins, outs = cfg.tensor_configs(config)
    scheduler = EnsembleScheduler(name, steps, [t.name for t in outs], config.max_batch_size > 0, calls,
                                  metrics=VersionMetrics(stats, metrics, name, version))
    return ModelVersion(name, version, config, [], scheduler, stats, [], 0.0, inputs=ins, outputs=outs,
                        labels=output_labels(config, model_dir, name))
