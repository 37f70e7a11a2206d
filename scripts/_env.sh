# Shared set-up for scripts/*.sh: virtual environment, cargo target dir, extension build.
# Sourced, not executed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# Keep cargo's output outside the clone so CI reruns on the same machine are incremental;
# a cold run still works.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/dynamo-rs-target}
VENV=${VENV:-$ROOT/.venv}
PY="$VENV/bin/python"

ensure_venv() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
  fi
  # Quiet, idempotent: pip skips what is already installed.
  "$PY" -m pip install -q --disable-pip-version-check "maturin>=1.8,<2" "$@"
}

build_extension() {
  # Release build of dynamo._core installed (editable) into the venv.
  VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" "$VENV/bin/maturin" develop --release -q "$@"
  # The editable install imports the package from python/, so nothing compiles its byte
  # code ahead (pip does, for a wheel). Where PYTHONDONTWRITEBYTECODE is set, every process
  # would then compile dynamo.llm and dynamo.runtime from source at import: 6-7 ms of each
  # worker's and frontend's start-up. Stale files are harmless: Python checks the source's
  # mtime and recompiles in memory.
  "$PY" -m compileall -q "$ROOT/python/dynamo" >/dev/null
}

ensure_system_packages() {
  # Debian packages, given as command:package pairs, installed with apt-get when the command
  # is missing (`apt-get update` runs once, only then). Used for protoc (the etcd-client
  # crate compiles etcd's .proto files at build time) and, for the tests, real etcd,
  # etcdctl and nats-server (the fixtures start their own on free loopback ports).
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
  fi
}
