"""Regenerate the PNNX test fixtures in tests/fixtures/pnnx/ from PyTorch models (run with the `dev` extra).

Every fixture: build a small but real architecture, seed everything, randomise BatchNorm statistics and norm
affine params (so BN folding is really exercised), trace, convert with the pnnx executable (default optlevel) in
a scratch dir under .fixture-work/, then keep model.pnnx.param/.bin, inputs.npz (in0..), expected.npz (out0..,
PyTorch eval outputs) and meta.json. The output is deterministic: re-running changes no bytes.

    python tools/make_fixtures.py                 # all fixtures (+ the bundled UltraFace PNNX model)
    python tools/make_fixtures.py resnet unet     # only these
    python tools/make_fixtures.py --bench         # full-size random-weight models into bench/models/
"""

from __future__ import annotations

import argparse
import shutil
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _fixture_blocks as blocks  # noqa: E402
import _fixture_nets as nets  # noqa: E402
import _fixture_op_nets as misc  # noqa: E402
from _fixture_io import (  # noqa: E402
    as_numpy,
    export_pnnx,
    flatten_outputs,
    max_abs_diff,
    op_counts,
    run_pnnx_python,
    save_json,
    save_npz,
)
from _fixture_notes import NOTES  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "tests" / "fixtures" / "pnnx"
WORK_DIR = REPO / ".fixture-work"


@dataclass
class In:
    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int = 0  # exclusive upper bound of random integer ids


@dataclass
class Spec:
    name: str
    build: Callable[[], nn.Module]
    arch: str
    inputs: list[In]
    inputs2: list[In] | None = None  # pnnx inputshape2: dims that differ become dynamic
    cases: list[list[tuple[int, ...]]] = field(default_factory=list)
    # torch's eval fast path traces nn.TransformerEncoderLayer to one aten::_transformer_encoder_layer_fwd
    # call that pnnx leaves unconverted; tracing without it gives pnnx the ordinary ops.
    mha_fastpath: bool = True


IMG64 = [In((1, 3, 64, 64))]
SPECS = [
    Spec("resnet", nets.resnet, "ResNet-18 layout (torchvision BasicBlock, [2,2,2,2]) at widths 8-64", IMG64),
    Spec("resnet_wide", nets.WideResNet, "BasicBlocks at 96-128 channels: the widths the Winograd path takes",
         [In((1, 3, 32, 32))]),
    Spec("mobilenet_v2", nets.mobilenet_v2, "torchvision MobileNetV2 width_mult=0.25, repeats cut", IMG64),
    Spec("mobilenet_v3", nets.mobilenet_v3, "torchvision MobileNetV3-Small width_mult=0.5 reduced_tail", IMG64),
    Spec("squeezenet", nets.squeezenet, "SqueezeNet 1.1 layout (torchvision Fire) at 1/4 width", IMG64),
    Spec("shufflenet_v2", nets.shufflenet_v2, "torchvision ShuffleNetV2 stages [2,2,2] widths 12-128", IMG64),
    Spec("densenet", nets.densenet, "torchvision DenseNet growth 8, blocks (2,2,2,2), init 16", IMG64),
    Spec("googlenet", nets.googlenet, "GoogLeNet stem + torchvision Inception blocks 3a/3b/4a at 1/8 width", IMG64),
    Spec("efficientnet", nets.efficientnet_b0, "torchvision EfficientNet-B0 config width 0.25 depth 0.34", IMG64),
    Spec("regnet", nets.regnet_y, "torchvision RegNet (Y-style, SE 0.25) depth 5 w0 16 group width 8", IMG64),
    Spec("convnext", nets.convnext_tiny, "torchvision ConvNeXt CNBlockConfig 16/32/64 x 1/1/2", IMG64),
    Spec("unet", blocks.UNet, "3-level UNet: ConvTranspose2d, Upsample/interpolate, cat skips", [In((1, 3, 32, 48))]),
    Spec(
        "vit",
        blocks.TinyViT,
        "ViT: patch conv, class token expand+cat, nn.TransformerEncoder",
        [In((2, 3, 32, 32))],
        mha_fastpath=False,
    ),
    Spec("yolo", blocks.TinyYolo, "YOLOv5-style: Focus slices, C3, SPPF, FPN, decode head", [In((1, 3, 64, 64))]),
    Spec("transformer", blocks.TransformerEncoder, "encoder: MHA, manual attention, SDPA blocks", [In((1, 12, 16))]),
    Spec(
        "dynamic",
        blocks.DynamicSeg,
        "dynamic batch/H/W seg net: interpolate to a tensor's size, reshape with -1",
        [In((2, 3, 64, 64))],
        inputs2=[In((1, 3, 40, 48))],
        cases=[[(2, 3, 64, 64)], [(1, 3, 64, 64)], [(1, 3, 32, 48)], [(2, 3, 40, 56)], [(1, 3, 16, 24)]],
    ),
    Spec(
        "two_inputs",
        blocks.TwoInputs,
        "f32 image + i64 token ids (nn.Embedding)",
        [In((1, 4, 8, 8)), In((1, 6), "int64", 50)],
    ),
    Spec(
        "misc_activations",
        misc.MiscActivations,
        "activations, elementwise math, softmax, Attribute",
        [In((1, 8, 12, 12))],
    ),
    Spec(
        "misc_norm_pool",
        misc.MiscNormPool,
        "GroupNorm/InstanceNorm/BN/LayerNorm, pooling variants",
        [In((1, 8, 14, 14))],
    ),
    Spec("misc_conv_resize", misc.MiscConvResize, "conv padding modes, F.pad, deconv, resize", [In((1, 8, 16, 12))]),
    Spec("misc_shapes", misc.MiscShapes, "shape ops, reductions, channel shuffle, nested tuples", [In((2, 8, 6, 6))]),
    Spec("misc_forms", misc.MiscModuleForms, "module vs functional spellings of the same ops", [In((1, 8, 16, 20))]),
]


