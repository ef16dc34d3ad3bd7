"""The sequence batcher's decisions as pure functions: (the sequences, now, the config) -> which sequences take which
slots, which sequences are released for idleness, what each free instance runs next, and when to look again.

Triton's sequence batcher (sequence_batch_scheduler.cc), minus its threads, locks and clock:
- every instance has `slots_per_instance` sequence slots: max_batch_size of them with the direct strategy (at least
  1), max_candidate_sequences with the oldest. A sequence holds one slot, on one instance, from its first request
  to its END (or until it is released for idleness), so all its requests run on that instance, one at a time and in
  arrival order;
- a sequence that finds no free slot waits in the backlog; as slots free up, backlog sequences take them in the
  order their first waiting request arrived;
- an instance runs at most one request per sequence in an execution: direct puts them in slot order, oldest in
  arrival order, up to max_batch_size (1 for a model that does not batch);
- a sequence with nothing queued or running whose last request arrived max_sequence_idle_microseconds ago is
  released (its slot goes to the backlog or back to the free slots).

Nothing here locks, sleeps or reads a clock: the caller passes `now_ns`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

DIRECT, OLDEST = "direct", "oldest"
STRATEGIES = (DIRECT, OLDEST)


@dataclass(frozen=True)
class SequencePolicy:
    """The knobs of the sequence batcher (the sequence_batching block of a config.pbtxt).

    Attributes:
        strategy: "direct" or "oldest".
        max_batch_size: most requests of one execution; 0 = the model does not batch (one request per execution).
        slots_per_instance: sequences one instance holds at a time.
        idle_ns: max_sequence_idle_microseconds, in ns.
        max_queue_delay_ns: how long a partial batch may wait for the instance's other sequences.
        preferred_batch_sizes: oldest only: batch sizes dispatched as soon as they are reached.
        minimum_slot_utilization: direct only: the share of the instance's slots whose requests, once ready,
            dispatch a batch without waiting for the delay.
    """

    strategy: str = DIRECT
    max_batch_size: int = 0
    slots_per_instance: int = 1
    idle_ns: int = 1_000_000_000
    max_queue_delay_ns: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    minimum_slot_utilization: float = 0.0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"sequence_batching: strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.slots_per_instance < 1:
            raise ValueError(f"sequence_batching: slots per instance must be >= 1, got {self.slots_per_instance}")

    @property
    def batch_limit(self) -> int:
        return max(self.max_batch_size, 1)


@dataclass(frozen=True)
class SequenceView:
    """What the policy knows of one sequence.

    Attributes:
        key: its correlation id.
        slot: the slot it holds (instance * slots_per_instance + slot); None = in the backlog.
        head_ns: when its oldest queued request arrived; None = nothing queued.
        last_ns: when its last request arrived.
        running: a request of it is executing now.
    """

    key: Hashable
    slot: int | None
    head_ns: int | None
    last_ns: int
    running: bool = False


@dataclass(frozen=True)
class SequencePlan:
    """What to do now: release `released` (idle), give each (key, slot) of `bound`, run `batches` (instance ->
    keys, in the order of the execution's rows); call again at `wait_until_ns` if nothing else happens."""

    released: tuple[Hashable, ...] = ()
    bound: tuple[tuple[Hashable, int], ...] = ()
    batches: tuple[tuple[int, tuple[Hashable, ...]], ...] = ()
    wait_until_ns: int | None = None


def plan(seqs: Sequence[SequenceView], now_ns: int, policy: SequencePolicy, *, num_instances: int,
         free_instances: frozenset[int]) -> SequencePlan:
    """The whole decision, in Triton's order: idle sequences leave, backlog sequences take the freed slots, free
    instances run their ready sequences."""
    released = idle(seqs, now_ns, policy)
    gone = set(released)
    live = [s for s in seqs if s.key not in gone]
    bound = bind(live, policy, num_instances)
    slots = {key: slot for key, slot in bound}
    placed = [SequenceView(s.key, slots.get(s.key, s.slot), s.head_ns, s.last_ns, s.running) for s in live]
    batches, wait = [], _next_idle(placed, now_ns, policy)
    for instance in sorted(free_instances):
        batch, ready_at = choose(placed, instance, now_ns, policy)
        if batch:
            batches.append((instance, batch))
        elif ready_at is not None:
            wait = ready_at if wait is None else min(wait, ready_at)
    return SequencePlan(tuple(released), tuple(bound), tuple(batches), wait)


def idle(seqs: Sequence[SequenceView], now_ns: int, policy: SequencePolicy) -> list[Hashable]:
    """Sequences with nothing queued or running whose last request arrived at least idle_ns ago."""
    released = []
    for seq in seqs:
        at = _idle_at(seq, policy)
        if at is not None and now_ns >= at:
            released.append(seq.key)
    return released


def _idle_at(seq: SequenceView, policy: SequencePolicy) -> int | None:
    if seq.head_ns is not None or seq.running:
        return None
    return seq.last_ns + policy.idle_ns


def _next_idle(seqs: Sequence[SequenceView], now_ns: int, policy: SequencePolicy) -> int | None:
    times = [t for t in (_idle_at(s, policy) for s in seqs) if t is not None and t > now_ns]
    return min(times, default=None)


def bind(seqs: Sequence[SequenceView], policy: SequencePolicy, num_instances: int) -> list[tuple[Hashable, int]]:
    """Free slots to backlog sequences that have a request waiting, oldest first; each to the instance holding the
    fewest sequences (ties: the lowest slot), so that sequences spread over the instances."""
    held = {s.slot for s in seqs if s.slot is not None}
    free = [slot for slot in range(num_instances * policy.slots_per_instance) if slot not in held]
    load = [0] * num_instances
    for slot in held:
        load[slot // policy.slots_per_instance] += 1
    waiting = sorted((s for s in seqs if s.slot is None and s.head_ns is not None), key=lambda s: s.head_ns or 0)
    bound = []
    for seq in waiting:
        if not free:
            break
        slot = min(free, key=lambda f: (load[f // policy.slots_per_instance], f))
        free.remove(slot)
        load[slot // policy.slots_per_instance] += 1
        bound.append((seq.key, slot))
    return bound


def choose(seqs: Sequence[SequenceView], instance: int, now_ns: int,
           policy: SequencePolicy) -> tuple[tuple[Hashable, ...], int | None]:
    """The sequences whose next requests `instance` runs now (one request each), or () and when to look again
    (a delay running out; None: only an event can change it)."""
    first = instance * policy.slots_per_instance
    mine = [s for s in seqs if s.slot is not None and first <= s.slot < first + policy.slots_per_instance]
    ready = [s for s in mine if s.head_ns is not None]
    if not ready:
        return (), None
    if policy.strategy == DIRECT:
        ready.sort(key=lambda s: s.slot or 0)
    else:
        ready.sort(key=lambda s: s.head_ns or 0)
    ready = ready[:policy.batch_limit]
    if policy.max_queue_delay_ns == 0 or _complete(ready, mine, policy):
        return tuple(s.key for s in ready), None
    ready_at = min(s.head_ns or 0 for s in ready) + policy.max_queue_delay_ns
    if now_ns >= ready_at:
        return tuple(s.key for s in ready), None
    return (), ready_at


def _complete(ready: list[SequenceView], mine: list[SequenceView], policy: SequencePolicy) -> bool:
    """Whether the batch cannot usefully wait: it is full, or (direct) every sequence of the instance, or the
    minimum share of its slots, is ready; (oldest) it reached a preferred size."""
    if len(ready) >= policy.batch_limit:
        return True
    if policy.strategy == DIRECT:
        utilization = len(ready) / policy.slots_per_instance
        return len(ready) == len(mine) or (policy.minimum_slot_utilization > 0
                                           and utilization >= policy.minimum_slot_utilization)
    return len(ready) in policy.preferred_batch_sizes
