#!/bin/sh
# Executor entrypoint: PID 1 of each container of the ECS Fargate executor task. The first
# argument (the task definition's `command`) is the container's role:
#
#   executor URL   codex exec-server --listen URL (ws://127.0.0.1:PORT): the executor the
#                  agent's commands run in. It holds no credential: it refuses to start when
#                  CODEX_API_KEY (or any other credential variable below) is set.
#   forwarder URL  codex exec-server forward --remote "$REMOTE_URL" --environment-id
#                  "$ENVIRONMENT_ID" --connect URL: the only key holder (the options
#                  belong to `forward`: codex 0.171.0 refuses them before it). It
#                  registers with the Agents API (CODEX_API_KEY, from the task definition's
#                  `secrets`) and copies the authenticated remote messages to the executor
#                  over the task's shared loopback (awsvpc).
#                  A warm-pool member (docs/WARM_POOL.md) has no REMOTE_URL but
#                  POOL_TABLE_NAME: it first waits for its assignment with
#                  await-assignment.mjs (its own pool item, read with the task role), then
#                  goes on exactly as above with the assignment's remote URL and
#                  environment id. Without an assignment (recycled, item gone,
#                  POOL_MAX_WAIT_SECS passed) it exits 0 and the task stops.
#   single         the fallback for codex versions without `forward` (ExecutorMode single):
#                  codex exec-server --remote "$REMOTE_URL" --environment-id
#                  "$ENVIRONMENT_ID" in one container that HOLDS THE KEY (agent code can read
#                  it); says so on stderr at start-up.
#   preflight      the checks before provisioning (preflight.mjs, next to this script or in
#                  /opt/codex): the hosts resolve and accept TLS, CODEX_API_KEY (from the
#                  task definition's `secrets`) is set, `codex --version` answers; one JSON
#                  line per check on stdout, exit 0 when all pass, 1 otherwise.
#                  `sandboxctl preflight --backend aws` starts it with a RunTask container
#                  override on CONTAINER_NAME (crates/cli/src/preflight/aws.rs). The key is
#                  never printed; codex runs without it.
#
# With no argument the role is `single` (images started by an older task definition).
# REMOTE_URL and ENVIRONMENT_ID come from the controller's RunTask container overrides
# (crates/aws/src/ecs_compute/, on CONTAINER_NAME = the key holder). A missing or
# forbidden input exits 64 (EX_USAGE) at once.
#
# Why not `exec`: PID 1 gets no default signal actions, so a process that installs no
# SIGTERM handler would ignore ECS's SIGTERM and be killed only by the SIGKILL that follows
# after the task definition's stopTimeout (30 s). This shell traps the signal, passes it
# on, and exits with codex's own status.
set -u

say() {
  printf 'executor-entrypoint: %s\n' "$1" >&2
}

require() {
  if [ -z "$2" ]; then
    say "$1 is not set ($3)"
    exit 64
  fi
}

# The listen / connect URL must be a loopback WebSocket: the executor serves nothing
# outside its task.
require_loopback_ws() {
  case "$1" in
    ws://127.0.0.1:[0-9]*) ;;
    *)
      say "$2 must be ws://127.0.0.1:PORT (got something else)"
      exit 64
      ;;
  esac
}

