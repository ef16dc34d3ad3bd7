"""Engine commands for the command line: run, inspect, convert and quantize a model.

`add_engine_commands(subparsers)` adds them to any argparse parser (the `nnserve` script uses it);
`python -m engine.cli` runs them on their own. Each command returns an exit code; an EngineError becomes
one `error: ...` line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.errors import EngineError
from engine.formats.registry import FORMATS
from engine.quantize import QuantizeOptions, format_report, quantize
from engine.quantize.data import Preprocess, load_samples
from engine.quantize.loading import float_graph
from engine.quantize.progress import progress_bar
from engine.runtime.inspect import describe, describe_graph
from engine.runtime.model import load, spec_of
from engine.runtime.options import EngineOptions, environment_options


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """"in0=1x3x224x224" -> ("in0", (1, 3, 224, 224))."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().replace(",", "x").split("x"))
    except ValueError:
        shape = ()
    if not sep or not name or not shape:
        raise argparse.ArgumentTypeError(f"expected NAME=DxDx...D (e.g. in0=1x3x224x224), got {text!r}")
    return name, shape


def parse_input(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy, got {text!r}")
    return name, path


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default, booleans spelled as they are passed (true/false)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or "default:" in text or isinstance(action, argparse._StoreTrueAction)):
            return text
        default = action.default
        shown = ("none" if default in (None, []) else str(default).lower() if isinstance(default, bool)
                 else "%(default)s")
        return f"{text} (default: {shown})"