def seed_for(name: str) -> int:
    return zlib.crc32(name.encode())


def randomize_norms(model: nn.Module, gen: torch.Generator) -> None:
    """Non-trivial BN statistics and norm affine params: identity BN would hide folding mistakes."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.track_running_stats:
                n = mod.num_features
                mod.running_mean.copy_(torch.randn(n, generator=gen) * 0.2)
                mod.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            weight, bias = getattr(mod, "weight", None), getattr(mod, "bias", None)
            is_norm = isinstance(mod, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm))
            if is_norm and weight is not None:
                weight.copy_(torch.rand(weight.shape, generator=gen) + 0.5)
                if bias is not None:
                    bias.copy_(torch.randn(bias.shape, generator=gen) * 0.2)
        for name, param in model.named_parameters():
            # ConvNeXt starts layer_scale at 1e-6, which would make every block an identity.
            if name.endswith("layer_scale"):
                param.copy_(torch.rand(param.shape, generator=gen) * 0.7 + 0.3)


def make_inputs(specs: list[In], shapes: list[tuple[int, ...]], gen: torch.Generator) -> list[torch.Tensor]:
    tensors = []
    for spec, shape in zip(specs, shapes, strict=True):
        if spec.dtype == "int64":
            tensors.append(torch.randint(0, spec.high, shape, generator=gen, dtype=torch.int64))
        else:
            tensors.append(torch.randn(shape, generator=gen))
    return tensors


def build(spec: Spec) -> tuple[nn.Module, torch.Generator]:
    torch.manual_seed(seed_for(spec.name))
    gen = torch.Generator().manual_seed(seed_for(spec.name))
    model = spec.build()
    randomize_norms(model, gen)
    return model.eval(), gen


def run(model: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return flatten_outputs(model(*inputs))


def io_entries(prefix: str, tensors: list[torch.Tensor]) -> list[dict]:
    return [
        {"name": f"{prefix}{i}", "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        for i, t in enumerate(tensors)
    ]


def named(prefix: str, tensors: list[torch.Tensor]) -> dict:
    return {prefix + k: v for k, v in as_numpy(tensors).items()}


def make_fixture(spec: Spec) -> Path:
    model, gen = build(spec)
    inputs = make_inputs(spec.inputs, [i.shape for i in spec.inputs], gen)
    outputs = run(model, inputs)
    inputs2 = None
    if spec.inputs2 is not None:
        inputs2 = make_inputs(spec.inputs2, [i.shape for i in spec.inputs2], gen)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(spec.mha_fastpath)
    try:
        paths = export_pnnx(model, inputs, WORK_DIR / spec.name, spec.name, inputs2)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    out = OUT_DIR / spec.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copyfile(paths["param"], out / "model.pnnx.param")
    shutil.copyfile(paths["bin"], out / "model.pnnx.bin")
    save_npz(out / "inputs.npz", named("in", inputs))
    save_npz(out / "expected.npz", named("out", outputs))

    meta: dict = {
        "architecture": spec.arch,
        "generator": "tools/make_fixtures.py",
        "torch_version": torch.__version__.split("+")[0],
        "pnnx_version": _pnnx_version(),
        "pnnx_command": "pnnx model.pt inputshape=... (default optlevel)" + (" inputshape2=..." if inputs2 else ""),
        "seed": seed_for(spec.name),
        "inputs": io_entries("in", inputs),
        "outputs": io_entries("out", outputs),
        "pnnx_python_max_abs_diff": pnnx_self_check(paths["py"], inputs, outputs),
        "pnnx_ops": op_counts(paths["param"]),
        "notes": NOTES.get(spec.name, []),
    }
    if inputs2 is not None:
        meta["inputshape2"] = [list(t.shape) for t in inputs2]
        meta["max_shapes"] = {f"in{i}": list(t.shape) for i, t in enumerate(inputs)}
        meta["cases"] = write_cases(out, spec, model, gen)
    save_json(out / "meta.json", meta)
    return out


def pnnx_self_check(py_path: Path, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float | str:
    """How far pnnx's own Python rendering of the converted graph is from torch (0 when pnnx is faithful)."""
    try:
        return max_abs_diff(run_pnnx_python(py_path, inputs), outputs)
    except SyntaxError as exc:  # pnnx sometimes writes module names that are not Python identifiers
        return f"generated _pnnx.py does not compile: {exc.msg} ({exc.text.strip() if exc.text else ''})"


