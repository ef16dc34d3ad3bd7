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


KNOWN: dict[str, Known] = {
    "albert_dynamic": unsupported("Tensor.index"),
    "bert": unsupported("Tensor.index"),
    "bert_dynamic": unsupported("Tensor.index"),
    "clip_text_dynamic": unsupported("Tensor.index"),
    "detr": unsupported("Tensor.index"),
    "distilbert_dynamic": unsupported("Tensor.index"),
    "gpt2": unsupported("Tensor.index"),
    "gpt2_dynamic": unsupported("Tensor.index"),
    "llama": unsupported("Tensor.index"),
    "llama_dynamic": unsupported("Tensor.index"),
    "roberta_dynamic": unsupported("Tensor.index"),
    "t5_encoder": unsupported("Tensor.index"),
    "t5_encoder_dynamic": unsupported("Tensor.index"),
}

# pnnx drops wav2vec2's `[:, :, :-1]` after its even-kernel positional conv when the length is dynamic (its own
# generated Python fails the same way); the residual add then sees lengths T and T+1.
PNNX_BROKEN: dict[str, Known] = {
    "wav2vec2_dynamic": Known(engine.ShapeError, "cannot broadcast shapes"),
}


def refused(name: str) -> bool:
    return name in KNOWN or name in PNNX_BROKEN
