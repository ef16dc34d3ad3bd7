"""Runs of a binding's calls replayed as one native program (native_program.py): the Python of each kernel skipped.

A kernel that can say which C calls a run of it on given arrays makes has a `native(inputs, outputs, workspace)`
attribute returning a `Native` (or None when it cannot say, for these arrays or now). After a binding's first run,
`fuse` asks every call whose arrays stay the same run after run (arena views and the workspace) and puts each run of
MIN_CALLS or more consecutive answers into one Segment, a call like any other in the binding's list. A call with
arrays that are new each run (Bound.varying: the caller's inputs, which the model's first op reads; a direct output,
computed into a fresh array the caller then owns, which its last op writes) joins too where its kernel has
`native_rebound(inputs, outputs, workspace, reads, writes)` (an int8 model's input quantization, a reorder of the
input into blocks or of the output out of them, a float model's first conv on oneDNN or a conv reordering into the
output, an int8 detector's joined dequantized heads, a softmax over the last axis): its Native names where each such
array's address goes (`rebinds` for inputs, `out_rebinds` for outputs: a job's word, or a memory pointer in one of
its records), written before every replay from the array the run attached, and the checks to make on its outputs
after the program (`after`: a quantization's NaN test). An array of another dtype, shape or strides than recorded
runs the calls' Python. Before a program is kept, every place in its records and jobs that holds an address inside
one of those arrays must be one that is rebound: a record that kept one run's array would read a freed input, or
write into an output the caller already owns.

A segment's program holds choices its kernels made from process-wide settings (OpenMP thread counts, whether a
pass runs as a native region): it is kept per `threads.regime()` and recorded again for a new one. Its records
skip what the kernels' Python skips when nothing changed (re-pointing a conv's memories): each kernel names the
object and the pointers that must still hold (`checks`); when another binding re-pointed them since, the segment
runs its calls' Python once (which re-points them) and records again. Errors name the node whose C call failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.devices.cpu import native_program as N
from engine.devices.cpu import threads as T
from engine.devices.cpu.native_program import Program
from engine.devices.cpu.onednn import objects as D
from engine.errors import EngineError, KernelError

MIN_CALLS = 2  # a single call gains too little over its own Python to be worth a segment
# Recordings a segment tries per regime before it keeps to its kernels' Python there (a kernel that cannot say its
# records now, e.g. its plan evicted from a shape cache, can again after its Python ran once)
RECORD_TRIES = 3
log = logging.getLogger("engine.devices.cpu")
# What of a call is new each run (Bound.varying): the indices of its inputs and of its outputs that are (the
# caller's inputs, fresh outputs); ((), ()) for a call on arena arrays and host values only
Varying = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass
class Native:
    """A kernel run's C calls: native_program records; (object, pointers) pairs that must hold, `obj._bound is
    pointers`, for the records to be right; what the records point into, kept alive with the program."""

    records: list[tuple[int, ...]]
    checks: list[tuple[object, object]] = field(default_factory=list)
    keep: list = field(default_factory=list)
    # (input index, int64 words, word): the address of the call's input `index` (an array new each run: one of the
    # caller's) goes into words[word] before each replay: a job's word, or with words None, (record, argument
    # column) of one of these records (a memory's pointer: set_records); `after`: what to check once the program
    # has run (raises to fail the run); `out_rebinds`: the same for outputs (a direct output's fresh array)
    rebinds: list[tuple[int, np.ndarray | None, int | tuple[int, int]]] = field(default_factory=list)
    after: list[Callable[[], None]] = field(default_factory=list)
    out_rebinds: list[tuple[int, np.ndarray | None, int | tuple[int, int]]] = field(default_factory=list)


def team_record(fn: int, job: np.ndarray, items: int, work: int) -> tuple[int, ...] | None:
    """The record of a region function `fn` (numba cfunc over a job: loops/native.py) that runs what
    parallel_for(loop, items, work, ...) would: on this thread where parallel_for runs one chunk, as a native region
    where it would split and regions run natively (the same items split otherwise, each computed alike); None where
    it would split over Python callbacks (the team not running native regions)."""
    if T.chunks_for(items, work) <= 1:
        return (N.OP_CALL, fn, job.ctypes.data)
    if T.get_threads() > 1 and T.native_regions():
        return T.region_record(fn, job.ctypes.data)
    return None


def set_records(records: list[tuple[int, ...]], memory: D.Memory) -> list[tuple[int, int]]:
    """(record, argument column) of each record among `records` that points `memory` (dnnl_memory_set_data_handle):
    where a rebind writes the address of a caller's array (Native.rebinds with words None)."""
    return [(r, 3) for r, rec in enumerate(records) if rec[0] == N.OP_SET and rec[2] == memory.h.value]


def step_native(step: D.Step, ptrs: dict[int, int], keep: object) -> Native:
    """A kernel that runs one oneDNN step after sync_threads() and waits (D.run_src_dst's way) as records; `keep`
    holds the step alive (its plan)."""
    return Native(step.records(ptrs, T.threads_for(None)) + [D.wait_record()], [], [keep])


class _Recorded:
    """One regime's program and what it needs at run time."""

    def __init__(self, natives: list[Native], calls: list[tuple]):
        records, owners, checks, keep = [], [], [], []
        # (call, side: 1 inputs / 2 outputs, index, words or the program's first row of the call's records, word)
        rebinds = []
        self.after: list[Callable[[], None]] = []
        for k, nat in enumerate(natives):
            for side, entries in ((1, nat.rebinds), (2, nat.out_rebinds)):
                rebinds += [(k, side, j, len(records) if words is None else words, word) for j, words, word in entries]
            records += nat.records
            owners += [k] * len(nat.records)
            checks += nat.checks
            keep += nat.keep
            self.after += nat.after
        records.append(D.threads_record(T.get_threads()))
        owners.append(len(natives) - 1)
        self.program = Program(records, keep)
        self.jobs = [x for x in keep if isinstance(x, np.ndarray) and x.dtype == np.int64 and x.ndim == 1]
        # (call, side, index, words, word, dtype, shape, strides) of the arrays new each run, a record's argument as
        # the program's (row, column)
        self.rebinds: list[tuple] = []
        for k, side, j, words, word in rebinds:
            a = calls[k][side][j]
            if isinstance(words, int):
                words, word = self.program.words, (words + word[0], word[1])
            self.rebinds.append((k, side, j, words, word, a.dtype, a.shape, a.strides))
        self.owners = owners
        self.checks = checks
        self.stream = D.stream().value
        words = self.program.words
        self.stream_exec = np.flatnonzero((words[:, 0] == 0) & (words[:, 3] == self.stream))
        self.stream_wait = np.flatnonzero((words[:, 0] == 2) & (words[:, 2] == self.stream))
        self.regions = bool(np.any(words[:, 0] == 4))

    def stray_addresses(self, calls: list[tuple]) -> list[str]:
        """Where the records or the jobs they run (the int64 arrays the Natives keep) hold an address inside one of the
        arrays that are new each run without that place being rebound: [] for a program that may be kept. What it
        cannot see: a pointer a Python run left in a C object (a oneDNN memory) that the records execute without
        pointing it first; a kernel rebinding such an array must point every memory that reads or writes it in its
        records (an OP_SET), as Plan.records refuses a fresh output that its primitive would write itself."""
        rebound = {(id(words), word if isinstance(word, int) else tuple(word)) for _, _, _, words, word, *_ in
                   self.rebinds}
        stray = []
        for k, side, j, *_ in self.rebinds:
            a = calls[k][side][j]
            lo = a.__array_interface__["data"][0]
            hi = lo + max(a.nbytes, 1)
            for words in [self.program.words, *self.jobs]:
                for at in zip(*np.nonzero((words >= lo) & (words < hi)), strict=True):
                    place = (id(words), int(at[0]) if words.ndim == 1 else (int(at[0]), int(at[1])))
                    if place not in rebound:
                        stray.append(f"{'input' if side == 1 else 'output'} {j} of call {k} at {place[1]}")
        return stray

    def valid(self) -> bool:
        for obj, pointers in self.checks:
            if obj._bound is not pointers:  # type: ignore[attr-defined]
                return False
        return True

    def rebind(self, calls: list[tuple]) -> bool:
        """Writes the addresses of this run's new arrays (the caller's inputs, fresh outputs) where the records use
        them (job words, record arguments); False (nothing written that matters: no program runs then) where one
        is not of the very dtype object, the shape and the strides the records were made for (a dtype that only
        compares equal, or a size-1 axis of other strides, runs the Python: a safe miss). Cheap tests and the
        interface's dict, not a.ctypes (numpy's Python helper): these run on caches a model's kernels have just
        left cold (UltraFace int8, batch 1: ~10 us a run with the flags object and a.ctypes)."""
        for k, side, j, words, word, dtype, shape, strides in self.rebinds:
            a = calls[k][side][j]
            if a.__class__ is not np.ndarray or a.dtype is not dtype or a.shape != shape or a.strides != strides:
                return False
            words[word] = a.__array_interface__["data"][0]
        return True

    def use_stream(self, stream: int) -> None:
        """Points the records at the calling thread's stream (oneDNN's streams are per thread)."""
        if stream != self.stream:
            self.program.patch(self.stream_exec, 3, stream)
            self.program.patch(self.stream_wait, 2, stream)
            self.stream = stream


class Segment:
    """Consecutive calls of a binding run as one native program (see the module's doc); called as a kernel.

    While a program with native regions runs, it holds OpenMP's pool (`busy`) from its first record to its last,
    oneDNN's executions included: another thread's kernels then split nothing (they run their loops alone), as
    while any run_native region of theirs runs."""

    def __init__(self, calls: list[tuple], nodes: list, workspace: np.ndarray | None, first: _Recorded | None,
                 regime: tuple, varying: list[Varying]):
        self.calls, self.nodes, self.workspace = calls, nodes, workspace
        # per call, its inputs and outputs that are new each run (Bound.varying): every recording asks for their
        # rebinds (without them a record would keep one run's array for good)
        self.varying = varying
        self.programs: dict[tuple, _Recorded] = {} if first is None else {regime: first}
        self.misses: dict[tuple, int] = {}  # failed recordings per regime (RECORD_TRIES)

    def __call__(self, inputs, outputs, workspace) -> None:
        regime = T.regime()
        rec = self.programs.get(regime)
        if rec is None and self.misses.get(regime, 0) < RECORD_TRIES:
            rec = self._record(regime)
        if rec is None or not rec.valid():
            if rec is not None:  # re-pointed by another binding since: recorded again on the next run
                del self.programs[regime]
            self._python()
            return
        if rec.rebinds and not rec.rebind(self.calls):
            self._python()  # a caller's array unlike the recorded one: the kernels' own checks and paths
            return
        pool = T.region_pool() if rec.regions else None
        if pool is not None and not pool.busy.acquire(blocking=False):
            self._python()  # another thread's region: its loops then run alone, as run_native's callers do
            return
        try:
            T.park()
            rec.use_stream(D.stream().value)
            failed = rec.program.run()
        finally:
            if pool is not None:
                pool.busy.release()
        if failed is None:
            D.note_threads(T.get_threads())
            for check in rec.after:
                check()
            return
        D.forget_threads()  # it stopped part-way: OpenMP's count is whatever the last record set
        del self.programs[regime]  # never replayed again: the next run records anew, or runs the Python
        index, status = failed
        node = self.nodes[rec.owners[index]]
        raise KernelError(f"{node.where()}: oneDNN call failed in {node.op_type} node {node.name!r} "
                          f"(status {status})")

    def _record(self, regime: tuple) -> _Recorded | None:
        """This regime's program, kept when every call could say its records and nothing changed the regime
        meanwhile (another instance setting the thread count); a failure counts against RECORD_TRIES."""
        try:
            rec = _record(self.calls, self.varying, self.workspace)
        except Exception:  # a kernel's `native` that fails must not fail the run: its Python still can
            log.exception("recording %r failed; its kernels run their own Python", self)
            rec = None
        if rec is None or T.regime() != regime or not _kept(rec, self.calls, self.nodes):
            self.misses[regime] = self.misses.get(regime, 0) + 1
            return None
        self.programs[regime] = rec
        return rec

    def _python(self) -> None:
        """The calls as their kernels run them (errors naming the node, as the runtime's loop does)."""
        for k, (fn, ins, outs) in enumerate(self.calls):
            try:
                fn(ins, outs, self.workspace)
            except EngineError:
                raise
            except Exception as e:
                node = self.nodes[k]
                raise KernelError(f"{node.where()}: kernel of {node.op_type} node {node.name!r} failed: "
                                  f"{type(e).__name__}: {e}") from e

    def __repr__(self) -> str:
        return f"Segment({len(self.calls)} calls: {self.nodes[0].name} .. {self.nodes[-1].name})"


def _native_of(fn, ins, outs, workspace, varying: Varying) -> Native | None:
    """The call's Native: `native` for a call whose arrays stay; `native_rebound` for one with inputs `reads` or
    outputs `writes` new each run (a rebind for each, else None)."""
    reads, writes = varying
    if reads or writes:
        rebound = getattr(fn, "native_rebound", None)
        nat = None if rebound is None else rebound(ins, outs, workspace, reads, writes)
        if nat is None or ({j for j, _, _ in nat.rebinds}, {j for j, _, _ in nat.out_rebinds}) != (set(reads),
                                                                                                  set(writes)):
            return None
        return nat
    native = getattr(fn, "native", None)
    return None if native is None else native(ins, outs, workspace)


def _record(calls: list[tuple], varying: list[Varying], workspace) -> _Recorded | None:
    natives = [_native_of(fn, ins, outs, workspace, v) for (fn, ins, outs), v in zip(calls, varying, strict=True)]
    return None if any(n is None for n in natives) else _Recorded(natives, calls)  # type: ignore[arg-type]


def _kept(rec: _Recorded, calls: list[tuple], nodes: list) -> bool:
    """Whether a recording may be replayed: no address of an array new each run left where no rebind rewrites it
    (a kernel's defect, said in the log: its calls keep their Python)."""
    stray = rec.stray_addresses(calls)
    if stray:
        log.error("%s .. %s: a native program would keep one run's array (%s); these calls run their Python",
                  nodes[0].where(), nodes[-1].name, "; ".join(stray[:4]))
    return not stray


def fuse(calls: list[tuple], nodes: list, varying: list[Varying], workspace: np.ndarray | None) -> list[tuple] | None:
    """The binding's call list with each run of MIN_CALLS or more recordable calls as one Segment, and, parallel to
    it, the index of each entry's first original call; None when nothing was fused. Called after a run of these
    calls, so that every kernel's plan for these shapes exists and holds these arrays' pointers (and the caller's
    inputs and the fresh outputs are attached)."""
    regime = T.regime()
    out, index, run = [], [], []

    def flush() -> None:
        seg_calls = [calls[i] for i, _ in run]
        recorded = _Recorded([nat for _, nat in run], seg_calls) if len(run) >= MIN_CALLS else None
        if recorded is not None and _kept(recorded, seg_calls, [nodes[i] for i, _ in run]):
            # the regime changed while recording (another instance's thread count): recorded again on its first run
            seg = Segment(seg_calls, [nodes[i] for i, _ in run], workspace,
                          recorded if T.regime() == regime else None, regime, [varying[i] for i, _ in run])
            out.append((seg, [], []))
            index.append(run[0][0])
        else:
            for i, _ in run:
                out.append(calls[i])
                index.append(i)
        run.clear()

    for i, (fn, ins, outs) in enumerate(calls):
        nat = _native_of(fn, ins, outs, workspace, varying[i])
        if nat is None:
            flush()
            out.append(calls[i])
            index.append(i)
        else:
            run.append((i, nat))
    flush()
    if len(out) == len(calls):
        return None
    return [out, index]