# A pool member's forwarder: run await-assignment.mjs (next to this script in the
# repository, in /opt/codex with its node_modules in the image) and take REMOTE_URL and
# ENVIRONMENT_ID from its two output lines. The lines are matched, never evaluated, and
# checked again here. The waiter does not get the key (it reads only its pool item). A
# SIGTERM or SIGINT while waiting ends the waiter and this script at once.
await_assignment() {
  waiter=${0%/*}/await-assignment.mjs
  [ -f "$waiter" ] || waiter=/opt/codex/await-assignment.mjs
  assignment=$(mktemp) || exit 70
  waiter_pid=
  # shellcheck disable=SC2329 # invoked from the traps below
  stop_waiting() {
    if [ -n "$waiter_pid" ]; then
      kill -s "$1" "$waiter_pid" 2>/dev/null || true
      wait "$waiter_pid" 2>/dev/null || true
    fi
    rm -f "$assignment"
    say "role forwarder: $1 while waiting for an assignment; stopping"
    exit "$2"
  }
  trap 'stop_waiting TERM 143' TERM
  trap 'stop_waiting INT 130' INT
  env -u CODEX_API_KEY node "$waiter" >"$assignment" &
  waiter_pid=$!
  # `wait` returns early (status > 128) when a trapped signal arrives; the trap exits.
  wait "$waiter_pid"
  waited=$?
  # The traps stay: a signal before codex starts still ends this script (waiter_pid is
  # empty now, so there is nothing to stop). PID 1 has no default SIGTERM action, so a
  # `trap -` here would make such a signal vanish.
  waiter_pid=
  REMOTE_URL=
  ENVIRONMENT_ID=
  while IFS= read -r line; do
    case "$line" in
      REMOTE_URL=*) REMOTE_URL=${line#REMOTE_URL=} ;;
      ENVIRONMENT_ID=*) ENVIRONMENT_ID=${line#ENVIRONMENT_ID=} ;;
    esac
  done <"$assignment"
  rm -f "$assignment"
  if [ "$waited" -ne 0 ]; then
    say "role forwarder: waiting for an assignment failed (status $waited)"
    exit "$waited"
  fi
  if [ -z "$REMOTE_URL" ] && [ -z "$ENVIRONMENT_ID" ]; then
    say "role forwarder: no assignment (recycled, gone or waited too long); this pool member stops"
    exit 0
  fi
  case "$ENVIRONMENT_ID" in
    '' | *[!A-Za-z0-9_-]*)
      say "role forwarder: the assignment's environment id is not [A-Za-z0-9_-]"
      exit 65
      ;;
  esac
}

# The remote URL must be https: the forwarder sends the key as its registration bearer,
# and a loopback http URL would carry it in cleartext over the loopback the task's
# containers share with the agent's code (awsvpc). The one exception is for tests that
# run this script against a recording http server on 127.0.0.1:
# SANDBOX_TEST_ONLY_LOOPBACK_HTTP=1, which neither template sets (infra/tests checks it)
# and which the agent cannot set (it is the forwarder container's own environment).
require_https_remote() {
  case "$REMOTE_URL" in
    https://*) return 0 ;;
  esac
  if [ "${SANDBOX_TEST_ONLY_LOOPBACK_HTTP:-}" = 1 ]; then
    case "$REMOTE_URL" in
      http://127.0.0.1:* | http://127.0.0.1/*) return 0 ;;
    esac
  fi
  say "role $role: the remote URL is not https"
  exit 65
}

role=${1:-single}
url=${2:-}
case "$role" in
  executor)
    require_loopback_ws "$url" "the executor's listen URL"
    for var in CODEX_API_KEY OPENAI_API_KEY CODEX_ACCESS_TOKEN REMOTE_URL ENVIRONMENT_ID; do
      eval "value=\${$var:-}"
      if [ -n "$value" ]; then
        say "role executor: $var is set; the executor container must hold no credential"
        exit 64
      fi
    done
    say "role executor: listening on $url, no credential in this container"
    set -- codex exec-server --listen "$url"
    ;;
  forwarder)
    require_loopback_ws "$url" "the forwarder's connect URL"
    if [ -z "${REMOTE_URL:-}" ] && [ -n "${POOL_TABLE_NAME:-}" ]; then
      require CODEX_API_KEY "${CODEX_API_KEY:-}" "task definition secrets"
      await_assignment
    fi
    require REMOTE_URL "${REMOTE_URL:-}" "RunTask container override"
    require ENVIRONMENT_ID "${ENVIRONMENT_ID:-}" "RunTask container override"
    require CODEX_API_KEY "${CODEX_API_KEY:-}" "task definition secrets"
    require_https_remote
    say "role forwarder: registering environment $ENVIRONMENT_ID, forwarding to $url"
    # The key reaches codex over a pipe (--registration-bearer-stdin), never in its
    # environment or on its command line (/proc/<pid>/environ, cmdline).
    bearer=$CODEX_API_KEY
    unset CODEX_API_KEY
    set -- codex exec-server forward --registration-bearer-stdin --remote "$REMOTE_URL" \
      --environment-id "$ENVIRONMENT_ID" --connect "$url"
    ;;
  single)
    require REMOTE_URL "${REMOTE_URL:-}" "RunTask container override"
    require ENVIRONMENT_ID "${ENVIRONMENT_ID:-}" "RunTask container override"
    require CODEX_API_KEY "${CODEX_API_KEY:-}" "task definition secrets"
    require_https_remote
    say "role single: WARNING this container holds CODEX_API_KEY and agent code can read it (single-container fallback; use ExecutorMode split)"
    set -- codex exec-server --remote "$REMOTE_URL" --environment-id "$ENVIRONMENT_ID"
    ;;
  preflight)
    checker=${0%/*}/preflight.mjs
    [ -f "$checker" ] || checker=/opt/codex/preflight.mjs
    say "role preflight: checking the hosts, the executor key and the codex version"
    set -- node "$checker"
    ;;
  *)
    say "unknown role (expected executor, forwarder, single or preflight)"
    exit 64
    ;;
esac

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

if [ -n "${bearer:-}" ]; then
  printf '%s\n' "$bearer" | "$@" &
else
  "$@" &
fi
child=$!
bearer=
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