def add_engine_commands(subparsers, options: EngineOptions | None = None) -> None:
    """Adds `run`, `inspect`, `convert` and `quantize` to an argparse subparsers object; they run with `options`
    (default: the environment's, read now)."""
    if options is None:
        try:
            options = environment_options()
        except ValueError as e:  # an NNSERVE_* setting outside its accepted values: one line, not a traceback
            raise SystemExit(f"nnserve: {e}") from None
    graph_files = " or ".join(sorted(f"MODEL{f.graph_suffix}" for f in FORMATS.values()))
    p = subparsers.add_parser("run", help="run a model on .npy inputs and write .npy outputs",
                              formatter_class=DefaultsHelpFormatter)
    p.add_argument("model", help=f"{graph_files} (weights beside it)")
    p.add_argument("--input", "-i", type=parse_input, action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array; repeat per input")
    p.add_argument("--output-dir", "-o", default=".", metavar="DIR", help="where each output is written as NAME.npy")
    _add_max_shape(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--warmup", type=_count(0), default=0, metavar="N",
                   help="untimed runs first (the first run includes JIT compilation)")
    p.add_argument("--repeat", type=_count(1), default=1, metavar="N", help="timed runs; the median is reported")
    p.add_argument("--profile", action="store_true",
                   help="time every node over the timed runs; print the time per op kind and the slowest nodes, "
                        "with the kernel that ran each (a numpy reference fallback is marked)")
    p.add_argument("--profile-nodes", type=_count(0), default=25, metavar="N",
                   help="how many of the slowest nodes --profile lists (0: every node)")
    p.set_defaults(func=_guarded(cmd_run, options.debug), engine_options=options)

    p = subparsers.add_parser("inspect", help="show a model's inputs, outputs, ops and memory plan",
                              formatter_class=DefaultsHelpFormatter)
    p.add_argument("model", help=f"{graph_files} (weights beside it)")
    _add_max_shape(p)
    p.add_argument("--graph-only", action="store_true",
                   help="structure only, without weights (a .tnnproto needs no .tnnmodel) and without lowering")
    p.set_defaults(func=_guarded(cmd_inspect, options.debug), engine_options=options)

    p = subparsers.add_parser("convert", help="convert a model to another format",
                              formatter_class=DefaultsHelpFormatter)
    p.add_argument("model", help=f"{graph_files} (weights beside it)")
    p.add_argument("--to", choices=[f.name for f in FORMATS.values() if f.write is not None], required=True,
                   help="the format to write")
    p.add_argument("--output", required=True, metavar="PREFIX", help="writes PREFIX.tnnproto and PREFIX.tnnmodel")
    p.add_argument("--fp16", action="store_true", help="store weights as float16")
    p.add_argument("--input-shape", type=parse_shape, action="append", default=[], metavar="NAME=1x3x224x224",
                   help="the fixed shape TNN records for a dynamic input; repeat per input")
    p.add_argument("--tnn-version", type=int, choices=[1, 2], default=None,
                   help="TNN proto version to write (default: the writer's)")
    p.set_defaults(func=_guarded(cmd_convert, options.debug), engine_options=options)
    _add_quantize(subparsers, graph_files, options)


def _add_quantize(subparsers, graph_files: str, options: EngineOptions) -> None:
    p = subparsers.add_parser(
        "quantize", help="post-training int8 quantization to a TNN int8 model, from calibration inputs",
        formatter_class=DefaultsHelpFormatter,
        description="Calibrates a float model on sample inputs and writes TNN's int8 format (as TNN's quantization "
                    "tool does: per-channel weights, blob scales, Quantized* layers), then prints how far each int8 "
                    "layer is from the float model. Images are read as RGB pixels 0..255, resized to the input's "
                    "size, and fed as (pixel - mean) * scale.")
    p.add_argument("model", help=f"{graph_files} (weights beside it), float")
    p.add_argument("--calibration", "-c", required=True, metavar="DIR",
                   help="a folder of .npy (one input), .npz (one array per input name) or image files, or one file")
    p.add_argument("--output", "-o", required=True, metavar="PREFIX", help="writes PREFIX.tnnproto and PREFIX.tnnmodel")
    p.add_argument("--method", choices=["minmax", "kl", "percentile"], default="minmax",
                   help="how blob scales are chosen from the calibration statistics")
    p.add_argument("--percentile", type=float, default=99.99, help="with --method percentile: share of |x| kept")
    p.add_argument("--per-tensor-activations", action="store_true",
                   help="one scale per blob instead of one per channel (TNN's -c)")
    p.add_argument("--per-tensor-weights", action="store_true", help="one weight scale per layer, not per channel")
    p.add_argument("--max-samples", type=_count(1), default=None, metavar="N", help="calibrate on the first N files")
    p.add_argument("--mean", type=_floats, default="0", metavar="M[,M,M]", help="images: per-channel mean")
    p.add_argument("--scale", type=_floats, default="1", metavar="S[,S,S]", help="images: per-channel scale")
    p.add_argument("--size", type=_size, default=None, metavar="HxW", help="images: size (default: the input's)")
    p.add_argument("--channels", choices=["rgb", "bgr"], default="rgb", help="images: channel order")
    p.add_argument("--layout", choices=["nchw", "nhwc"], default="nchw", help="images: the input's layout")
    p.add_argument("--batch", type=_count(1), default=1, metavar="N",
                   help="the batch size the TNN file records (TNN files fix their input shapes)")
    p.add_argument("--report", metavar="FILE.json", help="also write the per-layer errors as JSON")
    p.add_argument("--report-samples", type=_count(0), default=4, metavar="N",
                   help="calibration inputs the per-layer comparison runs (0: no comparison)")
    p.set_defaults(func=_guarded(cmd_quantize, options.debug), engine_options=options)


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(t) for t in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW (e.g. 224x224), got {text!r}") from None
    return h, w


def _add_max_shape(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-shape", type=parse_shape, action="append", default=[], metavar="NAME=1x3x224x224",
                   help="max shape of a (dynamic) input; repeat per input")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = minimum - 1
        if n < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return n
    return parse


def _guarded(fn: Callable[[argparse.Namespace], int], debug: int) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except EngineError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # the reader went away (`| head`): not an error of ours, see exit_quietly_...
            raise
        except Exception as e:  # a bug, not a user error: still one line unless asked for the traceback
            if debug:
                raise
            print(f"error: internal error: {type(e).__name__}: {e} (ENGINE_DEBUG=1 shows the traceback)",
                  file=sys.stderr)
            return 1
    run.__name__ = fn.__name__
    return run


def exit_quietly_on_broken_pipe(command: Callable[[], int]) -> int:
    """Runs a command whose output may go to a reader that stops early (`nnserve inspect ... | head`): then it ends
    quietly, with the status of a process killed by SIGPIPE (as `cat` has), instead of a BrokenPipeError."""
    try:
        status = command()
        sys.stdout.flush()  # inside the try: a pipe closed after the last print fails here, not at exit
        return status
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail and print a warning.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


# -- run --------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    model = load(args.model)
    feeds = {name: _load_npy(path) for name, path in args.input}
    max_shapes = dict(args.max_shape)
    for spec in model.inputs:  # a dynamic input without --max-shape: plan for the given array
        if spec.name not in max_shapes and -1 in spec.shape and spec.name in feeds:
            max_shapes[spec.name] = feeds[spec.name].shape
    inst = model.instance(device=args.device, max_shapes=max_shapes or None, options=args.engine_options)
    for _ in range(args.warmup):
        inst.run(feeds)
    if args.profile:
        inst.start_profile()
    timings = []
    for _ in range(args.repeat):
        outputs = inst.run(feeds)
        timings.append(inst.last_timings)
    profile = inst.stop_profile()
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, array in outputs.items():
        path = out_dir / f"{_file_name(name)}.npy"
        np.save(path, array)
        print(f"{name}: {array.dtype} {list(array.shape)} -> {path}")
    compute, total = (float(np.median([t[k] for t in timings])) * 1e3 for k in ("compute_s", "total_s"))
    runs = f" (median of {args.repeat} runs after {args.warmup} warm-up)" if args.repeat > 1 or args.warmup else ""
    print(f"time: compute {compute:.3f} ms, total {total:.3f} ms{runs}")
    if profile is not None:
        print()
        print(profile.table(top=args.profile_nodes or None))
    return 0


def _load_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise EngineError(f"{path}: cannot read input array: {e}") from None


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# -- inspect ----------------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    print(describe_graph(args.model) if args.graph_only
          else describe(args.model, dict(args.max_shape), args.engine_options))
    return 0


