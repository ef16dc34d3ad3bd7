"""`make fuzz`: coverage-guided fuzzing of both model readers with atheris (libFuzzer), for long runs.

    .venv/bin/python tests/fuzz/fuzz_readers.py pnnx|tnn [libFuzzer flags, e.g. -max_total_time=600]
    .venv/bin/python tests/fuzz/fuzz_readers.py pnnx build/fuzz/pnnx/crash-...   # replays saved inputs

One input is one model: the graph file's bytes, SEPARATOR, then the weights file's bytes (an input without the
separator is all graph file, with empty weights). The corpus lives in build/fuzz/<kind>/corpus and is seeded
from the committed fixtures (tests/fuzz/reader_contract.py) on the first run; libFuzzer mutates it, guided by
coverage of engine/formats. Every input is checked against reader_contract.check_model. A broken contract, an
exception of another type, MemoryError (the address space is capped a little above what the process holds at
start, so an allocation the input's few KiB cannot justify fails) or an input running past -timeout is a crash:
libFuzzer saves it as build/fuzz/<kind>/crash-<sha1> and stops. With --keep-going, a broken contract or an
unexpected exception is saved as build/fuzz/<kind>/failure-<type>-<module>-<line>-<sha1> (the first input of each
distinct failure) and fuzzing goes on. Each failure found becomes a regression test in
tests/fuzz/test_reader_fuzz.py.

atheris is the `fuzz` extra (pip install -e '.[fuzz]'); `make fuzz` installs it.
"""

from __future__ import annotations

import hashlib
import resource
import sys
import tempfile
import traceback
from pathlib import Path

try:
    import atheris
except ImportError:
    sys.exit("fuzz_readers.py needs atheris: pip install -e '.[fuzz]' (or run `make fuzz`)")

with atheris.instrument_imports(include=["engine"]):
    import engine.formats.registry  # noqa: F401  (every reader and lowering, instrumented)

import reader_contract  # noqa: E402  (beside this file)

SEPARATOR = b"\n#--weights--#\n"
ROOT = Path(__file__).resolve().parents[2] / "build" / "fuzz"
HEADROOM = 1 << 30  # address space allowed beyond what the process maps at start


def split(data: bytes) -> tuple[bytes, bytes]:
    graph, _, weights = data.partition(SEPARATOR)
    return graph, weights


def seed_corpus(kind: str, corpus: Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    if not any(corpus.iterdir()):
        for name, graph, weights in reader_contract.seeds(kind):
            (corpus / name.replace("/", "_")).write_bytes(graph + SEPARATOR + weights)


def cap_address_space() -> None:
    with open("/proc/self/status") as f:
        vm_size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm_size + HEADROOM, resource.RLIM_INFINITY))


def failure_key(exc: BaseException) -> str:
    """Where a failure comes from: its type and the innermost engine frame, to tell distinct failures apart (for
    a broken contract, where the engine error it is about was raised)."""
    if isinstance(exc, AssertionError) and exc.__context__ is not None:
        return "contract-" + failure_key(exc.__context__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/engine/" in f.filename] or \
        traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).stem}-{frames[-1].lineno}" if frames else "unknown"
    return f"{type(exc).__name__}-{where}"


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--keep-going"]
    if not args or args[0] not in reader_contract.KINDS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(reader_contract.KINDS)} [--keep-going] [libFuzzer flags]")
    kind, flags, keep_going = args[0], args[1:], "--keep-going" in sys.argv
    work = ROOT / kind
    seed_corpus(kind, work / "corpus")
    folder = Path(tempfile.mkdtemp(prefix=f"fuzz-{kind}-"))
    seen: set[str] = set()

    def one_input(data: bytes) -> None:
        graph, weights = split(data)
        try:
            reader_contract.check_model(kind, folder, graph, weights)
        except Exception as exc:  # --keep-going: save one input per distinct failure and go on
            if not keep_going:
                raise
            key = failure_key(exc)
            if key not in seen:
                seen.add(key)
                (work / f"failure-{key}-{hashlib.sha1(data).hexdigest()[:12]}").write_bytes(data)
                print(f"\n=== failure {len(seen)}: {key}\n{''.join(traceback.format_exception(exc))}", flush=True)

    defaults = ["-timeout=10", "-rss_limit_mb=3072", "-max_len=65536", f"-artifact_prefix={work}/"]
    replay = any(Path(f).is_file() for f in flags)  # given crash files: run just those
    atheris.Setup([sys.argv[0], *defaults, *flags, *([] if replay else [str(work / "corpus")])], one_input)
    cap_address_space()
    atheris.Fuzz()


if __name__ == "__main__":
    main()
