"""Benchmark-size real-world models for bench/realworld.py: published configurations (BERT-base width, DeiT-tiny,
Whisper-tiny's encoder, MobileViT-XXS, ...) with random weights, built from their library's classes (nothing is
downloaded), exported by torch.jit.trace + pnnx and by torch.onnx.export (the
ONNX twin ONNX Runtime runs), in the folder layout of the real-world suite (tools/make_realworld.py), once per
batch size with static shapes (both engines then see the same fixed shapes; a dynamic-batch pnnx export of the
Hugging Face models brings in shape ops, arange/gather/index, that the benchmark is not about):

    bench/realworld-full/<name>/model.pnnx.param, model.pnnx.bin, model.onnx, inputs.npz, expected.npz, meta.json
    bench/realworld-full/<name>/batch8/ (the same at batch 8)

The suite's own models are small (they are test fixtures); these are the sizes users run. Needs the `dev` extra
(torch, pnnx, onnx, onnxruntime, timm, transformers); the folder is git-ignored.

    python bench/realworld_models.py                # every model
    python bench/realworld_models.py bert_base deit_tiny --missing
"""

from __future__ import annotations

import argparse
import shutil
import sys
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "bench" / "realworld-full"
WORK_DIR = ROOT / ".fixture-work" / "realworld-full"
GENERATOR = "bench/realworld_models.py"
BATCHES = (1, 8)


@dataclass(frozen=True)
class Feed:
    """One input at batch 1: `float` (standard normal), `ids` (token ids below `high`) or `mask` (ones, the last
    eighth zero: padding, so the masked path is the one traced)."""
    name: str
    shape: tuple[int, ...]
    kind: str = "float"
    high: int = 0


@dataclass(frozen=True)
class BenchModel:
    name: str
    family: str
    arch: str
    build: Callable[[], object]  # an nn.Module taking the feeds positionally, returning a tensor or a tuple
    feeds: tuple[Feed, ...]


def _outputs(model, input_names: list[str], field: str):
    """A Hugging Face model called with keywords, returning one named output."""
    import torch

    class Picked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return self.model(**dict(zip(input_names, inputs, strict=True)))[field]
    return Picked().eval()


def bert_base():
    import transformers as hf

    cfg = hf.BertConfig(num_hidden_layers=4)  # BERT-base width (768, 12 heads, 3072); 4 of its 12 layers
    return _outputs(hf.BertModel(cfg, add_pooling_layer=False), ["input_ids"], "last_hidden_state")


def distilbert():
    import transformers as hf

    return _outputs(hf.DistilBertModel(hf.DistilBertConfig()), ["input_ids"], "last_hidden_state")


def whisper_tiny_encoder():
    import transformers as hf
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = hf.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                           num_mel_bins=80, max_source_positions=1500)
    return _outputs(WhisperEncoder(cfg), ["input_features"], "last_hidden_state")


def _timm(name: str, **kwargs):
    def build():
        import timm

        return timm.create_model(name, pretrained=False, **kwargs).eval()
    build.__name__ = name
    return build


def _torchvision(name: str):
    def build():
        import torchvision

        return getattr(torchvision.models, name)(weights=None).eval()
    build.__name__ = name
    return build


# Token ids alone (no padding mask): the mask's export through pnnx brings in Tensor.index, which the engine does
# not lower yet; the attention work is the same.
TEXT = (Feed("input_ids", (1, 128), "ids", 30000),)
MODELS = [
    BenchModel("bert_base", "text-encoder",
               "BERT-base width (768, 12 heads, FFN 3072), 4 layers, 128 tokens, no padding mask", bert_base, TEXT),
    BenchModel("distilbert", "text-encoder", "DistilBERT-base (768, 6 layers), 128 tokens, no padding mask",
               distilbert, TEXT),
    BenchModel("deit_tiny", "vit", "timm deit_tiny_patch16_224", _timm("deit_tiny_patch16_224"),
               (Feed("x", (1, 3, 224, 224)),)),
    BenchModel("whisper_tiny_encoder", "audio", "Whisper-tiny encoder (384, 4 layers, 6 heads), 80 x 3000 mel",
               whisper_tiny_encoder, (Feed("input_features", (1, 80, 3000)),)),
    BenchModel("mobilevit_xxs", "hybrid", "timm mobilevit_xxs, 256x256", _timm("mobilevit_xxs"),
               (Feed("x", (1, 3, 256, 256)),)),
    BenchModel("efficientformerv2_s0", "hybrid", "timm efficientformerv2_s0, 224x224",
               _timm("efficientformerv2_s0"), (Feed("x", (1, 3, 224, 224)),)),
    BenchModel("ghostnet", "cnn", "timm ghostnet_100, 224x224", _timm("ghostnet_100"),
               (Feed("x", (1, 3, 224, 224)),)),
    BenchModel("resnet18", "cnn", "timm resnet18, 224x224", _timm("resnet18"), (Feed("x", (1, 3, 224, 224)),)),
    # the rest of the "CNN five" (with resnet18): torchvision's classes
    BenchModel("mobilenet_v2", "cnn", "torchvision mobilenet_v2, 224x224", _torchvision("mobilenet_v2"),
               (Feed("x", (1, 3, 224, 224)),)),
    BenchModel("squeezenet", "cnn", "torchvision squeezenet1_1, 224x224", _torchvision("squeezenet1_1"),
               (Feed("x", (1, 3, 224, 224)),)),
    BenchModel("shufflenet_v2", "cnn", "torchvision shufflenet_v2_x1_0, 224x224",
               _torchvision("shufflenet_v2_x1_0"), (Feed("x", (1, 3, 224, 224)),)),
    BenchModel("efficientnet_b0", "cnn", "torchvision efficientnet_b0, 224x224", _torchvision("efficientnet_b0"),
               (Feed("x", (1, 3, 224, 224)),)),
]
BY_NAME = {m.name: m for m in MODELS}


