"""What Triton's extensions add to one inference request, around the model's run (DataPlane.infer): tensors in
shared memory (read before, written after), classification of outputs, and the response cache's key.

Sizes are checked before anything is allocated: a shared-memory window was checked against its region when the
request leased it, and the bytes read for one request's inputs count against the same limit as a body would
(--http-max-input-size, --grpc-max-message-size)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from server.classification import class_count, top_classes
from server.errors import InvalidArgumentError, PayloadTooLargeError
from server.inference import InferRequest, OutputTensor, ShmRef, shm_ref
from server.raw_tensors import tensor_from_raw, tensor_to_raw
from server.shared_memory import Lease, SystemSharedMemory

# Reads and writes of at least this many bytes run in a worker thread: the event loop keeps serving meanwhile.
THREAD_BYTES = 1 << 20
# Scores from which classification runs in a worker thread (sorting them and formatting k strings take ~1 s per
# million on the loop; a few thousand, well under a millisecond).
CLASSIFY_THREAD_ELEMENTS = 4096


@dataclass
class OutputOptions:
    """How one requested output is answered: into a shared-memory window, or as its top classes, or as it is."""

    shm: ShmRef | None = None
    classes: int = 0


def output_options(req: InferRequest) -> dict[str, OutputOptions]:
    """The requested outputs' extension parameters, checked (Triton's words for the combinations it refuses)."""
    options = {}
    for out in req.outputs:
        params = out.parameters
        ref = shm_ref(params, out.name)
        classes = class_count(params)
        if ref is not None and classes:
            raise InvalidArgumentError("Output can't set both 'shared_memory_region' and 'classification'")
        if ref is not None and params.get("binary_data") is True:
            raise InvalidArgumentError("Output can't set both 'shared_memory_region' and 'binary_data'")
        if ref is not None or classes:
            options[out.name] = OutputOptions(ref, classes)
    return options


def lease_inputs(shm: SystemSharedMemory, req: InferRequest, leases: list[Lease]) -> dict[str, Lease]:
    """A lease on each shared-memory input's window (appended to `leases`, which the caller releases)."""
    found = {}
    for inp in req.inputs:
        if inp.shm is not None:
            lease = shm.lease(inp.shm)
            leases.append(lease)
            found[inp.name] = lease
    return found


def lease_outputs(shm: SystemSharedMemory, options: dict[str, OutputOptions], leases: list[Lease]) -> dict[str, Lease]:
    found = {}
    for name, opt in options.items():
        if opt.shm is not None:
            lease = shm.lease(opt.shm)
            leases.append(lease)
            found[name] = lease
    return found


async def read_inputs(req: InferRequest, leases: dict[str, Lease], limit: int | None) -> None:
    """Each shared-memory input read into an array of its own (the region's bytes are the client's to change)."""
    if not leases:
        return
    total = sum(lease.byte_size for lease in leases.values())
    if limit is not None and total > limit:
        raise PayloadTooLargeError(f"the request's shared-memory inputs hold {total} bytes, more than the {limit} "
                                   "a request may carry (--http-max-input-size / --grpc-max-message-size)")
    for inp in req.inputs:
        lease = leases.get(inp.name)
        if lease is None:
            continue
        raw = await asyncio.to_thread(lease.read) if lease.byte_size >= THREAD_BYTES else lease.read()
        inp.data = tensor_from_raw(raw, inp.datatype, inp.shape, inp.name)


async def classify(outputs: list[OutputTensor], options: dict[str, OutputOptions], batching: bool,
                   labels: dict[str, list[str]]) -> list[OutputTensor]:
    """Outputs requested with `classification: k` replaced by their top k classes (BYTES). A large tensor is
    ranked and formatted in a worker thread: a million scores take seconds the event loop must not stall for."""
    result = []
    for out in outputs:
        opt = options.get(out.name)
        if opt is not None and opt.classes:
            args = (out.data, out.datatype, opt.classes, batching, labels.get(out.name, []))
            if out.data.size >= CLASSIFY_THREAD_ELEMENTS:
                classes = await asyncio.to_thread(top_classes, *args)
            else:
                classes = top_classes(*args)
            out = OutputTensor(out.name, "BYTES", list(classes.shape), classes)
        result.append(out)
    return result


async def write_outputs(outputs: list[OutputTensor], leases: dict[str, Lease]) -> None:
    """Outputs requested in shared memory written to their windows; the response then only describes them."""
    for out in outputs:
        lease = leases.get(out.name)
        if lease is None:
            continue
        raw = tensor_to_raw(out.data)
        if len(raw) >= THREAD_BYTES:
            await asyncio.to_thread(lease.write, raw, out.name)
        else:
            lease.write(raw, out.name)
        out.in_shared_memory = True
