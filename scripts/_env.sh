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

# Each set-up step prints one line ("==> what ... done (N s)"); the tools' own output goes
# to a log that is shown only when the step fails.
step() {
  local what=$1 log start rc
  shift
  log=$(mktemp "${TMPDIR:-/tmp}/dynamo-step.XXXXXX")
  start=$SECONDS
  printf '==> %s ... ' "$what"
  if "$@" >"$log" 2>&1; then
    echo "done ($((SECONDS - start)) s)"
    rm -f "$log"
  else
    rc=$?
    echo "FAILED (exit $rc); its output:"
    cat "$log" >&2
    rm -f "$log"
    exit "$rc"
  fi
}

ensure_venv() {
  # `.venv/` with maturin and the given requirements. pip runs only for a list of
  # requirements this venv has not installed yet (one line per list in a stamp file), so a
  # re-run costs nothing here.
  local stamp="$VENV/.dynamo-requirements" want
  want="maturin>=1.8,<2 $*"
  if [ -x "$PY" ] && [ -f "$stamp" ] && grep -qxF -- "$want" "$stamp"; then
    echo "==> python environment ($VENV) ... up to date"
    return
  fi
  [ -x "$PY" ] || step "create the python environment ($VENV)" python3 -m venv "$VENV"
  step "install python packages" \
    "$PY" -m pip install --disable-pip-version-check "maturin>=1.8,<2" "$@"
  printf '%s\n' "$want" >>"$stamp"
}

_maturin_develop() {
  VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" "$VENV/bin/maturin" develop --release "$@"
}

_build_logged() {
  # The build's whole output goes to $1 (follow it with `tail -f`); its end is shown on
  # failure.
  local log=$1
  shift
  if ! _maturin_develop "$@" >"$log" 2>&1; then
    tail -n 80 "$log"
    return 1
  fi
}

build_extension() {
  # Release build of dynamo._core installed (editable) into the venv. A build is keyed by
  # the contents of its inputs (scripts/_extension.py): when this checkout, or any other
  # sharing the cargo target directory, already built the same sources, the stored
  # extension is installed instead of running cargo, whose fingerprints follow file
  # modification times and would recompile every workspace crate in a fresh clone.
  local cache="$CARGO_TARGET_DIR/dynamo-ext-cache" key
  key=$("$PY" "$ROOT/scripts/_extension.py" key "$ROOT" "$@")
  if "$PY" "$ROOT/scripts/_extension.py" restore "$ROOT" "$cache" "$key"; then
    echo "==> build dynamo._core (release) ... up to date (build $key)"
  else
    local log="$CARGO_TARGET_DIR/dynamo-build.log"
    mkdir -p "$CARGO_TARGET_DIR"
    echo "==> build dynamo._core (release); a first build takes minutes (log: $log)"
    step "build dynamo._core" _build_logged "$log" "$@"
    "$PY" "$ROOT/scripts/_extension.py" store "$ROOT" "$cache" "$key"
  fi
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
    step "apt-get update" $sudo apt-get update -qq
    step "install Debian packages: ${missing[*]}" \
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi
}
