"""Params a handler did not read: refused unless they are known not to change what the op computes.

A handler reads the params it understands (ctx.p, ctx.has or node.params, all tracked by `TrackedParams`); a
param it never looked at would otherwise be dropped without a word, so after each handler the ones left are
checked against HARMLESS: params that restate what the weights or shapes already say, that only matter to
training, or that tell torch where and how to keep a tensor, not what it holds; some only at their default.
Anything else unread is refused, naming the param and its value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.formats.pnnx.lowering.context import Ctx


class TrackedParams(dict):
    """A node's params dict that remembers which keys were read (iterating reads them all)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self.read.add(key)
        return super().__contains__(key)

    def __iter__(self):
        self.read.update(super().keys())
        return super().__iter__()

    def items(self):
        self.read.update(super().keys())
        return super().items()

    def keys(self):
        self.read.update(super().keys())
        return super().keys()


def _any(value: Any) -> bool:
    return True


def _none(value: Any) -> bool:
    return value is None


HARMLESS: dict[str, Callable[[Any], bool]] = {
    # the weights' or outputs' shapes say the same
    **dict.fromkeys(("in_channels", "out_channels", "in_features", "out_features", "num_features", "num_channels",
                     "num_parameters", "num_embeddings", "embedding_dim", "kdim", "vdim", "kernel_size", "chunks",
                     "indices", "sections", "affine", "elementwise_affine"), _any),
    # a module's bias flag (the @bias attr is what counts, checked below); an absent functional operand
    "bias": lambda v: v is None or isinstance(v, bool),
    **dict.fromkeys(("weight", "running_mean", "running_var", "attn_mask", "dtype", "max_norm",
                     "output_size"), _none),
    # training only: gradients and dropout
    **dict.fromkeys(("sparse", "scale_grad_by_freq", "inplace"), _any),
    "dropout_p": lambda v: v in (0, 0.0),
    "training": lambda v: v is False,
    # where and how torch keeps the tensor, not what it holds
    **dict.fromkeys(("copy", "non_blocking", "memory_format", "layout", "device", "pin_memory", "requires_grad"),
                    _any),
    "return_indices": lambda v: v is False,
}


def check(ctx: Ctx, params: TrackedParams, attrs: set[str]) -> None:
    """Refuses the first unread param HARMLESS does not cover, and a module whose bias flag has no @bias
    (`attrs`: the node's attribute names before lowering; recurrent modules name theirs bias_ih_l0 ...)."""
    for key, value in dict.items(params):  # dict's own items: reading them here is not the handler's reading
        if key.startswith("$") or key in params.read:
            continue
        ok = HARMLESS.get(key)
        if ok is None or not ok(value):
            raise ctx.unsupported(f"param {key}={_shown(value)} that the lowering does not read")
    biases = [a for a in attrs if a == "bias" or a.endswith(("_bias", ".bias")) or a.startswith("bias_")]
    if ctx.type.startswith("nn.") and dict.get(params, "bias") is True and not biases:
        raise ctx.fail("says bias=True but has no bias weight")


def _shown(value) -> str:
    """A param's value for an error message; a long list (a million items) as its start and its length."""
    text = repr(value)
    if len(text) <= 80:
        return text
    return f"{text[:60]}... ({len(value)} items)" if isinstance(value, list) else f"{text[:60]}... ({len(text)} chars)"
