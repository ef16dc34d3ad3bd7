"""Glue to the batching Scheduler (server/batching/): config mapping and the metrics hooks it reports to."""

from __future__ import annotations

import logging
from typing import Any

from server.model_config import model_config_pb2 as mc
from server.stats import ModelStats

log = logging.getLogger("nnserve.repository")


class VersionMetrics:
    """SchedulerMetrics for one model version: executions feed /stats batch_stats and the Prometheus metrics."""

    def __init__(self, stats: ModelStats, metrics: Any, name: str, version: str):
        self.stats, self.metrics, self.name, self.version = stats, metrics, name, version

    def on_queue_depth(self, depth: int) -> None:
        if self.metrics is not None:
            self.metrics.pending.labels(self.name, self.version).set(depth)

    def on_batch(self, batch_size: int, num_requests: int, run: Any) -> None:
        self.stats.record_execution(batch_size, run.compute_input_ns, run.compute_infer_ns, run.compute_output_ns)
        if self.metrics is not None:
            self.metrics.execution(self.name, self.version, batch_size)

    def on_request_done(self, outcome: str, queue_ns: int) -> None:
        """Per-request success/failure is recorded by the data plane, which also sees validation failures."""


def batching_config(config: mc.ModelConfig) -> Any:
    from server.batching.config import BatchingConfig
    from server.config import batch_wait

    db = config.dynamic_batching
    policy = db.default_queue_policy
    return BatchingConfig(
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
        wait_policy=batch_wait(config, config.name),
    )


def make_batching_scheduler(config: mc.ModelConfig, instances: list[Any], hooks: VersionMetrics) -> Any:
    """The dynamic batcher, or None when the batching package is not importable."""
    try:
        from server.batching.scheduler import Scheduler
    except ImportError as exc:
        log.warning("server.batching.scheduler unavailable: %s", exc)
        return None
    return Scheduler(batching_config(config), instances, metrics=hooks)
