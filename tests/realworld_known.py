"""Which committed real-world fixtures (tests/fixtures/realworld) nnserve cannot run today, and why: read by their
test (tests/engine/test_realworld_models.py, strict xfails) and by the tests that run every fixture model (which
leave these out: a model refused at load has nothing to run)."""

from __future__ import annotations

from dataclasses import dataclass

import engine


@dataclass(frozen=True)
class Known:
    """Why a model does not run today: the exception type and a text its message contains."""

    error: type[Exception]
    contains: str

    def matches(self, exc: BaseException) -> bool:
        return isinstance(exc, self.error) and self.contains in str(exc)


def unsupported(*ops: str) -> Known:
    """Refused at load for exactly these pnnx op types (the engine lists every unsupported type, sorted)."""
    return Known(engine.UnsupportedOpError, "(" + ", ".join(f"pnnx:{op}" for op in ops) + ")")


# A static export (no inputshape2) of transformers' padding mask `mask[batch_idx, kv_idx]` has pnnx write the
# constant index tensors inline with all but their first dim's elements dropped (`expr=[[0],[0]]`): the indices
# are lost, and the engine refuses the model asking for a dynamic export (engine/formats/pnnx/lowering/indexing.py).
LOST_INDICES = Known(engine.UnsupportedOpError, "export with dynamic shapes (pnnx inputshape2=...)")

KNOWN: dict[str, Known] = {
    "bert": LOST_INDICES,
    "detr": LOST_INDICES,
    "gpt2": LOST_INDICES,
    "llama": LOST_INDICES,
    "t5_encoder": LOST_INDICES,
}

# pnnx drops wav2vec2's `[:, :, :-1]` after its even-kernel positional conv when the length is dynamic (its own
# generated Python fails the same way); the residual add then sees lengths T and T+1.
PNNX_BROKEN: dict[str, Known] = {
    "wav2vec2_dynamic": Known(engine.ShapeError, "cannot broadcast shapes"),
}


def refused(name: str) -> bool:
    return name in KNOWN or name in PNNX_BROKEN
