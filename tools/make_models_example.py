"""Runs the PyTorch and pnnx steps of docs/models.md (those marked `step: dev`) in a scratch folder, then copies what
the guide's nnserve steps use into docs/smallnet/, where tests/e2e/test_walk.py runs those steps on them.

Needs the `dev` extra (torch, pnnx): `.venv-dev/bin/python tools/make_models_example.py` (`make fixtures` makes that
venv). The `pnnx` command is taken from beside this interpreter.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docsteps  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "models.md"
OUT = REPO / "docs" / "smallnet"
# What the guide's nnserve steps read: the two exports the guide keeps, and the inputs with PyTorch's outputs.
KEEP = ("smallnet.pnnx.param", "smallnet.pnnx.bin", "smallnet_anysize.pnnx.param", "smallnet_anysize.pnnx.bin",
        "input.npy", "expected.npy", "input_96.npy", "expected_96.npy")

README = """# docs/smallnet

The files docs/models.md's nnserve steps run on: its example module exported by pnnx with a dynamic batch
(`smallnet.pnnx.*`) and with a dynamic batch, height and width (`smallnet_anysize.pnnx.*`), inputs (`input*.npy`)
and PyTorch's outputs for them (`expected*.npy`). The weights are PyTorch's initialisation with seed 0, not trained.

Made by `tools/make_models_example.py`, which runs the guide's PyTorch and pnnx steps; do not edit them by hand.
Made with torch {torch}, pnnx {pnnx}.
"""


def main() -> int:
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    if shutil.which("pnnx", path=env["PATH"]) is None:
        raise SystemExit("pnnx is not installed beside this interpreter: install nnserve[dev]")
    guide = docsteps.steps(GUIDE.read_text(), "docs/models.md")
    with tempfile.TemporaryDirectory() as tmp:
        for step in (s for s in guide if s.who == "dev"):
            print(f"== {step.where}: {step.file or step.code.strip().splitlines()[0]}")
            docsteps.run(step, Path(tmp), env, sys.executable)
        OUT.mkdir(exist_ok=True)
        for name in KEEP:
            shutil.copyfile(Path(tmp) / name, OUT / name)
    (OUT / "README.md").write_text(README.format(torch=metadata.version("torch"), pnnx=metadata.version("pnnx")))
    print(f"wrote {', '.join(KEEP)} and README.md to {OUT.relative_to(REPO)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