# -- convert ----------------------------------------------------------------------------------------
def cmd_convert(args: argparse.Namespace) -> int:
    model = load(args.model)
    write = FORMATS[args.to].write
    options = {"fp16": args.fp16} if args.tnn_version is None else {"fp16": args.fp16, "version": args.tnn_version}
    # A TNN proto records one fixed shape per input: dynamic dims need --input-shape.
    shapes = dict(args.input_shape)
    missing = [s.name for s in model.inputs if -1 in s.shape and s.name not in shapes]
    if missing:
        raise EngineError(f"input(s) {', '.join(missing)} have dynamic dims; a TNN file records fixed shapes: "
                          f"pass --input-shape NAME=1x3x224x224 for each")
    written = write(model.graph, args.output, input_shapes=shapes or None, **options)
    for path in written or []:
        print(f"wrote {path}")
    return 0


# -- quantize ---------------------------------------------------------------------------------------
def cmd_quantize(args: argparse.Namespace) -> int:
    inputs = [spec_of(v) for v in float_graph(args.model).inputs]
    pre = Preprocess(args.mean, args.scale, args.size, args.channels, args.layout)
    samples = load_samples(args.calibration, inputs, pre, args.max_samples)
    options = QuantizeOptions(args.method, args.percentile, not args.per_tensor_activations,
                              not args.per_tensor_weights, report_samples=args.report_samples, batch=args.batch)
    print(f"calibrating {args.model} on {len(samples)} input(s), {args.method} scales", file=sys.stderr)
    result = quantize(args.model, samples, args.output, options, progress_bar(), args.engine_options)
    print(format_report(result))
    if args.report:
        rows = {"layers": [vars(e) for e in result.layers], "outputs": [vars(o) for o in result.outputs],
                "model": str(result.proto)}
        Path(args.report).write_text(json.dumps(rows, indent=1, default=list))
        print(f"wrote {args.report}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_engine_commands(sub)
    args = parser.parse_args(argv)
    return exit_quietly_on_broken_pipe(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
