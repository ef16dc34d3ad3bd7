"""The activation memory planner: a pure function from ordered steps and buffer sizes to arena offsets.

No numpy here. Buffers are any hashable keys. The runtime builds the steps from the graph at the instance's max
shapes; tests build them by hand. Two placements are tried and the smaller arena is kept:
  - best-fit over an event sweep (allocate at first write, free after last read, smallest free block that fits);
  - greedy by size (TFLite): biggest buffers first, each in the smallest gap left by buffers it overlaps in time;
  - when neither reaches the live peak (the lower bound), greedy again over a few seeded random perturbations
    of the size order (deterministic; bounded work), since small reorderings often close the last gaps.
In-place reuse and aliases merge buffers into one storage group whose lifetime is the union of its members'.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

ALIGNMENT = 64
PERTURBED_TRIES = 64  # at most this many perturbed greedy runs ...
PERTURBED_WORK = 4_000_000  # ... and about this many buffer-pair checks in all

Key = Hashable


@dataclass(frozen=True)
class Step:
    """One scheduled op: the arena buffers it reads and the ones it writes."""

    reads: tuple[Key, ...] = ()
    writes: tuple[Key, ...] = ()


@dataclass(frozen=True)
class MemoryPlan:
    offsets: dict[Key, int]  # byte offset of every planned buffer (alias and in-place members share one)
    sizes: dict[Key, int]  # bytes each buffer needs (unaligned), as given
    lifetimes: dict[Key, tuple[int, int]]  # (first step, last step) of the buffer's storage group, inclusive
    storage: dict[Key, Key]  # buffer -> root buffer of its storage group
    arena_bytes: int
    naive_bytes: int  # every buffer of `sizes` in its own aligned slot (alias views have none)
    peak_live_bytes: int  # max over steps of aligned bytes live at once (in-place/alias groups once)
    strategy: str = ""
    workspace_bytes: int = 0  # filled in by the runtime
    weights_bytes: int = 0  # filled in by the runtime
    inplace: dict[Key, Key] = field(default_factory=dict)  # accepted in-place pairs, output -> input


def align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def plan(steps: Sequence[Step], sizes: Mapping[Key, int], *, inputs: Iterable[Key] = (),
         outputs: Iterable[Key] = (), inplace: Mapping[Key, Key] | None = None,
         aliases: Mapping[Key, Key] | None = None, alignment: int = ALIGNMENT) -> MemoryPlan:
    """Places every buffer in `sizes` into one arena.

    `inputs` are live from step 0 (copied in before the first step), `outputs` until after the last step.
    Keys a step mentions that are not in `sizes` are external (weights, host values) and ignored.
    `inplace` maps an output to the input it may overwrite; the pair is merged only when the input's storage
    dies at the writing step, holds no graph input or output, and the sizes match. `aliases` maps an output to
    the input whose storage it is a view of: always merged.
    """
    inputs, outputs = set(inputs), set(outputs)
    first, last = _liveness(steps, sizes, inputs, outputs)
    groups = _Groups(sizes, first, last)
    for out, src in (aliases or {}).items():
        if out in sizes and src in sizes:
            groups.merge(src, out)
    accepted = _merge_inplace(steps, sizes, groups, inplace or {}, inputs | outputs)
    roots = groups.roots()
    need = {r: align(groups.size[r], alignment) for r in roots}
    spans = {r: (groups.first[r], groups.last[r]) for r in roots}
    peak = _peak_live(need, spans, len(steps))
    candidates = [("best_fit_sweep", *_best_fit_sweep(need, spans)),
                  ("greedy_by_size", *_greedy_by_size(need, spans))]
    strategy, offsets, arena = min(candidates, key=lambda c: c[2])
    if arena > peak:
        found = _greedy_perturbed(need, spans, arena, peak)
        if found is not None:
            strategy, offsets, arena = "greedy_perturbed", *found
    alias_members = {k for k in (aliases or {}) if k in sizes and groups.find(k) != k}
    return MemoryPlan(
        offsets={k: offsets[groups.find(k)] for k in sizes},
        sizes=dict(sizes),
        lifetimes={k: spans[groups.find(k)] for k in sizes},
        storage={k: groups.find(k) for k in sizes},
        arena_bytes=arena,
        naive_bytes=sum(align(s, alignment) for k, s in sizes.items() if k not in alias_members),
        peak_live_bytes=peak,
        strategy=strategy,
        inplace=accepted,
    )


def _liveness(steps, sizes, inputs, outputs):
    """First write / last use of each buffer, as step indices."""
    first: dict[Key, int] = {k: 0 for k in inputs if k in sizes}
    last: dict[Key, int] = dict(first)
    for i, step in enumerate(steps):
        for k in step.writes:
            if k in sizes:
                first.setdefault(k, i)
                last[k] = max(last.get(k, i), i)
        for k in step.reads:
            if k in sizes:
                first.setdefault(k, i)
                last[k] = i
    end = max(len(steps) - 1, 0)
    for k in sizes:
        first.setdefault(k, 0)
        last.setdefault(k, first[k])
        if k in outputs:
            last[k] = end
    return first, last


class _Groups:
    """Union-find over buffers; each root carries the group's size and lifetime."""

    def __init__(self, sizes, first, last):
        self.parent = {k: k for k in sizes}
        self.size, self.first, self.last = dict(sizes), dict(first), dict(last)
        self.members = {k: {k} for k in sizes}

    def find(self, k: Key) -> Key:
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def merge(self, a: Key, b: Key) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        self.parent[rb] = ra
        self.size[ra] = max(self.size[ra], self.size[rb])
        self.first[ra] = min(self.first[ra], self.first[rb])
        self.last[ra] = max(self.last[ra], self.last[rb])
        self.members[ra] |= self.members.pop(rb)

    def roots(self) -> list[Key]:
        return [k for k in self.parent if self.find(k) == k]


