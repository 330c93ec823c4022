#!/usr/bin/env bash
# Runs the web server and one Celery worker (embedded default) until Ctrl-C.
set -euo pipefail
HOST="${1:-127.0.0.1}"
PORT="${2:-8000}"
PY=.venv/bin/python
mkdir -p var/log
$PY -m celery -A evalsite worker --loglevel=INFO --concurrency=2 -B \
  --schedule var/celerybeat-schedule >var/log/worker.log 2>&1 &
WORKER=$!
trap 'kill -TERM $WORKER 2>/dev/null; wait $WORKER 2>/dev/null' EXIT INT TERM
echo "Celery worker started (pid $WORKER, log: var/log/worker.log)"
echo "evalsite is at http://$HOST:$PORT/  (admin: http://$HOST:$PORT/admin/)"
$PY -m uvicorn evalsite.asgi:application --host "$HOST" --port "$PORT" --log-level warning
