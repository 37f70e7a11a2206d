#!/usr/bin/env bash
# The main job. For now: hash a prompt into KV blocks and print them (examples/hash_prompt.py).
source "$(dirname "$0")/_env.sh"
ensure_system_packages protoc:protobuf-compiler
ensure_venv "pydantic>=2"
build_extension
exec "$PY" examples/hash_prompt.py "$@"
