"""Maps a model's dynamic_batching config onto the batching engineer's Scheduler (server/batching/)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from server.protocol.grpc import model_config_pb2 as mc

log = logging.getLogger("nnserve.repository")


def batching_config(config: mc.ModelConfig) -> Any:
    from server.batching.config import BatchingConfig

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
    )


def make_batching_scheduler(config: mc.ModelConfig, instances: list[Any],
                            on_execution: Callable[[int, int, int, int], None], metrics: Any, version: str) -> Any:
    """A started-later Scheduler, or None when the batching package is not importable."""
    try:
        from server.batching.scheduler import Scheduler
    except ImportError as exc:
        log.warning("server.batching.scheduler unavailable: %s", exc)
        return None
    return Scheduler(batching_config(config), instances, metrics=_scheduler_metrics(config, on_execution, metrics,
                                                                                     version))


def _scheduler_metrics(config: mc.ModelConfig, on_execution: Callable[[int, int, int, int], None], metrics: Any,
                       version: str) -> Any:
    return None
