#!/usr/bin/env bash
# Create the reference venv used only by the benchmark scripts (never by the project).
#
#   bash benches/setup_reference.sh         the runtime wheel (dynamo._core, dynamo.llm, ...)
#   bash benches/setup_reference.sh --cli   also the `ai-dynamo` wheel, whose
#                                           `python -m dynamo.frontend` / `dynamo.mocker`
#                                           the start-up benches run with `--via cli`
#
# `ai-dynamo` 1.6.1 requires `aisimulate`, a placeholder on PyPI that downloads the real
# wheel from pypi.nvidia.com (not reachable here, and only the mocker's AIC performance
# model imports it): the wheel goes in without its dependencies, which are then installed
# from its metadata, that one left out.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${REF_VENV:-.bench-ref-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q "ai-dynamo-runtime==1.6.1"
if [ "${1:-}" = "--cli" ]; then
  "$venv/bin/pip" install -q --no-deps "ai-dynamo==1.6.1"
  mapfile -t deps < <("$venv/bin/python" - <<'PY'
from importlib.metadata import requires

for req in requires("ai-dynamo") or []:
    name, _, marker = req.partition(";")
    if "extra ==" in marker or name.startswith(("aisimulate", "ai-dynamo-runtime")):
        continue
    print(name.strip())
PY
  )
  "$venv/bin/pip" install -q "${deps[@]}" uvloop
  "$venv/bin/python" -m dynamo.frontend --version
fi
"$venv/bin/python" -c "import dynamo._core as c; print('reference', c.__version__)"
