"""The scheduling decision as a pure function: (queue, now, config) -> what to run and when to look again. Where
requests are not merged (the direct policy, or a model that does not batch) it is the first request in service
order. For the dynamic batcher the semantics follow Triton's (GetDynamicBatch), minus its locks and clock:
- requests are served by priority level (1 = highest), then in arrival order; with timeout_action DELAY an
  expired request moves behind the unexpired ones of its level, with REJECT it is reported in `expired`;
- the batch starts at the first request in that order (so it is never starved) and takes the following requests
  with the same shape_key while the total stays within max_batch_size;
- a reachable preferred batch size is dispatched at once (the largest one reachable);
- otherwise the batch goes when it is full, when max_queue_delay has passed for its oldest request, or at once
  when max_queue_delay is 0; until then the caller sleeps until `wait_until_ns`.
- One addition of ours, for the adaptive wait (SchedulerConfig.wait_policy): when the caller passes
  `expected_rows` (the most rows its recent load had in the server at once, server/scheduling/population.py), a
  batch that already holds that many goes at once, since no other request is likely to join it. A lone client
  then does not wait the delay out (after a burst, only until the burst's peak leaves the window: the caller
  decides again then); eight closed-loop clients still wait for all eight.

Nothing here locks, sleeps or reads a clock: the caller passes `now_ns`, which is what makes it testable.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from server.scheduling.config import SchedulerConfig


@dataclass(frozen=True)
class Pending:
    """What the policy needs to know about one queued request."""

    req_id: int
    rows: int  # the request's dim 0 (1 for a model that does not batch): a request of 3 rows fills 3 of a batch
    shape_key: Hashable  # non-batch shapes and dtypes of all inputs: only equal keys merge
    enqueue_ns: int
    deadline_ns: int | None = None  # None = waits forever
    priority: int = 0  # effective level, see SchedulerConfig.priority_of


@dataclass(frozen=True)
class Decision:
    """What to do now.

    Attributes:
        batch: req_ids to run together now, in queue order; empty = nothing to run now.
        expired: req_ids whose deadline passed (REJECT): answer "Request timeout expired".
        wait_until_ns: when to call decide() again if nothing else happens (a request arrives, an instance frees
            up); None = only such an event can change the decision.
    """

    batch: tuple[int, ...] = ()
    expired: tuple[int, ...] = ()
    wait_until_ns: int | None = None


def is_expired(pending: Pending, now_ns: int) -> bool:
    return pending.deadline_ns is not None and now_ns >= pending.deadline_ns


def service_order(queue: Sequence[Pending], now_ns: int, cfg: SchedulerConfig) -> list[Pending]:
    """Queued requests in the order they are served; REJECT-expired requests are left out."""
    delay_expired = cfg.timeout_action == "DELAY"
    live = [(p.priority, delay_expired and is_expired(p, now_ns), i, p)
            for i, p in enumerate(queue) if delay_expired or not is_expired(p, now_ns)]
    live.sort(key=lambda entry: entry[:3])
    return [entry[3] for entry in live]


def decide(queue: Sequence[Pending], now_ns: int, cfg: SchedulerConfig, *, free_instances: int,
           expected_rows: int = 0) -> Decision:
    """Choose the next batch from `queue` (arrival order) at time `now_ns` with `free_instances` idle;
    `expected_rows` > 0 dispatches a batch of at least that many rows without waiting (see the module doc)."""
    expired = () if cfg.timeout_action == "DELAY" else tuple(p.req_id for p in queue if is_expired(p, now_ns))
    live = service_order(queue, now_ns, cfg)
    next_deadline = _next_deadline(live, now_ns)
    if not live or free_instances <= 0:
        return Decision(expired=expired, wait_until_ns=next_deadline)
    if not cfg.batches:
        return Decision(batch=(live[0].req_id,), expired=expired)

    chosen, full = _gather(live, cfg.max_batch_size)
    preferred = _preferred_prefix(chosen, cfg.preferred_batch_sizes)
    delay_ns = cfg.max_queue_delay_us * 1000
    ready_at = min(p.enqueue_ns for p in chosen) + delay_ns
    delay_passed = now_ns >= ready_at
    enough = expected_rows > 0 and sum(p.rows for p in chosen) >= min(expected_rows, cfg.max_batch_size)
    if preferred and (delay_ns == 0 or not delay_passed):
        chosen = chosen[:preferred]
    elif not (full or delay_passed or enough):
        return Decision(expired=expired, wait_until_ns=_earliest(ready_at, next_deadline))
    return Decision(batch=tuple(p.req_id for p in chosen), expired=expired)


def _gather(live: list[Pending], max_batch_size: int) -> tuple[list[Pending], bool]:
    """The head request plus the following same-shape requests that fit; and whether the batch can not grow."""
    head = live[0]
    chosen, total = [head], head.rows
    for p in live[1:]:
        if total >= max_batch_size:
            break
        if p.shape_key != head.shape_key:
            continue
        if total + p.rows > max_batch_size:
            # Stop rather than skip ahead to a smaller request: requests of one shape keep their order.
            return chosen, True
        chosen.append(p)
        total += p.rows
    return chosen, total >= max_batch_size


def _preferred_prefix(chosen: list[Pending], preferred_sizes: tuple[int, ...]) -> int:
    """Number of leading requests whose total is the largest preferred batch size reachable; 0 = none."""
    best, total = 0, 0
    for n, p in enumerate(chosen, start=1):
        total += p.rows
        if total in preferred_sizes:
            best = n
    return best


def _next_deadline(live: list[Pending], now_ns: int) -> int | None:
    """The next moment a deadline passes, so that expiry is answered on time even while nothing else happens."""
    upcoming = [p.deadline_ns for p in live if p.deadline_ns is not None and p.deadline_ns > now_ns]
    return min(upcoming, default=None)


def _earliest(a: int, b: int | None) -> int:
    return a if b is None else min(a, b)
