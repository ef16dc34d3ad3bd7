#!/usr/bin/env bash
# Fetches (once) and runs Triton's perf_analyzer, the load generator that speaks KServe v2 over HTTP and gRPC.
#
#   tools/perf_analyzer.sh -m ultraface_tnn -u 127.0.0.1:8000 --concurrency-range 1:4
#   tools/perf_analyzer.sh -m ultraface_tnn -i grpc -u 127.0.0.1:8001
#
# Every argument goes to perf_analyzer. The binary ships inside the tritonclient 2.40.0 wheel (the last one that
# carries it); at load time it needs libb64 (Debian/Ubuntu package libb64-0d) and libcudart.so.12 (from the
# nvidia-cuda-runtime-cu12 wheel; no GPU is used). Everything is unpacked under $NNSERVE_PERF_HOME
# (default ~/.cache/nnserve/perf_analyzer); nothing is installed system-wide unless libb64 can only come from apt.
set -euo pipefail

home="${NNSERVE_PERF_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/nnserve/perf_analyzer}"
bin="$home/perf_analyzer"
lib="$home/lib"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$repo_root/.venv/bin/python" ]]; then python="$repo_root/.venv/bin/python"; else python=python3; fi
fi

log() { echo "perf_analyzer.sh: $*" >&2; }

fetch_wheels() {
  local dl
  mkdir -p "$home" "$lib"
  dl="$(mktemp -d "$home/download.XXXXXX")"
  log "downloading tritonclient 2.40.0 and nvidia-cuda-runtime-cu12 wheels"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$dl" \
    "tritonclient==2.40.0" "nvidia-cuda-runtime-cu12" >&2
  "$python" - "$dl" "$home" <<'PY'
import glob, os, sys, zipfile
dl, home = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(f"{dl}/tritonclient-2.40.0-*.whl")[0]) as z:
    member = next(n for n in z.namelist() if n.endswith("/bin/perf_analyzer"))
    with open(f"{home}/perf_analyzer.tmp", "wb") as f:
        f.write(z.read(member))
with zipfile.ZipFile(glob.glob(f"{dl}/nvidia_cuda_runtime_cu12-*.whl")[0]) as z:
    member = next(n for n in z.namelist() if n.endswith("lib/libcudart.so.12"))
    with open(f"{home}/lib/libcudart.so.12", "wb") as f:
        f.write(z.read(member))
os.chmod(f"{home}/perf_analyzer.tmp", 0o755)
os.replace(f"{home}/perf_analyzer.tmp", f"{home}/perf_analyzer")
PY
  rm -rf "$dl"
}

have_libb64() { ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d' || [[ -e "$lib/libb64.so.0d" ]]; }

fetch_libb64() {
  if have_libb64; then
    return
  fi
  # Prefer unpacking the .deb next to the binary (no root needed); fall back to installing it.
  local work
  work="$(mktemp -d)"
  if (cd "$work" && apt-get download libb64-0d >/dev/null 2>&1); then
    dpkg-deb -x "$work"/libb64-0d_*.deb "$work/root"
    find "$work/root" -name 'libb64.so.0d*' -exec cp -P {} "$lib/" \;
  elif [[ "$(id -u)" == 0 ]]; then
    log "installing libb64-0d with apt-get"
    (apt-get update -qq && apt-get install -y -qq libb64-0d) >/dev/null
  else
    log "libb64 is missing: install the libb64-0d package"
    exit 1
  fi
  rm -rf "$work"
}

fetched() { [[ -x "$bin" && -e "$lib/libcudart.so.12" ]]; }

# Several runs may start at once on a fresh machine (tests drive HTTP and gRPC side by side): one fetches
# under the lock, the others wait for it and find the files in place.
if ! fetched || ! have_libb64; then
  mkdir -p "$home"
  exec 9>"$home/.fetch.lock"
  flock 9
  fetched || fetch_wheels
  fetch_libb64
  exec 9>&-
fi

LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$bin" "$@"
