"""Bounded fuzzing of both model readers in `make test` (the long coverage-guided run is `make fuzz`): byte-level
mutations of the committed fixtures — truncations, bit flips, huge and negative counts, sizes and dims written
over the binary headers and the text's numbers, deep nesting in the text — only ever end in a graph or in the
errors reader_contract.py allows, naming the file and a line or byte offset, within bounded time and memory
(tracemalloc's peak stays within a small multiple of the two files' size: nothing is allocated that the file
cannot justify). Failures the fuzzers found are replayed at the end as regression tests."""

from __future__ import annotations

import contextlib
import re
import resource
import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reader_contract import KINDS, check_model, seeds, write_model

from engine.errors import ModelFormatError
from engine.formats.registry import FORMATS

SEEDS = {kind: seeds(kind) for kind in KINDS}
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
SECONDS = 10.0  # per model; parsing a 40 KiB file takes milliseconds, this only catches a hang on a loaded machine
# Numbers a lying header or text would hold: limits of the integer types, their negatives, the edges near them.
HUGE = [0, 1, -1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 1 << 30, 1 << 40,
        -(1 << 31), 65536, 0xFFFF]


# Address space a model's reading may add to the worker's while it runs (RLIMIT_AS): past it an allocation is a
# MemoryError, which fails the example and shows its input, where the kernel's overcommit let a worker grow until the
# OOM killer took it (once, in a `make test` on a 24 GiB machine: 21 GiB resident, the example lost with the worker
# and xdist's scheduler left waiting for it).
HEADROOM = 2 << 30


