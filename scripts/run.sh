#!/usr/bin/env bash
# The main job: an OpenAI frontend and mocker workers on a generated tiny model (embedded
# file discovery, no downloads, no GPU), one chat request and its answer, clean shutdown.
source "$(dirname "$0")/_env.sh"
ensure_system_packages protoc:protobuf-compiler
ensure_venv "pydantic>=2" "uvloop>=0.19" "tokenizers>=0.20"
build_extension
exec "$PY" scripts/serve_demo.py "$@"
