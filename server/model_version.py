"""One loaded model version: engine model, config, instances with preallocated arenas, scheduler, statistics."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from server import config as cfg
from server.backend import BackendInstance, BackendModel
from server.batching_adapter import VersionMetrics
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc
from server.runner import DirectRunner, execute
from server.security import inside
from server.stats import ModelStats

log = logging.getLogger("nnserve.repository")

READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"


@dataclass
class ModelVersion:
    name: str
    version: str
    config: mc.ModelConfig
    instances: list[BackendInstance]
    scheduler: Any
    stats: ModelStats
    arena_bytes: list[int]
    load_seconds: float
    state: str = READY
    inputs: list[cfg.TensorConfig] = field(default_factory=list)
    outputs: list[cfg.TensorConfig] = field(default_factory=list)
    max_shapes: dict[str, list[int]] = field(default_factory=dict)

    # Looked up on every request: computed once (a loaded version's config does not change; a reload makes a new
    # ModelVersion), not read from the protobuf each time.
    @functools.cached_property
    def max_batch_size(self) -> int:
        return int(self.config.max_batch_size)

    @functools.cached_property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @functools.cached_property
    def input_configs(self) -> dict[str, cfg.TensorConfig]:
        return {t.name: t for t in self.inputs}

    @functools.cached_property
    def output_configs(self) -> dict[str, cfg.TensorConfig]:
        return {t.name: t for t in self.outputs}


def build_instances(model: BackendModel, config: mc.ModelConfig,
                    name: str) -> tuple[list[BackendInstance], dict[str, list[int]]]:
    """Instance per instance_group count (per listed GPU for KIND_GPU), each planning its arena for
    max_batch_size x max dims up front."""
    shapes = cfg.max_shapes(config, name)  # the API's shapes; the engine's differ where an input has a reshape
    engine_shapes = cfg.engine_max_shapes(config, name)
    instances: list[BackendInstance] = []
    for device in cfg.instance_devices(config):
        try:
            instances.append(model.instance(device, max_shapes=engine_shapes))
        except Exception as exc:  # engine errors name the device ("no CUDA device 1 ...") or the refused node
            raise ModelLoadError(f"model '{name}': creating an instance on {device} for max shapes {shapes} "
                                 f"failed: {exc}") from exc
    return instances, shapes


def warm_up(instances: list[BackendInstance], config: mc.ModelConfig, name: str, version_dir: Path) -> None:
    """Run every model_warmup sample on every instance; the model is not READY until this succeeds."""
    rng = np.random.default_rng(0)
    tensors = {t.name: t for t in cfg.tensor_configs(config)[0]}
    for warmup in config.model_warmup:
        batch = max(int(warmup.batch_size), 1)
        feed = {}
        for input_name, spec in warmup.inputs.items():
            shape = ([batch] if config.max_batch_size > 0 else []) + list(spec.dims)
            dtype = cfg.numpy_dtype(spec.data_type)
            kind = spec.WhichOneof("input_data_type")
            if kind == "input_data_file":
                raw = _warmup_file(version_dir.parent / "warmup", spec.input_data_file, name).read_bytes()
                feed[input_name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
            elif kind == "random_data":
                feed[input_name] = rng.random(shape).astype(dtype)
            else:
                feed[input_name] = np.zeros(shape, dtype=dtype)
            if input_name in tensors:  # warm-up dims are the API's, as a request's
                feed[input_name] = tensors[input_name].to_model(feed[input_name], config.max_batch_size > 0)
        for instance in instances:
            for _ in range(max(int(warmup.count), 1)):
                try:
                    execute(instance, feed)
                except Exception as exc:
                    raise ModelLoadError(f"model '{name}': model_warmup '{warmup.name}' failed: {exc}") from exc


def _warmup_file(warmup_dir: Path, file_name: str, name: str) -> Path:
    """model_warmup input files live in <model>/warmup/; a config (maybe sent through the load API) must not point
    anywhere else."""
    path = warmup_dir / file_name
    if not inside(warmup_dir, path):
        raise ModelLoadError(f"model '{name}': model_warmup input_data_file '{file_name}' is outside "
                             f"{warmup_dir.name}/")
    return path


def make_scheduler(config: mc.ModelConfig, instances: list[BackendInstance], hooks: Any) -> Any:
    """The batching Scheduler when the config has dynamic_batching, else one request per execution."""
    if config.HasField("dynamic_batching"):
        from server.batching_adapter import make_batching_scheduler

        sched = make_batching_scheduler(config, instances, hooks)
        if sched is not None:
            return sched
        log.warning("model '%s': dynamic batching is not available; running one request per execution", config.name)
    return DirectRunner(instances, batching=config.max_batch_size > 0, hooks=hooks)


def load_version(model: BackendModel, config: mc.ModelConfig, name: str, version: str, version_dir: Path,
                 metrics: Any) -> ModelVersion:
    """Blocking: instances + warmup. The scheduler is created here and started by the repository."""
    t0 = time.perf_counter()
    instances, shapes = build_instances(model, config, name)
    warm_up(instances, config, name, version_dir)
    stats = ModelStats(name, version)
    arenas = [i.memory_bytes for i in instances]
    stats.memory_bytes = sum(arenas)
    if metrics is not None:  # before the repository's model_loaded, which sets the per-instance gauges
        metrics.instances_placed(name, version, instances)
    scheduler = make_scheduler(config, instances, VersionMetrics(stats, metrics, name, version))
    ins, outs = cfg.tensor_configs(config)
    return ModelVersion(name, version, config, instances, scheduler, stats, arenas, time.perf_counter() - t0,
                        inputs=ins, outputs=outs, max_shapes=shapes)