@contextlib.contextmanager
def address_space_cap(headroom: int):
    """RLIMIT_AS at the process's current address space plus `headroom` for the block, where the platform says its
    address space (Linux's /proc); the old limit after it."""
    try:
        status = Path("/proc/self/status").read_text()
        used = int(re.search(r"^VmSize:\s+(\d+) kB", status, re.M).group(1)) * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, AttributeError, ValueError):
        yield
        return
    cap = used + headroom if hard == resource.RLIM_INFINITY else min(used + headroom, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap if soft == resource.RLIM_INFINITY else min(cap, soft), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def bounded_check(kind: str, folder: Path, graph: bytes, weights: bytes) -> str:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with address_space_cap(HEADROOM):
            outcome = check_model(kind, folder, graph, weights)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.perf_counter() - start < SECONDS
    # reading keeps the files' bytes; lowering may copy weights a few times (fused, transposed, packed)
    assert peak < 16 * (len(graph) + len(weights)) + (8 << 20), peak
    return outcome


def overwrite_int(data: bytearray, pos: int, value: int, width: int) -> None:
    fmt = {4: "<I", 8: "<Q"}[width]
    pos %= max(1, len(data) - width + 1)
    if len(data) >= width:
        struct.pack_into(fmt, data, pos, value & ((1 << (8 * width)) - 1))


def mutate_binary(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for op, pos, arg in edits:
        if not buf:
            break
        if op == "flip":
            buf[pos % len(buf)] ^= 1 << (arg % 8)
        elif op == "int32":
            overwrite_int(buf, pos, HUGE[arg % len(HUGE)], 4)
        elif op == "int64":
            overwrite_int(buf, pos, HUGE[arg % len(HUGE)], 8)
        elif op == "cut":
            del buf[pos % (len(buf) + 1):]
        elif op == "insert":
            buf[pos % len(buf):pos % len(buf)] = bytes([arg % 256]) * (1 + arg % 64)
    return bytes(buf)


NUMBER = re.compile(rb"-?\d+")


def mutate_text(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    buf = data
    for op, pos, arg in edits:
        if op == "number":  # a number of the text (a count, a dim, a shape) becomes a huge or negative one
            numbers = list(NUMBER.finditer(buf))
            if numbers:
                m = numbers[pos % len(numbers)]
                buf = buf[:m.start()] + str(HUGE[arg % len(HUGE)]).encode() + buf[m.end():]
        elif op == "nest":  # deep nesting where lists, annotations and expressions open
            opens = [i for i, b in enumerate(buf) if b in b"([,=" or i == 0]
            at = opens[pos % len(opens)] + 1 if opens else 0
            depth = 10 ** (1 + arg % 5)
            brackets = (b"(", b")") if arg % 2 else (b"[", b"]")
            buf = buf[:at] + brackets[0] * depth + b"1" + brackets[1] * depth + buf[at:]
        elif op == "line":  # a line duplicated or dropped
            lines = buf.split(b"\n")
            i = pos % len(lines)
            lines[i:i + 1] = [lines[i]] * (2 if arg % 2 else 0)
            buf = b"\n".join(lines)
        else:
            buf = mutate_binary(buf, [(op, pos, arg)])
    return buf


BINARY_EDITS = st.lists(st.tuples(st.sampled_from(["flip", "int32", "int64", "cut", "insert"]),
                                  st.integers(0, 1 << 20), st.integers(0, 1 << 16)), min_size=1, max_size=4)
TEXT_EDITS = st.lists(st.tuples(st.sampled_from(["number", "nest", "line", "flip", "cut", "insert"]),
                                st.integers(0, 1 << 20), st.integers(0, 1 << 16)), min_size=1, max_size=4)


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(data=st.data())
def test_mutated_weights_file(tmp_path, kind, data):
    name, graph, weights = data.draw(st.sampled_from(SEEDS[kind]), label="seed")
    bounded_check(kind, tmp_path, graph, mutate_binary(weights, data.draw(BINARY_EDITS, label="edits")))


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(data=st.data())
def test_mutated_graph_file(tmp_path, kind, data):
    name, graph, weights = data.draw(st.sampled_from(SEEDS[kind]), label="seed")
    bounded_check(kind, tmp_path, mutate_text(graph, data.draw(TEXT_EDITS, label="edits")), weights)


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(data=st.data())
def test_both_files_mutated(tmp_path, kind, data):
    name, graph, weights = data.draw(st.sampled_from(SEEDS[kind]), label="seed")
    bounded_check(kind, tmp_path, mutate_text(graph, data.draw(TEXT_EDITS, label="graph edits")),
                  mutate_binary(weights, data.draw(BINARY_EDITS, label="weights edits")))


@pytest.mark.parametrize("kind", KINDS)
def test_every_seed_reads_and_lowers(tmp_path, kind):
    assert SEEDS[kind] and all(check_model(kind, tmp_path, g, w) == "ok" for _, g, w in SEEDS[kind])


# -- regressions: inputs the fuzzers found, each one a model that broke the contract before its fix ------------
REGRESSIONS = Path(__file__).resolve().parent / "regressions"
SEPARATOR = b"\n#--weights--#\n"  # as in fuzz_readers.py


@pytest.mark.parametrize("path", sorted(REGRESSIONS.glob("*/*")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fuzzer_findings(tmp_path, path):
    graph, _, weights = path.read_bytes().partition(SEPARATOR)
    assert bounded_check(path.parent.name, tmp_path, graph, weights) != "ok"


def test_a_huge_declared_input_allocates_nothing(tmp_path):
    """Found by the fuzzer: a TNN input declared with batch 2**31-1 made PRelu's shape check allocate an array of the
    input's shape (2.2 TiB, which only overcommit let pass). A shape from a file is checked, never allocated."""
    line = b'"in0 4 1 8 12 12 0 ,"'
    graph, weights = next((g, w) for _, g, w in SEEDS["tnn"] if line in g and b"PReLU" in g)
    bounded_check("tnn", tmp_path, graph.replace(line, b'"in0 4 2147483647 8 12 12 0 ,"'), weights)


@pytest.mark.parametrize("size", ["65536", "1073741824"])
def test_a_huge_full_is_not_computed_at_load(tmp_path, size):
    """Found by the fuzzer: a pnnx aten::new_full whose size expression held a huge number was evaluated at load as
    a value known before running (shape arithmetic), allocating the whole tensor. Only small values are."""
    graph, weights = next((g, w) for name, g, w in SEEDS["pnnx"] if b"aten::new_full" in g)
    mutated = graph.replace(b"expr=[mul(size(@0,2),size(@0,3)),1]", b"expr=[mul(size(@0,2),size(@0,3))," +
                            size.encode() + b"]")
    assert mutated != graph
    bounded_check("pnnx", tmp_path, mutated, weights)


@pytest.mark.parametrize("path,message", [
    ("tnn/inner_product_axis_huge_negative", r"axis -2147483648 is not one of the input's dims \(2\)"),
    ("pnnx/split_by_one_of_a_huge_dim", r"cuts a dim of 2147483647 into 2147483647 pieces, not into the node's 3"),
])
def test_sizes_from_a_file_are_checked_before_a_list_of_them_is_made(tmp_path, path, message):
    """Found by test_both_files_mutated (a worker the OOM killer took at 21 GiB) and in the hunt for it: a TNN
    InnerProduct whose axis became -2**31 built a Reshape list of 2**31 ones; a pnnx torch.split by 1 of a dim the
    file says is 2**31 - 1 a list of as many sizes (17 GiB each). Both are refused by their checks, before any
    such list (under the fuzz tests' address-space cap the allocation failed, and lowering reported that instead)."""
    kind = path.split("/")[0]
    graph, _, weights = (REGRESSIONS / path).read_bytes().partition(SEPARATOR)
    fmt = FORMATS[kind]
    with pytest.raises(ModelFormatError, match=message):
        fmt.lower(fmt.read(write_model(kind, tmp_path, graph, weights)))
