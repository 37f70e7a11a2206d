#!/usr/bin/env bash
# The whole test suite, from a fresh machine: venv, release build of the extension,
# Rust tests, Python tests, stub check, formatting and lint. Exits non-zero on any failure.
source "$(dirname "$0")/_env.sh"

# protoc (the etcd-client crate compiles etcd's .proto files), and real etcd and
# nats-server for the distributed tests.
ensure_system_packages protoc:protobuf-compiler etcd:etcd-server etcdctl:etcd-client \
  nats-server:nats-server

ensure_venv "pytest>=8" "pytest-asyncio>=0.24" "hypothesis>=6.100" "mypy>=1.11" "ruff>=0.6" \
  "numpy>=1.26" "pydantic>=2" "uvloop>=0.19" "tokenizers>=0.20" "prometheus-client>=0.20" \
  "pyzmq>=25" "msgpack>=1" "openai>=1.40" "websockets>=12" \
  "tritonclient[grpc]>=2.40" \
  "matplotlib>=3.7" "anthropic>=0.40" \
  "moto[server]>=5" "boto3>=1.34" \
  "pillow>=10"

build_extension

echo "==> formatting and lint"
cargo fmt --all --check
"$VENV/bin/ruff" check python tests examples benches scripts
"$VENV/bin/ruff" format --check python tests examples benches scripts

# The Rust tests compile (the crates again, with their unit tests) while the Python tests
# run: those spend most of their time waiting on servers and subprocesses, so the two share
# the cores well. The compile runs at the lowest priority, so the processes the Python tests
# start are scheduled first and their timing is as on an idle machine. The release profile
# is shared with the extension, so no dependency is built twice.
rust_log="$CARGO_TARGET_DIR/rust-tests-build.log"
mkdir -p "$CARGO_TARGET_DIR"
echo "==> compile the Rust tests (background, lowest priority; log: $rust_log)"
nice -n 19 cargo test --workspace --release --no-run >"$rust_log" 2>&1 &
rust_build=$!
trap 'kill "$rust_build" 2>/dev/null || true' EXIT

echo "==> stub check (mypy.stubtest)"
"$PY" -m mypy.stubtest dynamo._core --allowlist tests/stubtest_allowlist.txt

echo "==> pytest"
# Exit code 5 ("no tests collected") must fail the run like any other failure.
"$PY" -m pytest "$@"

echo "==> cargo test (release profile, shares dependency builds with the extension)"
if ! wait "$rust_build"; then
  cat "$rust_log"
  echo "compiling the Rust tests failed (log above)" >&2
  exit 1
fi
trap - EXIT
cargo test --workspace --release
