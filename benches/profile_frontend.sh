#!/usr/bin/env bash
# perf profile of the frontend and the mocker worker under 128 wrk connections (issue 19).
# Needs perf and wrk (Debian packages linux-perf, wrk). Writes /tmp/perf.fe.data, /tmp/perf.wk.data.
set -e
cd "$(dirname "$0")/.."
TMP=$(mktemp -d)
.venv/bin/python -c "from dynamo.llm.tiny_model import write_tiny_model; from pathlib import Path; write_tiny_model(Path('$TMP')/'tiny')"
PORT=18777
export DYN_FILE_KV=$TMP/kv DYN_LOG=warn
.venv/bin/python benches/serve_launcher.py frontend $PORT & FE=$!
.venv/bin/python benches/serve_launcher.py mocker $TMP/tiny '{"speedup_ratio": 1000.0, "block_size": 16}' & WK=$!
for i in $(seq 100); do curl -s localhost:$PORT/v1/models | grep -q tiny && break; sleep 0.1; done
sleep 1
cat > $TMP/chat.lua <<'L'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "tiny", "messages": [{"role": "user", "content": "Tell me about routing."}], "max_tokens": 16, "stream": true}'
L
wrk -t2 -c128 -d3s -s $TMP/chat.lua http://127.0.0.1:$PORT/v1/chat/completions > /dev/null
perf record -F 2000 -g -p $FE -o /tmp/perf.fe.data -- sleep 6 2>/dev/null &
perf record -F 2000 -g -p $WK -o /tmp/perf.wk.data -- sleep 6 2>/dev/null &
wrk -t2 -c128 -d6s -s $TMP/chat.lua http://127.0.0.1:$PORT/v1/chat/completions
wait %3 %4 2>/dev/null || true
sleep 1
kill $FE $WK