def seed_for(name: str) -> int:
    return zlib.crc32(name.encode())


def build_torch(name: str):
    """The model with its random weights (the same bytes every time: seeded by name), in eval mode."""
    import torch

    spec = BY_NAME[name]
    torch.manual_seed(seed_for(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spec.build().eval()


def make_inputs(name: str, batch: int) -> list[np.ndarray]:
    """The feeds at `batch` (seeded by name and batch)."""
    rng = np.random.default_rng(seed_for(name) + batch)
    out = []
    for f in BY_NAME[name].feeds:
        shape = (batch, *f.shape[1:])
        if f.kind == "ids":
            out.append(rng.integers(0, f.high, shape, dtype=np.int64))
        elif f.kind == "mask":
            m = np.ones(shape, np.int64)
            m[:, shape[-1] - max(1, shape[-1] // 8):] = 0
            out.append(m)
        else:
            out.append(rng.standard_normal(shape, dtype=np.float32))
    return out


def _flatten(out) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    return [t for item in out for t in _flatten(item)]


def torch_forward(model, arrays: list[np.ndarray]) -> list[np.ndarray]:
    import torch

    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [t.numpy() for t in _flatten(model(*(torch.from_numpy(a) for a in arrays)))]


def export(name: str, out_root: Path) -> None:
    """Both batch sizes of one model: <name>/ at batch 1, <name>/batch<B>/ at the others."""
    model = build_torch(name)
    root = out_root / name
    if root.exists():
        shutil.rmtree(root)
    for batch in BATCHES:
        export_batch(name, model, batch, root if batch == 1 else root / f"batch{batch}")
    print(f"{name}: exported", flush=True)


def export_batch(name: str, model, batch: int, out: Path) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    from _fixture_io import export_pnnx, save_json, save_npz

    out.mkdir(parents=True)
    x = make_inputs(name, batch)
    tx = [torch.from_numpy(a) for a in x]
    torch.backends.mha.set_fastpath_enabled(False)  # pnnx cannot convert the fused fast-path aten calls
    work = WORK_DIR / f"{name}-{batch}"
    paths = export_pnnx(model, tx, work, "model")
    shutil.copyfile(paths["param"], out / "model.pnnx.param")
    shutil.copyfile(paths["bin"], out / "model.pnnx.bin")
    expected = torch_forward(model, x)
    names = [f"in{i}" for i in range(len(x))]
    out_names = [f"out{i}" for i in range(len(expected))]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(tx), str(out / "model.onnx"), dynamo=False, opset_version=17,
                          input_names=names, output_names=out_names)
    save_npz(out / "inputs.npz", dict(zip(names, x, strict=True)))
    save_npz(out / "expected.npz", dict(zip(out_names, expected, strict=True)))
    spec = BY_NAME[name]
    save_json(out / "meta.json", {
        "name": name, "family": spec.family, "architecture": spec.arch, "variant": "static", "batch": batch,
        "generator": GENERATOR, "seed": seed_for(name),
        "inputs": [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype), "torch_name": f.name}
                   for n, a, f in zip(names, x, spec.feeds, strict=True)],
        "outputs": [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype)}
                    for n, a in zip(out_names, expected, strict=True)],
        "versions": {lib: _version(lib) for lib in ("torch", "pnnx", "onnx", "timm", "transformers")},
    })
    shutil.rmtree(work, ignore_errors=True)


def _version(lib: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(lib)
    except PackageNotFoundError:
        return "not installed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"only these (default: all of {', '.join(BY_NAME)})")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default: bench/realworld-full)")
    parser.add_argument("--missing", action="store_true", help="skip models whose meta.json exists")
    args = parser.parse_args()
    for name in args.names or list(BY_NAME):
        if name not in BY_NAME:
            parser.error(f"unknown model {name!r}; known: {', '.join(BY_NAME)}")
        if args.missing and (args.out / name / "meta.json").exists():
            continue
        try:
            export(name, args.out)
        except Exception as exc:  # one model's exporter failure does not stop the others
            print(f"{name}: export failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
