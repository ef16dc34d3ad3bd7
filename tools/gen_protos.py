"""Generates the protobuf and gRPC modules from proto/; their output is committed, so nothing runs protoc at import.

    python tools/gen_protos.py           # rewrite the generated modules after editing a .proto
    python tools/gen_protos.py --check   # exit 1, naming the files, where they differ from what proto/ generates

model_config.proto is the model-configuration schema that the server core reads (server/model_config/); the service
protos belong to the gRPC adapter (server/protocol/grpc/_gen/). For one grpcio-tools version the output is the same
bytes every time; the test extra pins that version, and tests/server/test_server_protos.py checks the committed
modules against a fresh run.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "proto"
MODEL_CONFIG = "server/model_config"
GRPC_STUBS = "server/protocol/grpc/_gen"
# proto file -> the directory (from the repository root) its modules go to
TARGETS = {"model_config.proto": MODEL_CONFIG, "grpc_service.proto": GRPC_STUBS, "health.proto": GRPC_STUBS}
HEADER = "# Made from proto/{proto} by tools/gen_protos.py: edit the .proto and rerun it, never this file.\n"
STUBS_INIT = '"""gRPC stubs of the service protos, made by tools/gen_protos.py; do not edit."""\n'


def generated(out: Path) -> dict[str, bytes]:
    """Every generated file (path from the repository root -> bytes), made by protoc in `out`."""
    include = Path(grpc_tools.__file__).parent / "_proto"
    files: dict[str, bytes] = {f"{GRPC_STUBS}/__init__.py": STUBS_INIT.encode()}
    for proto, target in TARGETS.items():
        rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}",
                          f"--grpc_python_out={out}", str(PROTO_DIR / proto)])
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc} on proto/{proto}")
        stem = proto.removesuffix(".proto")
        for suffix in ("_pb2.py", "_pb2_grpc.py"):
            text = (out / f"{stem}{suffix}").read_text()
            if suffix == "_pb2_grpc.py" and "class " not in text:
                continue  # a proto without services: protoc still writes an empty module
            files[f"{target}/{stem}{suffix}"] = post_process(text, proto).encode()
    return files


def post_process(text: str, proto: str) -> str:
    """Package imports instead of protoc's top-level ones, and our own descriptor pool instead of the default
    (tritonclient registers Triton's protos, with the same file and package names, in the default pool)."""
    text = text.replace("# NO CHECKED-IN PROTOBUF GENCODE\n", "")
    text = HEADER.format(proto=proto) + text

    def package_import(match: re.Match[str]) -> str:
        module = match.group(1)
        package = TARGETS[module.removesuffix("_pb2") + ".proto"].replace("/", ".")
        return f"from {package} import {module} as"

    text = re.sub(r"^import (\w+_pb2) as", package_import, text, flags=re.M)
    if "_descriptor_pool.Default()" in text:
        text = text.replace("_descriptor_pool.Default()", "_nnserve_pool.POOL")
        text = text.replace("from google.protobuf import descriptor_pool as _descriptor_pool\n",
                            "from google.protobuf import descriptor_pool as _descriptor_pool\n"
                            "from server.model_config import pool as _nnserve_pool\n", 1)
    return text


def differing(files: dict[str, bytes]) -> list[str]:
    """The generated files whose committed copy is missing or has other bytes."""
    return sorted(name for name, data in files.items()
                  if not (ROOT / name).is_file() or (ROOT / name).read_bytes() != data)


def leftovers(files: dict[str, bytes]) -> list[str]:
    """Files in the stubs folder that no proto generates (a module left from an older layout would ship)."""
    stubs = ROOT / GRPC_STUBS
    present = {f"{GRPC_STUBS}/{p.name}" for p in stubs.iterdir() if p.is_file()} if stubs.is_dir() else set()
    return sorted(present - set(files))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed modules, write nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nnserve-protos-") as scratch:
        files = generated(Path(scratch))
    stale, extra = differing(files), leftovers(files)
    if args.check:
        for name in stale:
            print(f"{name} differs from what proto/ generates: run tools/gen_protos.py", file=sys.stderr)
        for name in extra:
            print(f"{name} is not generated from proto/: run tools/gen_protos.py to remove it", file=sys.stderr)
        return 1 if stale or extra else 0
    for name in extra:
        (ROOT / name).unlink()
        print(f"removed {name}")
    for name in stale:
        (ROOT / name).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / name).write_bytes(files[name])
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
