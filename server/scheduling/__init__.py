"""Scheduling: one scheduler per model version with two policies, direct execution and dynamic batching; the
decision of the latter is a pure function (policy.decide) of the queue, the time and the config. A stateful model
(a sequence_batching block) has the sequence batcher instead (sequence.SequenceScheduler), whose decisions are the
pure function sequence_policy.plan."""

from __future__ import annotations

from server.scheduling.config import SchedulerConfig
from server.scheduling.execution import Execution
from server.scheduling.policy import Decision, Pending, decide
from server.scheduling.scheduler import InferResult, Scheduler, SchedulerMetrics

__all__ = ["Decision", "Execution", "InferResult", "Pending", "Scheduler", "SchedulerConfig", "SchedulerMetrics",
           "decide"]
