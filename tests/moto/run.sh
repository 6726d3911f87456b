#!/usr/bin/env bash
# Runs a command against a throwaway moto server on 127.0.0.1:
#
#   tests/moto/run.sh cargo nextest run -p sandbox-aws
#
# Starts moto's server through tests/moto/server.py — moto_server with ECS made to behave
# as its API reference documents where moto is lenient (RunTask clientToken idempotency,
# ListTasks pages and default desiredStatus, DescribeTasks MISSING; see that file) —
# (install moto with `.venv/bin/pip install -r tests/moto/requirements.txt`) on a free
# port of 127.0.0.1,
# waits until it answers (at most 20 s), exports MOTO_ENDPOINT, test credentials and region
# us-east-1, runs the command, stops moto on exit and exits with the command's status.
# moto's log goes to $MOTO_LOG (default: a temporary file, printed if moto fails to start,
# kept if the command fails, removed otherwise).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
moto="$root/.venv/bin/moto_server"
python="$root/.venv/bin/python"
server="$root/tests/moto/server.py"

if [[ $# -eq 0 ]]; then
  echo "usage: tests/moto/run.sh COMMAND [ARGS...]" >&2
  exit 2
fi
if [[ ! -x "$moto" || ! -x "$python" ]]; then
  echo "tests/moto/run.sh: $moto is missing; install moto into the project venv first:" >&2
  echo "  python3 -m venv .venv && .venv/bin/pip install -r tests/moto/requirements.txt" >&2
  exit 2
fi

# A free port on 127.0.0.1 (the kernel picks it; released before moto binds it).
port="$("$python" -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"

temp_log=0
if [[ -n "${MOTO_LOG:-}" ]]; then
  log="$MOTO_LOG"
else
  log="$(mktemp -t moto-XXXXXX.log)"
  temp_log=1
fi
"$python" "$server" -H 127.0.0.1 -p "$port" >"$log" 2>&1 &
moto_pid=$!

stop_moto() {
  local rc=$?
  if kill -0 "$moto_pid" 2>/dev/null; then
    kill "$moto_pid" 2>/dev/null || true
    wait "$moto_pid" 2>/dev/null || true
  fi
  if [[ $temp_log == 1 && $rc == 0 ]]; then
    rm -f "$log"
  fi
}
trap stop_moto EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

endpoint="http://127.0.0.1:$port"
deadline=$((SECONDS + 20))
until "$python" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=1).read()' "$endpoint" >/dev/null 2>&1; do
  if ! kill -0 "$moto_pid" 2>/dev/null; then
    echo "tests/moto/run.sh: moto_server exited during start-up; its log ($log):" >&2
    cat "$log" >&2
    exit 1
  fi
  if (( SECONDS >= deadline )); then
    echo "tests/moto/run.sh: moto_server did not answer on $endpoint within 20 s; its log ($log):" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.2
done

export MOTO_ENDPOINT="$endpoint"
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_DEFAULT_REGION=us-east-1
export AWS_REGION=us-east-1
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_ENDPOINT_URL
echo "tests/moto/run.sh: moto on $endpoint (log: $log)" >&2

status=0
"$@" || status=$?
exit "$status"
