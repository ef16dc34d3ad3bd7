"""Runs Triton's own Python client examples against nnserve and prints a table: example -> pass / fail / reason.

    python tools/run_triton_examples.py <client repo>/src/python/examples [--keep DIR]
    make triton-examples EXAMPLES=<client repo>/src/python/examples

It builds the model repositories the examples expect, from committed files: Triton's simple models
(tests/server/fixtures/triton/: "simple" as a TNN model, the string, identity, int8, identity and decoupled repeat
models as Python-backend models), the image classifiers stood in for by Python models that resize the image and run
the repository's small classifiers (tests/fixtures/pnnx/densenet, googlenet) with the nnserve engine, and the
ensemble example's ensemble: a Python decoding step and the small GoogLeNet (tools/triton_examples/). For each
repository it starts `nnserve serve` on ephemeral ports (explicit model control, every model loaded, as the model
control examples want), copies each example with its `localhost:8000` / `localhost:8001` pointed at
those ports (nothing else changed), and runs it (several times for the examples taking a model or protocol flag).
A run passes when it exits 0 and, for an example that prints PASS on success, printed it. Clients' own
dependencies (Pillow and attrdict for the image examples) must be installed in the Python that runs them.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from server.settings import parse_listening  # noqa: E402 - the checkout's server package, wherever this runs from

TRITON_MODELS = ROOT / "tests" / "server" / "fixtures" / "triton"
IMAGE_MODELS = ROOT / "tools" / "triton_examples"
PNNX_FIXTURES = ROOT / "tests" / "fixtures" / "pnnx"
IMAGE = ROOT / "examples" / "photos" / "astronaut.png"
RUN_SECONDS = 180

# Two repositories, as Triton's examples assume: "examples" holds the models of Triton's docs/examples repository
# (the model control examples count them: eight, with the sequence models simple_sequence and simple_dyna_sequence),
# "qa" the others the examples use. Model name -> (committed folder, files copied into it).
CLASSIFIER = IMAGE_MODELS / "classifier" / "model.py"


def _pnnx(fixture: str) -> dict[str, Path]:
    return {f"1/model.{s}": PNNX_FIXTURES / fixture / f"model.{s}" for s in ("pnnx.param", "pnnx.bin")}


REPOSITORIES: dict[str, dict[str, tuple[Path, dict[str, Path]]]] = {
    "examples": {
        **{name: (TRITON_MODELS / name, {}) for name in ("simple", "simple_string", "simple_identity", "simple_int8",
                                                         "simple_sequence", "simple_dyna_sequence")},
        "densenet_onnx": (IMAGE_MODELS / "densenet_onnx", {"1/model.py": CLASSIFIER, **_pnnx("densenet")}),
        "inception_graphdef": (IMAGE_MODELS / "inception_graphdef", {"1/model.py": CLASSIFIER, **_pnnx("googlenet")}),
    },
    "qa": {
        **{name: (TRITON_MODELS / name, {}) for name in ("custom_identity_int32", "repeat_int32", "simple_sequence",
                                                         "simple_dyna_sequence", "simple_string_dyna_sequence")},
        "preprocess_inception_ensemble": (IMAGE_MODELS / "preprocess_inception_ensemble", {}),
        "image_preprocess": (IMAGE_MODELS / "image_preprocess", {"1/model.py": IMAGE_MODELS / "image_preprocess" /
                                                                 "model.py"}),
        "inception_64": (IMAGE_MODELS / "inception_64", _pnnx("googlenet")),
    },
}
# The examples that use the "qa" repository's models; the others use "examples". The sequence examples' string
# model (simple_string_dyna_sequence) would be a ninth model in "examples".
QA_EXAMPLES = {"memory_growth_test.py", "simple_grpc_custom_repeat.py", "ensemble_image_client.py",
               *(f"simple_{kind}_sequence_{mode}_infer_client.py"
                 for kind in ("grpc", "http", "grpc_aio", "http_aio") for mode in ("sync", "stream"))}

# Examples run more than once, with these arguments ({grpc}: the gRPC address, {image}: a photo); every other
# example of the folder runs once without arguments.
RUNS: dict[str, list[list[str]]] = {
    "image_client.py": [["-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION", "{image}"],
                        ["-m", "inception_graphdef", "-c", "3", "-s", "INCEPTION", "-i", "grpc", "-u", "{grpc}",
                         "{image}"],
                        ["-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION", "-i", "grpc", "-u", "{grpc}", "-a",
                         "--streaming", "{image}"]],
    "grpc_image_client.py": [["-m", "inception_graphdef", "-c", "3", "-s", "INCEPTION", "{image}"],
                             ["-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION", "-a", "{image}"]],
    "ensemble_image_client.py": [["{image}"], ["-i", "grpc", "-u", "{grpc}", "{image}"]],
    "memory_growth_test.py": [["-r", "20"], ["-i", "grpc", "-r", "20"]],
    "simple_grpc_sequence_sync_infer_client.py": [[], ["-d"]],
    "simple_grpc_sequence_stream_infer_client.py": [[], ["-d"]],
    "simple_http_sequence_sync_infer_client.py": [[], ["-d"]],
    "simple_grpc_aio_sequence_stream_infer_client.py": [[], ["-d"]],
    "simple_grpc_aio_sequence_sync_infer_client.py": [[], ["-d"]],
    "simple_http_aio_sequence_sync_infer_client.py": [[], ["-d"]],
}

# What a failure's output says about its cause: (pattern, the feature it needs).
CAUSES = [
    (r"cuda|CUDA", "CUDA shared memory (needs a GPU)"),
    (r"shared_memory|shm|SharedMemory", "system shared memory (issue 21 item 1)"),
    (r"sequence", "the sequence batcher (issue 21 item 4)"),
    (r"has no attribute 'split'|unpack_from requires a buffer|class_count|classification",
     "the classification extension (issue 21 item 3)"),
    (r"has no attribute 'max_batch_size'", "default-valued fields in the HTTP model config (issue 21 item 9)"),
    (r"FAILED : Repository Index", "the repository holds Triton's eight example models once the sequence models "
                                   "exist (issue 21 item 4)"),
    (r"failed to get model version from specified version string", "Triton's error texts (issue 21 item 10)"),
    (r"FAILED : get_server_metadata", "the server metadata's name is not 'triton' (issue 21 item 10)"),
    (r"No module named", "a client-side package is missing"),
]


@dataclass
class Result:
    example: str
    args: list[str]
    passed: bool
    reason: str
    seconds: float


def build_repository(root: Path, models: dict[str, tuple[Path, dict[str, Path]]]) -> Path:
    for name, (source, files) in models.items():
        target = root / name
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.py") if files else None)
        (target / "1").mkdir(exist_ok=True)  # every model has a version directory, an ensemble's empty
        for relative, path in files.items():
            shutil.copyfile(path, target / relative)
    return root


class Server:
    """`nnserve serve` on 127.0.0.1 with ephemeral ports, found in its log."""

    def __init__(self, repository: Path, log_path: Path):
        script = Path(sys.executable).parent / "nnserve"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "server.cli"]
        self.log = log_path.open("w")
        self.proc = subprocess.Popen(
            [*command, "serve", "--model-repository", str(repository), "--http-port", "0", "--grpc-port", "0",
             "--metrics-port", "0", "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
             "--model-control-mode", "explicit", "--load-model", "*", "--exit-on-error", "false",
             "--strict-readiness", "false",
             # what the examples check or use beyond the defaults: the server metadata's name is 'triton' in their
             # health_metadata checks, and client shared memory (off by default) in the shm examples
             "--server-name", "triton", "--allow-client-shm", "true"],
            stderr=subprocess.PIPE, stdout=self.log, text=True, cwd=ROOT)
        self.ports: dict[str, int] = {}
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(300) or not self.ports:
            self.stop()
            raise SystemExit(f"nnserve did not start; its log is in {log_path}")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.write(line)
            self.log.flush()
            if (ports := parse_listening(line)) is not None:
                self.ports = ports
            if "model repository" in line and "model(s) ready" in line:
                self.ready.set()
        self.ready.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def pointed(example: Path, into: Path, http: str, grpc: str) -> Path:
    """A copy of the example whose default addresses are the server's."""
    text = example.read_text().replace("localhost:8000", http).replace("localhost:8001", grpc)
    copy = into / example.name
    copy.write_text(text)
    return copy


