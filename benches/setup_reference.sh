#!/usr/bin/env bash
# Create the reference venv used only by the benchmark scripts (never by the project).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${REF_VENV:-.bench-ref-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q "ai-dynamo-runtime==1.6.1"
"$venv/bin/python" -c "import dynamo._core as c; print('reference', c.__version__)"