def _merge_inplace(steps, sizes, groups: _Groups, inplace, pinned) -> dict[Key, Key]:
    writer = {k: i for i, s in enumerate(steps) for k in s.writes}
    accepted: dict[Key, Key] = {}
    for out, src in inplace.items():
        if out not in sizes or src not in sizes or sizes[out] != sizes[src] or out not in writer:
            continue
        r_src, r_out = groups.find(src), groups.find(out)
        if r_src == r_out or groups.members[r_src] & pinned:
            continue
        # The input's storage must die exactly where the output is born, and the output must not start earlier.
        if groups.last[r_src] != writer[out] or groups.first[r_out] != writer[out]:
            continue
        if groups.size[r_src] != groups.size[r_out]:
            continue
        groups.merge(src, out)
        accepted[out] = src
    return accepted


def _best_fit_sweep(need: dict, spans: dict) -> tuple[dict, int]:
    """Allocate at first step, free after last step; the smallest free block that fits wins."""
    events = []
    for r, (a, b) in spans.items():
        events.append((a, 1, -need[r], r))  # allocations of a step after that step's frees
        events.append((b + 1, 0, 0, r))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    free: list[tuple[int, int]] = []  # (offset, size), sorted by offset, coalesced
    top, offsets = 0, {}
    for _, is_alloc, _, r in events:
        if is_alloc:
            offsets[r], top = _take_block(free, need[r], top)
        else:
            _give_block(free, offsets[r], need[r])
    # Blocks freed at the very top were returned; the arena is the high-water mark.
    return offsets, top


def _take_block(free: list[tuple[int, int]], n: int, top: int) -> tuple[int, int]:
    fits = [(size, off, i) for i, (off, size) in enumerate(free) if size >= n]
    if fits:
        size, off, i = min(fits)
        if size == n:
            free.pop(i)
        else:
            free[i] = (off + n, size - n)
        return off, top
    if free and free[-1][0] + free[-1][1] == top:  # grow the block that touches the top
        off, _ = free.pop()
        return off, off + n
    return top, top + n


def _give_block(free: list[tuple[int, int]], off: int, n: int) -> None:
    free.append((off, n))
    free.sort()
    merged: list[tuple[int, int]] = []
    for o, s in free:
        if merged and merged[-1][0] + merged[-1][1] == o:
            merged[-1] = (merged[-1][0], merged[-1][1] + s)
        else:
            merged.append((o, s))
    free[:] = merged


def _greedy_perturbed(need: dict, spans: dict, arena: int, peak: int) -> tuple[dict, int] | None:
    """Greedy over sizes scaled by seeded noise in [0.5, 1.5); the best strictly smaller arena, or None."""
    rng = random.Random(0)
    n = max(len(need), 1)
    tries = max(4, min(PERTURBED_TRIES, PERTURBED_WORK // (n * n)))
    roots = list(need)
    best = None
    for _ in range(tries):
        noise = {r: 0.5 + rng.random() for r in roots}
        offsets, size = _greedy_by_size(need, spans, key=lambda r: (-need[r] * noise[r], spans[r]))
        if size < arena:
            best, arena = (offsets, size), size
            if size <= peak:
                break
    return best


def _greedy_by_size(need: dict, spans: dict, key=None) -> tuple[dict, int]:
    """TFLite's greedy-by-size: largest first, into the smallest gap among time-overlapping placed buffers."""
    order = sorted(need, key=key or (lambda r: (-need[r], spans[r])))
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets, arena = {}, 0
    for r in order:
        a, b = spans[r]
        busy = sorted((o, e) for o, e, f, l in placed if f <= b and a <= l)
        best, best_gap, prev_end = None, None, 0
        for o, e in busy:
            gap = o - prev_end
            if gap >= need[r] and (best_gap is None or gap < best_gap):
                best, best_gap = prev_end, gap
            prev_end = max(prev_end, e)
        off = prev_end if best is None else best
        offsets[r] = off
        placed.append((off, off + need[r], a, b))
        arena = max(arena, off + need[r])
    return offsets, arena


def _peak_live(need: dict, spans: dict, n_steps: int) -> int:
    delta = [0] * (max(n_steps, 1) + 1)
    for r, (a, b) in spans.items():
        delta[a] += need[r]
        delta[b + 1] -= need[r]
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak
