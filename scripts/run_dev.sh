#!/usr/bin/env bash
# Runs the web server and one Celery worker (embedded default) until Ctrl-C, or until either of
# them stops: then the other is stopped too, and the script says which one ended. The agent CLIs
# install in the background meanwhile (scripts/install_agents.sh); the last lines printed are
# the site's address and, the first time, the admin password.
set -uo pipefail
HOST="${1:-127.0.0.1}"
PORT="${2:-8000}"
PY=.venv/bin/python
mkdir -p var/log
# Where this server is: links printed by evalrun and evalreport from another shell point here.
echo "${SITE_URL:-http://$HOST:$PORT}" > var/site-url
$PY -m celery -A evalsite worker --loglevel=INFO --concurrency=2 -B \
  --schedule var/celerybeat-schedule >var/log/worker.log 2>&1 &
WORKER=$!
$PY -m uvicorn evalsite.asgi:application --host "$HOST" --port "$PORT" --log-level warning \
  --timeout-graceful-shutdown 5 &
WEB=$!
nice scripts/install_agents.sh 2>>var/log/agents.log &
AGENTS=$!
trap 'kill -TERM $WORKER $WEB $AGENTS 2>/dev/null; wait $WORKER $WEB 2>/dev/null' EXIT INT TERM
echo "Celery worker started (pid $WORKER, log: var/log/worker.log)"
echo "Agent CLIs installing in the background (log: var/log/agents.log; progress on the Workers page)"
# The address once the server answers, and the password last, where it is seen.
$PY -c "
import socket, sys, time
for _ in range(300):
    try:
        socket.create_connection(('$HOST', $PORT), timeout=0.5).close(); sys.exit(0)
    except OSError:
        time.sleep(0.1)
" || true
echo
echo "evalsite is at http://$HOST:$PORT/  (admin: http://$HOST:$PORT/admin/)"
if [ -f var/admin-password ]; then
  read -r ADMIN_USER ADMIN_PASSWORD < var/admin-password
  echo "log in as $ADMIN_USER with password $ADMIN_PASSWORD  (shown once: change it in the admin)"
  rm -f var/admin-password
fi
wait -n $WORKER $WEB
if ! kill -0 $WORKER 2>/dev/null; then
  echo "the Celery worker stopped (see var/log/worker.log): stopping the web server" >&2
else
  echo "the web server stopped: stopping the worker" >&2
fi
exit 1
