"""How one model version schedules its requests: the `dynamic_batching` block of its config.pbtxt (or its absence)
plus `max_batch_size`.

Field names follow Triton's config (preferred_batch_size -> preferred_batch_sizes, microseconds -> *_us), so the
server maps a parsed config onto this dataclass one field at a time (server/model_version.py).
"""

from __future__ import annotations

from dataclasses import dataclass

TIMEOUT_ACTIONS = ("REJECT", "DELAY")
WAIT_POLICIES = ("full", "adaptive")


@dataclass(frozen=True)
class SchedulerConfig:
    """The two policies of the one scheduler (server/scheduling/scheduler.py) and their knobs.

    Words used with one meaning throughout the package: a request's *rows* are its dim 0 (1 for a model that does
    not batch); an *execution* is one run of an instance; its *batch size* is the rows it ran together (the sum
    of its requests' rows); the *queue depth* is the requests waiting, not those executing.

    Attributes:
        dynamic_batching: the policy. True (a dynamic_batching block): Triton's dynamic batcher: requests wait in
            the queue and policy.decide() chooses which run together, and when. False (no block): Triton's default
            scheduler: each request is one execution, dispatched as soon as an instance is free (the request that
            finds one idle with nobody waiting runs at once, on the event loop thread when its InlinePolicy
            measured it cheap), in arrival order; the queue knobs below keep their defaults.
        max_batch_size: most rows of one execution; 0 = the model does not batch, so each request runs alone with
            its inputs passed through unchanged.
        preferred_batch_sizes: batch sizes to dispatch as soon as they are reachable.
        max_queue_delay_us: how long the oldest request may wait for the batch to grow; 0 = dispatch at once.
        max_queue_size: most requests waiting at a time; 0 = unbounded. A full queue rejects at once.
        default_timeout_us: how long a request may wait in the queue; 0 = forever.
        timeout_action: "REJECT" fails an expired request, "DELAY" moves it behind the unexpired ones.
        allow_timeout_override: a request may set a shorter timeout than the default (never a longer one).
        priority_levels: number of levels (1 = highest); 0 = one level.
        default_priority_level: level of requests that give none (or an out-of-range one).
        preserve_ordering: answer requests in the order they arrived even when executions finish out of order.
        wait_policy: "full" (Triton's): a batch below the preferred/max size waits max_queue_delay out;
            "adaptive": it goes as soon as it holds as many rows as the recent load had in the server at once
            (server/scheduling/population.py), never later than "full" would send it.
        may_run_inline: whether the direct policy may run cheap executions on the event loop thread. False for
            instances whose run waits on another process (the Python backend): on the loop thread the wait would
            block it, and the calls such a model makes to other models (BLS) need the loop.
    """

    dynamic_batching: bool = True
    max_batch_size: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    max_queue_size: int = 0
    default_timeout_us: int = 0
    timeout_action: str = "REJECT"
    allow_timeout_override: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    preserve_ordering: bool = False
    wait_policy: str = "full"
    may_run_inline: bool = True

    def __post_init__(self) -> None:
        # Normalise lists from a parsed config so the dataclass stays hashable and comparable.
        object.__setattr__(self, "preferred_batch_sizes", tuple(sorted(set(self.preferred_batch_sizes))))
        for name in ("max_batch_size", "max_queue_delay_us", "max_queue_size", "default_timeout_us",
                     "priority_levels", "default_priority_level"):
            if getattr(self, name) < 0:
                raise ValueError(f"dynamic_batching: {name} must be >= 0, got {getattr(self, name)}")
        if self.wait_policy not in WAIT_POLICIES:
            raise ValueError(f"dynamic_batching: the wait policy must be one of {WAIT_POLICIES}, "
                             f"got {self.wait_policy!r}")
        if self.timeout_action not in TIMEOUT_ACTIONS:
            raise ValueError(f"dynamic_batching: timeout_action must be one of {TIMEOUT_ACTIONS}, "
                             f"got {self.timeout_action!r}")
        for size in self.preferred_batch_sizes:
            if size < 1 or size > self.max_batch_size:
                raise ValueError(f"dynamic_batching: preferred_batch_size {size} must be in "
                                 f"[1, max_batch_size={self.max_batch_size}]")
        if self.priority_levels and not 1 <= self.default_priority_level <= self.priority_levels:
            raise ValueError(f"dynamic_batching: default_priority_level {self.default_priority_level} must be "
                             f"in [1, priority_levels={self.priority_levels}]")

    @property
    def batches(self) -> bool:
        """Whether requests may be merged: a dynamic_batching block and a model that batches on dim 0."""
        return self.dynamic_batching and self.max_batch_size > 0

    def priority_of(self, requested: int) -> int:
        """The level a request is queued at: Triton uses the default for 0 and for levels beyond the last."""
        if self.priority_levels == 0:
            return 0
        if 1 <= requested <= self.priority_levels:
            return requested
        return self.default_priority_level

    def timeout_of(self, requested_us: int | None) -> int:
        """The queue timeout of a request in microseconds (0 = none); an override may only shorten it."""
        timeout = self.default_timeout_us
        if self.allow_timeout_override and requested_us:
            # 0 means "no timeout", so any positive override is shorter than it.
            if timeout == 0 or requested_us < timeout:
                timeout = requested_us
        return timeout
