"""Writes a pnnx model from its parts: the `.pnnx.param` text as given and the weights as the stored zip beside it.
For tests and tools that build small models; `attribute_specs` lists the weights a param text needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.formats.pnnx.param_values import annotation_dtype, parse_annotation
from engine.formats.pnnx.reader import bin_path_for
from engine.formats.pnnx.zip_archive import write_stored_zip


def attribute_specs(text: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The zip entries a .pnnx.param text needs: `<opname>.<attr>` -> (shape, dtype). For tools and tests."""
    specs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for line in text.splitlines()[2:]:
        tok = line.split()
        if len(tok) < 4:
            continue
        for item in tok[4:]:
            key, eq, value = item.partition("=")
            if eq and key.startswith("@") and len(key) > 1:
                shape, code = parse_annotation(value, allow_unknown=False)
                dtype = annotation_dtype(code)
                if dtype is not None and code != "bf16":
                    specs[f"{tok[1]}.{key[1:]}"] = (shape, dtype)
    return specs


def write_pnnx(param_path: str | Path, text: str, weights: dict[str, np.ndarray]) -> Path:
    """Writes `text` to `param_path` and `weights` (zip entry name -> array) to the .pnnx.bin beside it."""
    param_path = Path(param_path)
    param_path.write_text(text)
    write_stored_zip(bin_path_for(param_path), weights)
    return param_path