def run(example: Path, args: list[str], python: str) -> Result:
    t0 = time.monotonic()
    try:
        proc = subprocess.run([python, str(example), *args], capture_output=True, text=True, timeout=RUN_SECONDS,
                              cwd=example.parent)
    except subprocess.TimeoutExpired:
        return Result(example.name, args, False, f"no answer within {RUN_SECONDS} s", time.monotonic() - t0)
    output = proc.stdout + proc.stderr
    wants_pass = "PASS" in example.read_text()
    passed = proc.returncode == 0 and (not wants_pass or "PASS" in output)
    reason = "" if passed else SILENT_FAILURES.get(example.name) or failure_reason(output, proc.returncode)
    return Result(example.name, args, passed, reason, time.monotonic() - t0)


# Why an example fails that says nothing when it does.
SILENT_FAILURES = {
    "simple_http_model_control.py": "it counts the models in the repository (7 for this one)",
    "simple_grpc_model_control.py": "it counts the models in the repository (8 for this one)",
    "grpc_explicit_int_content_client.py": "no PASS: it wants Triton's error text for contents mixed with raw contents",
    "grpc_explicit_int8_content_client.py": "no PASS: it wants Triton's error text for contents mixed with raw "
                                            "contents",
}


def failure_reason(output: str, code: int) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|Error|Exception|failed|unknown|not |expected", line)]
    last = (errors or lines or [f"exit status {code}"])[-1]
    cause = next((feature for pattern, feature in CAUSES if re.search(pattern, output)), "")
    text = last if len(last) <= 150 else last[:147] + "..."
    return f"{cause}: {text}" if cause else text


