"""Build the real-world model suite (run with the `dev` extra: torch, pnnx, onnx, onnxruntime, timm, transformers,
ultralytics). Every model is built from its library's own classes and configs with random weights (nothing is
downloaded), traced with torch.jit.trace and converted by the pnnx executable as pnnx's README says, and exported
again with torch.onnx.export as an ONNX twin for benchmarks (checked on ONNX Runtime).

Models with a dynamic-shape variant are exported a second time as <name>_dynamic: at their max shapes with
`inputshape2` at a smaller one, plus torch outputs for several shapes run on one instance.

    python tools/make_realworld.py                     # every model into bench/realworld/ (git-ignored)
    python tools/make_realworld.py bert swin           # only these (and their _dynamic variants)
    python tools/make_realworld.py --missing           # only models without a meta.json yet
    python tools/make_realworld.py --fixtures          # then copy the small ones to tests/fixtures/realworld/

Each folder: model.pnnx.param/.bin, model.onnx, inputs.npz (in0..), expected.npz (out0..: torch eval outputs,
tuple outputs flattened depth-first), for dynamic variants inputs_<k>.npz/expected_<k>.npz per case, and
meta.json. A model that pnnx or the ONNX exporter cannot export still gets its meta.json, with the error, so the
report (tools/check_realworld.py) records it. Re-running writes identical bytes.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import time
import warnings
import zlib
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _realworld_hf  # noqa: E402
import _realworld_vision  # noqa: E402
import _realworld_yolo  # noqa: E402
from _fixture_io import (  # noqa: E402
    flatten_outputs,
    max_abs_diff,
    op_counts,
    pnnx_executable,
    run_pnnx_python,
    save_json,
    save_npz,
    shape_arg,
)
from _realworld_spec import Shapes, Spec, make_feed  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "bench" / "realworld"
FIXTURE_DIR = REPO / "tests" / "fixtures" / "realworld"
WORK_DIR = REPO / ".fixture-work" / "realworld"
SPECS: list[Spec] = _realworld_yolo.SPECS + _realworld_vision.SPECS + _realworld_hf.SPECS
ONNX_OPSET = 17
PNNX_TIMEOUT_S = 1800
# Committed to tests/fixtures/realworld/ (without their ONNX twins) so that `make test` covers every architecture
# of the suite but the ones that cannot be made small (EfficientFormer's fixed 224x224 attention grid, the
# 8-head attention of EfficientFormerV2): one model per architecture (ConvNeXt-V2 for ConvNeXt, ViT for DeiT,
# EfficientViT-B for -M), both exports of the text and audio models where the static one shows something the
# dynamic one does not. Each is at most FIXTURE_MAX_BYTES; the fixture tree's budget is about 20 MB in all.
FIXTURES = (
    "yolo11_detect",
    "resnet50d", "regnety", "efficientnet_b0", "mobilenetv3", "ghostnetv2", "repvgg", "cspdarknet", "convnextv2",
    "vit", "swin", "beit",
    "mobilevit", "efficientvit_b", "levit", "poolformer", "fastvit",
    "bert", "bert_dynamic", "distilbert_dynamic", "roberta_dynamic", "albert_dynamic", "gpt2", "gpt2_dynamic",
    "llama", "llama_dynamic", "t5_encoder", "t5_encoder_dynamic", "clip_text_dynamic", "clip_vision",
    "whisper_encoder_dynamic", "wav2vec2", "wav2vec2_dynamic",
    "segformer", "detr",
)
FIXTURE_MAX_BYTES = 420 * 1024
FIXTURE_FILES = ("model.pnnx.param", "model.pnnx.bin", "meta.json")


def seed_for(name: str) -> int:
    return zlib.crc32(name.encode())


def randomize(model: nn.Module, gen: torch.Generator) -> None:
    """Random BatchNorm statistics, and random values for every parameter a library initialises to a constant:
    zero biases, unit norm weights and 1e-5 layer scales would hide a wrong bias, affine or residual branch.
    Weights drawn with a transformer's small std (0.02) are drawn again at unit scale (std 1/sqrt(fan_in)): at
    0.02 attention is nearly uniform, and a padding mask that is wrong moves BERT's outputs by less than 1e-3."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.track_running_stats:
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=gen) * 0.2)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=gen) + 0.5)
        for _, param in sorted(model.named_parameters()):
            flat = param.detach().reshape(-1)
            if flat.numel() > 1 and param.dim() >= 2 and float(flat.std()) < 0.05:
                # (out, in, ...) weights: fan-in is all but the first dim; (1, tokens, dim) embeddings: the last.
                fan_in = param.shape[-1] if param.shape[0] == 1 else param[0].numel()
                param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(fan_in))
                continue
            if flat.numel() == 0 or not bool((flat == flat[0]).all()):
                continue
            value = float(flat[0])
            if value == 0.0:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
            elif abs(value) < 1e-3:  # layer scale: a block that adds 1e-5 of itself is an identity
                param.copy_(torch.rand(param.shape, generator=gen) * 0.7 + 0.3)
            else:
                param.copy_(value * (torch.rand(param.shape, generator=gen) + 0.5))


