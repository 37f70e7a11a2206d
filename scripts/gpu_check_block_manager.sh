#!/usr/bin/env bash
# Block manager checks that need an NVIDIA GPU and driver (no CUDA toolkit needed): pinned
# and device storage, H2D/D2H/D2D copies, offload/onboard through a device pool, and the
# host<->device bandwidth bench (16 whole blocks of 0.5-2 MiB per batch). Python device
# tests run when the venv exists; the torch-based round trips also need torch installed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/dynamo-rs-target}
nvidia-smi -L || echo "nvidia-smi not found"
cargo test -p dynamo-block-manager --release --test cuda_device -- --nocapture
cargo bench -p dynamo-block-manager --bench block_manager -- \
  --warm-up-time 1 --measurement-time 3 'copy_h2d|copy_d2h'
PY=${VENV:-$PWD/.venv}/bin/python
if [ -x "$PY" ]; then
  "$PY" -m pytest tests/test_block_manager.py -ra -k "gpu or device"
fi
