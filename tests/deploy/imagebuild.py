"""Builds nnserve the way the Dockerfile's builder stage does, without Docker: the build context filtered by
.dockerignore, the builder's own RUN line that generates the gRPC stubs, `pip wheel`, then an install of only
that wheel into a private site directory (its dependencies come from the test venv instead of wheels)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from dockerfile import Dockerfile, Stage, dockerignore_allows, dockerignore_patterns
from kube import REPO_ROOT

STUB_MARKER = "import server.protocol.grpc"


def builder(df: Dockerfile) -> Stage:
    return next(s for s in df.stages if any(STUB_MARKER in i.value for i in s.all("RUN")))


def copy_context(df: Dockerfile, dest: Path) -> None:
    """What the builder COPYs from the context, minus what .dockerignore keeps out."""
    patterns = dockerignore_patterns(REPO_ROOT / ".dockerignore")

    def ignored(directory: str, names: list[str]) -> set[str]:
        rel = Path(directory).relative_to(REPO_ROOT)
        return {n for n in names if not dockerignore_allows(patterns, (rel / n).as_posix())}

    for ins in builder(df).all("COPY"):
        *sources, _ = ins.value.split()  # the builder copies each source to the same path under WORKDIR
        for src in sources:
            if (REPO_ROOT / src).is_dir():
                shutil.copytree(REPO_ROOT / src, dest / src.rstrip("/"), ignore=ignored)
            else:
                shutil.copy2(REPO_ROOT / src, dest / src)


def run_stub_step(df: Dockerfile, context: Path) -> None:
    """The builder's RUN line that generates the stubs and lists the stamp in MANIFEST.in, run verbatim by sh."""
    (step,) = [i.value for i in builder(df).all("RUN") if STUB_MARKER in i.value]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", step], cwd=context, env=env, check=True, capture_output=True, timeout=300)


def build_wheel(context: Path) -> Path:
    """`pip wheel` of the project alone; without build isolation when setuptools is at hand (no download)."""
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--wheel-dir", "wheels", "."]
    try:
        import setuptools  # noqa: F401
    except ImportError:
        pass
    else:
        cmd.insert(4, "--no-build-isolation")
    subprocess.run(cmd, cwd=context, check=True, capture_output=True, timeout=600)
    (wheel,) = (context / "wheels").glob("nnserve-*.whl")
    return wheel


def install_wheel(wheel: Path, site: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)


def site_env(site: Path, **extra: str) -> dict[str, str]:
    """Environment that runs the installed wheel, not the checkout: its site dir first on the path."""
    return {**os.environ, "PYTHONPATH": str(site), "PYTHONUNBUFFERED": "1", **extra}