def forward(model: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flatten_outputs(model(*inputs))


def pnnx_export(model: nn.Module, inputs: list[torch.Tensor], work: Path, inputs2: Shapes | None,
                dtypes: list[torch.dtype]) -> tuple[dict[str, Path], str]:
    """Trace and convert; returns the written paths and pnnx's log. Raises RuntimeError with pnnx's last lines."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trace warnings about python values baked in: pnnx's inputshape2 handles it
        traced = torch.jit.trace(model, tuple(inputs), check_trace=False)
    traced.save(str(work / "model.pt"))
    args = [pnnx_executable(), "model.pt", "inputshape=" + shape_arg(inputs)]
    if inputs2 is not None:
        args.append("inputshape2=" + shape_arg([torch.empty(s, dtype=d) for s, d in zip(inputs2, dtypes, strict=True)]))
    proc = subprocess.run(args, cwd=work, capture_output=True, text=True, timeout=PNNX_TIMEOUT_S)
    log = proc.stdout + proc.stderr
    (work / "pnnx.log").write_text(log)
    if proc.returncode != 0 or not (work / "model.pnnx.param").exists():
        tail = " | ".join(line for line in log.splitlines()[-3:] if line.strip())
        raise RuntimeError(f"pnnx exit {proc.returncode}: {tail}")
    return {"param": work / "model.pnnx.param", "bin": work / "model.pnnx.bin", "py": work / "model_pnnx.py"}, log


def onnx_export(model: nn.Module, inputs: list[torch.Tensor], outputs: list[torch.Tensor], path: Path,
                dynamic_dims: dict[str, list[int]]) -> dict:
    """The ONNX twin (TorchScript exporter, opset ONNX_OPSET), checked on ONNX Runtime against torch."""
    import onnxruntime as ort

    names = [f"in{i}" for i in range(len(inputs))]
    out_names = [f"out{i}" for i in range(len(outputs))]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, opset_version=ONNX_OPSET,
                          input_names=names, output_names=out_names,
                          dynamic_axes={k: dict.fromkeys(v, f"{k}_d") for k, v in dynamic_dims.items()} or None)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = [torch.from_numpy(g) for g in sess.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})]
    return {"opset": ONNX_OPSET, "onnxruntime_max_abs_diff": max_abs_diff(got, outputs),
            "onnxruntime_max_rel_diff": max_rel_diff(got, outputs)}


def max_rel_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Max abs difference over each output's largest magnitude, the measure the suite's report uses."""
    scales = [max(float(w.float().abs().max()) if w.numel() else 0.0, 1e-6) for w in want]
    if len(got) != len(want):
        return float("inf")
    return max((max_abs_diff([g], [w]) / s for g, w, s in zip(got, want, scales, strict=True)), default=0.0)


def io_entries(prefix: str, tensors: list[torch.Tensor], torch_names: list[str] | None = None) -> list[dict]:
    entries = []
    for i, t in enumerate(tensors):
        entry = {"name": f"{prefix}{i}", "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        if torch_names:
            entry["torch_name"] = torch_names[i]
        entries.append(entry)
    return entries


def named(prefix: str, tensors: list[torch.Tensor]) -> dict[str, np.ndarray]:
    out = {}
    for i, t in enumerate(tensors):
        arr = t.detach().cpu().numpy()
        out[f"{prefix}{i}"] = arr.astype(np.float32) if arr.dtype.kind == "f" else arr
    return out


def library_versions() -> dict[str, str]:
    libs = ("torch", "pnnx", "onnx", "onnxruntime", "timm", "transformers", "ultralytics")
    return {lib: version(lib) for lib in libs}


def build_model(spec: Spec) -> tuple[nn.Module, torch.Generator]:
    torch.manual_seed(seed_for(spec.name))
    gen = torch.Generator().manual_seed(seed_for(spec.name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = spec.build()
    randomize(model, gen)
    return model.eval(), gen


def make_entry(spec: Spec, dynamic: bool, out_root: Path) -> dict:
    """One suite entry (the static export, or the _dynamic variant): export, goldens, meta.json."""
    name = f"{spec.name}_dynamic" if dynamic else spec.name
    model, gen = build_model(spec)
    dyn = spec.dynamic if dynamic else None
    shapes = dyn.max_shapes if dyn else [f.shape for f in spec.feeds]
    inputs = [make_feed(f, s, gen) for f, s in zip(spec.feeds, shapes, strict=True)]
    outputs = forward(model, inputs)
    out = out_root / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    meta: dict = {
        "name": name,
        "family": spec.family,
        "architecture": spec.arch,
        "variant": "dynamic" if dyn else "static",
        "generator": "tools/make_realworld.py",
        "versions": library_versions(),
        "seed": seed_for(spec.name),
        "inputs": io_entries("in", inputs, [f.name for f in spec.feeds]),
        "outputs": io_entries("out", outputs),
        "pnnx_command": "pnnx model.pt inputshape=..." + (" inputshape2=..." if dyn else "") + " (default optlevel)",
        "notes": spec.notes,
    }
    dynamic_dims: dict[str, list[int]] = {}
    if dyn:
        dynamic_dims = {f"in{i}": [d for d, (a, b) in enumerate(zip(s1, s2, strict=True)) if a != b]
                        for i, (s1, s2) in enumerate(zip(dyn.max_shapes, dyn.inputshape2, strict=True))}
        meta.update(dynamic=dyn.what, inputshape2=[list(s) for s in dyn.inputshape2],
                    max_shapes={f"in{i}": list(s) for i, s in enumerate(dyn.max_shapes)},
                    cases=[[list(s) for s in case] for case in dyn.cases])
    save_npz(out / "inputs.npz", named("in", inputs))
    save_npz(out / "expected.npz", named("out", outputs))
    if dyn:
        for k, case in enumerate(dyn.cases):
            case_in = [make_feed(f, s, gen) for f, s in zip(spec.feeds, case, strict=True)]
            save_npz(out / f"inputs_{k}.npz", named("in", case_in))
            save_npz(out / f"expected_{k}.npz", named("out", forward(model, case_in)))
    meta.update(export_pnnx(spec, model, inputs, outputs, out, dyn.inputshape2 if dyn else None))
    try:
        meta["onnx"] = onnx_export(model, inputs, outputs, out / "model.onnx", dynamic_dims)
    except Exception as exc:  # recorded, not fatal: the pnnx side of the suite does not need the twin
        meta["onnx_error"] = f"{type(exc).__name__}: {first_line(exc)}"
    save_json(out / "meta.json", meta)
    return meta


def export_pnnx(spec: Spec, model: nn.Module, inputs: list[torch.Tensor], outputs: list[torch.Tensor], out: Path,
                inputs2: Shapes | None) -> dict:
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(spec.mha_fastpath)
    work = WORK_DIR / out.name
    try:
        paths, _ = pnnx_export(model, inputs, work, inputs2, [t.dtype for t in inputs])
    except Exception as exc:
        return {"export_error": f"{type(exc).__name__}: {first_line(exc)}"}
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    shutil.copyfile(paths["param"], out / "model.pnnx.param")
    shutil.copyfile(paths["bin"], out / "model.pnnx.bin")
    try:
        got = run_pnnx_python(paths["py"], inputs)
        self_check: dict | str = {"max_abs_diff": max_abs_diff(got, outputs),
                                  "max_rel_diff": max_rel_diff(got, outputs)}
    except Exception as exc:  # pnnx's generated Python is a diagnostic only
        self_check = f"{type(exc).__name__}: {first_line(exc)}"
    return {"pnnx_python_vs_torch": self_check, "pnnx_ops": op_counts(paths["param"])}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def fixture_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.name in FIXTURE_FILES or f.suffix == ".npz")


def copy_fixtures(out_root: Path, dest: Path) -> None:
    """Copy the FIXTURES models (without their ONNX twins) to tests/fixtures/realworld/."""
    missing = [n for n in FIXTURES if not (out_root / n / "model.pnnx.param").exists()]
    if missing:
        raise SystemExit(f"not exported (or pnnx failed), cannot copy: {', '.join(missing)}")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():  # every model folder goes; the README stays
        if old.is_dir():
            shutil.rmtree(old)
    for name in FIXTURES:
        (dest / name).mkdir()
        for f in sorted((out_root / name).iterdir()):
            if f.name in FIXTURE_FILES or f.suffix == ".npz":
                shutil.copyfile(f, dest / name / f.name)
    sizes = {n: fixture_bytes(dest / n) for n in FIXTURES}
    large = [f"{n} ({b // 1024} KB)" for n, b in sizes.items() if b > FIXTURE_MAX_BYTES]
    print(f"fixtures: {len(FIXTURES)} models, {sum(sizes.values()) // 1024} KB in {dest.relative_to(REPO)}")
    if large:
        print(f"warning: above {FIXTURE_MAX_BYTES // 1024} KB: {', '.join(large)}")


def entries(names: list[str]) -> list[tuple[Spec, bool]]:
    todo = []
    for spec in SPECS:
        for dynamic in (False, True) if spec.dynamic else (False,):
            name = f"{spec.name}_dynamic" if dynamic else spec.name
            if not names or name in names or spec.name in names:
                todo.append((spec, dynamic))
    return todo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="only these models (a base name includes its _dynamic variant)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default bench/realworld)")
    parser.add_argument("--missing", action="store_true", help="skip models whose meta.json already exists")
    parser.add_argument("--fixtures", action="store_true", help="copy the small models to tests/fixtures/realworld/")
    parser.add_argument("--list", action="store_true", help="list the suite's models and exit")
    args = parser.parse_args(argv)
    known = {s.name for s in SPECS} | {f"{s.name}_dynamic" for s in SPECS if s.dynamic}
    if set(args.names) - known:
        parser.error(f"unknown models: {sorted(set(args.names) - known)}")
    todo = entries(args.names)
    if args.list:
        for spec, dynamic in todo:
            print(f"{spec.name + ('_dynamic' if dynamic else ''):<28} {spec.family:<14} {spec.arch}")
        return 0
    torch.set_num_threads(1)  # bit-stable expected outputs across machines and runs
    args.out.mkdir(parents=True, exist_ok=True)
    for spec, dynamic in todo:
        name = f"{spec.name}_dynamic" if dynamic else spec.name
        if args.missing and (args.out / name / "meta.json").exists():
            continue
        start = time.monotonic()
        meta = make_entry(spec, dynamic, args.out)
        status = meta.get("export_error") or f"ok ({len(meta['pnnx_ops'])} op types)"
        onnx = meta.get("onnx_error") or f"onnx ok (ort rel diff {meta['onnx']['onnxruntime_max_rel_diff']:.2g})"
        print(f"== {name:<28} {time.monotonic() - start:6.1f} s  {status}; {onnx}", flush=True)
    if args.fixtures:
        copy_fixtures(args.out, FIXTURE_DIR)
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
