"""Dynamic batching: a pure policy (policy.decide) and the asyncio scheduler that feeds engine instances."""

from __future__ import annotations

from server.batching.config import BatchingConfig
from server.batching.policy import Decision, Pending, decide
from server.batching.scheduler import InferResult, Scheduler, SchedulerMetrics

__all__ = ["BatchingConfig", "Decision", "InferResult", "Pending", "Scheduler", "SchedulerMetrics", "decide"]