def write_cases(out: Path, spec: Spec, model: nn.Module, gen: torch.Generator) -> list[list[list[int]]]:
    """Extra shapes of a dynamic model: inputs_<k>.npz / expected_<k>.npz, in spec.cases order."""
    for k, shapes in enumerate(spec.cases):
        case_in = make_inputs(spec.inputs, shapes, gen)
        save_npz(out / f"inputs_{k}.npz", named("in", case_in))
        save_npz(out / f"expected_{k}.npz", named("out", run(model, case_in)))
    return [[list(s) for s in shapes] for shapes in spec.cases]


def _pnnx_version() -> str:
    from importlib.metadata import version

    return version("pnnx")


def print_table(dirs: list[Path]) -> None:
    total = 0
    print(f"{'fixture':<20} {'files':>5} {'bytes':>10}  ops")
    for d in dirs:
        size = sum(f.stat().st_size for f in d.iterdir())
        total += size
        n_ops = sum(1 for line in (d / "model.pnnx.param").read_text().splitlines()[2:] if line.strip())
        print(f"{d.name:<20} {len(list(d.iterdir())):>5} {size:>10}  {n_ops}")
    print(f"{'total':<20} {'':>5} {total:>10}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="only these fixtures / bench models (default: all)")
    parser.add_argument("--bench", action="store_true", help="write full-size models to bench/models/ instead")
    parser.add_argument("--keep-work", action="store_true", help="keep .fixture-work/ (pnnx logs, .pt, _pnnx.py)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # bit-stable expected outputs across machines and runs
    if args.bench:
        from _fixture_bench import make_bench_models

        make_bench_models(REPO / "bench" / "models", WORK_DIR / "bench", randomize_norms, args.names or None)
        if not args.keep_work:
            shutil.rmtree(WORK_DIR, ignore_errors=True)
        return 0
    unknown = set(args.names) - {s.name for s in SPECS} - {"ultraface"}
    if unknown:
        parser.error(f"unknown fixtures: {sorted(unknown)}")
    written = []
    for spec in SPECS:
        if not args.names or spec.name in args.names:
            print(f"== {spec.name}", flush=True)
            written.append(make_fixture(spec))
    print_table(written)
    if not args.names or "ultraface" in args.names:
        from make_ultraface_pnnx import main as make_ultraface

        make_ultraface([])
    if not args.keep_work:
        shutil.rmtree(WORK_DIR, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
