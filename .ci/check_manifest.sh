#!/usr/bin/env bash
# The shipped langgraph.json deploys: a fresh virtual environment gets exactly the manifest's dependencies (its
# local "." as this checkout) plus langgraph-cli[inmem], and `langgraph dev` started from it serves the graph, the
# auth and the http app: /inbox answers and the graph is listed. What `langgraph build` installs is the same list.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=$(mktemp -d /tmp/gatedloop-manifest-XXXXXX)
WORK=$(mktemp -d /tmp/gatedloop-manifest-run-XXXXXX)
trap 'kill "${server:-0}" 2>/dev/null || true; rm -rf "$VENV" "$WORK"' EXIT

mapfile -t deps < <(python3 -c 'import json, sys; print("\n".join(json.load(open("langgraph.json"))["dependencies"]))')
specs=()
for dep in "${deps[@]}"; do
    if [[ "$dep" == .* ]]; then specs+=("$ROOT/$dep"); else specs+=("$dep"); fi
done
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "${specs[@]}" 'langgraph-cli[inmem]'

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# `exec`: the subshell becomes the server, so the trap's kill stops it (it outlived CI before).
(cd "$WORK" && GATEDLOOP_MODEL=demo GATEDLOOP_DB="$WORK/studio.sqlite" exec "$VENV/bin/langgraph" dev --no-browser \
    --no-reload --host 127.0.0.1 --port "$port" --config "$ROOT/langgraph.json" >"$WORK/server.log" 2>&1) &
server=$!
for _ in $(seq 1 120); do
    if curl -fsS "http://127.0.0.1:$port/ok" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$server" 2>/dev/null; then echo "check_manifest: langgraph dev exited" >&2; tail -40 "$WORK/server.log" >&2; exit 1; fi
    sleep 1
done
inbox=$(curl -fsS "http://127.0.0.1:$port/inbox") || { echo "check_manifest: /inbox failed" >&2; tail -40 "$WORK/server.log" >&2; exit 1; }
grep -q "gatedloop inbox" <<<"$inbox" || { echo "check_manifest: /inbox is not the inbox" >&2; exit 1; }
curl -fsS -X POST "http://127.0.0.1:$port/assistants/search" -H 'content-type: application/json' -d '{}' \
    | grep -q '"graph_id":"gatedloop"' || { echo "check_manifest: the graph is not served" >&2; exit 1; }
echo "check_manifest: langgraph.json deploys from its own dependencies (/inbox and the graph served)"