def table(results: list[Result], root: Path) -> str:
    rows = [("example", "result", "seconds", "reason")]
    for r in results:
        args = " ".join(a.replace(str(root), ".") for a in r.args)
        rows.append((f"{r.example} {args}".strip(), "pass" if r.passed else "FAIL", f"{r.seconds:.1f}", r.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [" | ".join([*(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)), row[3]]).rstrip()
             for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-------")
    passed = sum(r.passed for r in results)
    return "\n".join([*lines, "", f"{passed} of {len(results)} runs pass"])


# The model control examples unload models the others use, and count the repository's models: Triton's CI runs
# each against a server of its own, on a repository of the size it expects (the HTTP one's has one model less: the
# ones left out here).
MODEL_CONTROL: dict[str, set[str]] = {"simple_grpc_model_control.py": set(),
                                      "simple_http_model_control.py": {"simple_dyna_sequence"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", type=Path, help="src/python/examples of triton-inference-server/client")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs the examples (with "
                                                                 "tritonclient); default: this one")
    parser.add_argument("--keep", type=Path, help="build the repository and keep the logs in this folder")
    parser.add_argument("--only", action="append", default=[], help="run only the examples with this name "
                                                                    "(repeatable)")
    opts = parser.parse_args(argv)
    examples = sorted(p for p in opts.examples.glob("*.py") if not opts.only or p.name in opts.only)
    if not examples:
        parser.error(f"no example (*.py) in {opts.examples}")
    work = opts.keep or Path(tempfile.mkdtemp(prefix="nnserve-triton-examples-"))
    work.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    for label, models in REPOSITORIES.items():
        chosen = [e for e in examples if (e.name in QA_EXAMPLES) == (label == "qa")]
        shared = [e for e in chosen if e.name not in MODEL_CONTROL]
        if shared:
            results += run_with(label, models, shared, work, opts.python)
        for example in (e for e in chosen if e.name in MODEL_CONTROL):  # each on a server of its own
            own = {k: v for k, v in models.items() if k not in MODEL_CONTROL[example.name]}
            results += run_with(f"{label}-{example.stem}", own, [example], work, opts.python)
    print()
    print(table(results, ROOT))
    print(f"\nserver logs: {work}/nnserve-*.log")
    if opts.keep is None:
        for repository in work.glob("repository-*"):
            shutil.rmtree(repository, ignore_errors=True)
    return 0


def run_with(label: str, models: dict[str, tuple[Path, dict[str, Path]]], examples: list[Path], work: Path,
             python: str) -> list[Result]:
    """`examples` against a server on a repository of `models`."""
    work.mkdir(parents=True, exist_ok=True)
    repository = build_repository(Path(tempfile.mkdtemp(prefix=f"repository-{label}-", dir=work)), models)
    server = Server(repository, work / f"nnserve-{label}.log")
    results = []
    try:
        http, grpc = f"127.0.0.1:{server.ports['http']}", f"127.0.0.1:{server.ports['grpc']}"
        scratch = Path(tempfile.mkdtemp(prefix="examples-", dir=work))
        for example in examples:
            copy = pointed(example, scratch, http, grpc)
            for args in RUNS.get(example.name, [[]]):
                args = [a.format(grpc=grpc, http=http, image=IMAGE) for a in args]
                results.append(run(copy, args, python))
                print(f"{'pass' if results[-1].passed else 'FAIL'}  {example.name} {' '.join(args)}", flush=True)
    finally:
        server.stop()
    return results


if __name__ == "__main__":
    sys.exit(main())
