#!/bin/sh
# Executor entrypoint: PID 1 of the ECS Fargate task. Runs
#   codex exec-server --remote "$REMOTE_URL" --environment-id "$ENVIRONMENT_ID"
# for the one environment this task serves, and forwards SIGTERM and SIGINT to it.
#
# REMOTE_URL and ENVIRONMENT_ID come from the controller's RunTask container overrides
# (crates/aws/src/ecs_compute.rs); CODEX_API_KEY from the task definition's `secrets`
# (Secrets Manager), read by codex itself. A missing one exits 64 (EX_USAGE) at once.
#
# Why not `exec`: PID 1 gets no default signal actions, so a process that installs no
# SIGTERM handler would ignore ECS's SIGTERM and be killed only by the SIGKILL that follows
# after the task definition's stopTimeout (30 s). This shell traps the signal, passes it
# on, and exits with codex's own status.
set -u

require() {
  if [ -z "$2" ]; then
    printf 'executor-entrypoint: %s is not set (%s)\n' "$1" "$3" >&2
    exit 64
  fi
}
require REMOTE_URL "${REMOTE_URL:-}" "RunTask container override"
require ENVIRONMENT_ID "${ENVIRONMENT_ID:-}" "RunTask container override"
require CODEX_API_KEY "${CODEX_API_KEY:-}" "task definition secrets"

# Traps first, so a signal that arrives while codex is starting is not lost: it is
# remembered and passed on as soon as the child's pid is known.
child=
pending=
# shellcheck disable=SC2329 # invoked from the traps below
forward() {
  if [ -n "$child" ]; then
    kill -s "$1" "$child" 2>/dev/null || true
  else
    pending=$1
  fi
}
trap 'forward TERM' TERM
trap 'forward INT' INT

codex exec-server --remote "$REMOTE_URL" --environment-id "$ENVIRONMENT_ID" &
child=$!
if [ -n "$pending" ]; then
  kill -s "$pending" "$child" 2>/dev/null || true
fi

# `wait` returns early (status > 128) when a trapped signal arrives: keep waiting until the
# child has exited and been reaped (`kill -0` also succeeds on a zombie), then exit with
# its status.
while :; do
  wait "$child"
  status=$?
  kill -0 "$child" 2>/dev/null || break
done
exit "$status"
