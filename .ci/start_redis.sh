#!/usr/bin/env bash
# Start a throwaway Redis server for the Aegra tests, from Debian's packages, on 127.0.0.1 (a private port).
#
#   line=$(.ci/start_redis.sh [ENV_FILE]) && export "$line"
#
# Prints one line, GATEDLOOP_TEST_REDIS_URL=redis://:PASSWORD@127.0.0.1:PORT/0, and writes the same line to ENV_FILE
# if given (and always to $GATEDLOOP_REDIS_HOME/env). Idempotent: a server already running on the port is reused,
# a stopped one is started again. `redis-server` is installed with apt-get if missing (as root). Anything that goes
# wrong ends the script non-zero with the reason and the server log on stderr.
#
# Settings: GATEDLOOP_REDIS_PORT (default 63799), GATEDLOOP_REDIS_HOME (default /tmp/gatedloop-redis-$PORT).
# The server is for tests: no persistence (no RDB snapshots, no AOF). Stop it with:
#   redis-cli -p $PORT -a "$(cat $GATEDLOOP_REDIS_HOME/password)" shutdown nosave
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin:/usr/bin"

PORT="${GATEDLOOP_REDIS_PORT:-63799}"
HOME_DIR="${GATEDLOOP_REDIS_HOME:-/tmp/gatedloop-redis-$PORT}"
LOG="$HOME_DIR/server.log"
CONF="$HOME_DIR/redis.conf"
PASSWORD_FILE="$HOME_DIR/password"
ENV_OUT="${1:-}"

die() {
    echo "start_redis: $*" >&2
    if [[ -s "$LOG" ]]; then
        echo "--- last lines of $LOG ---" >&2
        tail -n 30 "$LOG" >&2
    fi
    exit 1
}

mkdir -p "$HOME_DIR"
chmod 0700 "$HOME_DIR"

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    [[ $(id -u) -eq 0 ]] || die "Redis is not installed and only root can install it (apt-get install redis-server)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    # policy-rc.d: the package must not start the system's own Redis service on 6379
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null 2>"$HOME_DIR/apt.err" \
        || { cat "$HOME_DIR/apt.err" >&2; die "apt-get install redis-server failed"; }
    command -v redis-server >/dev/null 2>&1 || die "redis-server installed but not on PATH"
fi

if [[ ! -s "$PASSWORD_FILE" ]]; then
    head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PASSWORD_FILE.new"
    chmod 0600 "$PASSWORD_FILE.new"
    mv "$PASSWORD_FILE.new" "$PASSWORD_FILE"
fi
PASSWORD=$(cat "$PASSWORD_FILE")

cli() { REDISCLI_AUTH="$PASSWORD" redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }
ready() { [[ $(cli ping 2>/dev/null) == PONG ]]; }
port_taken() { redis-cli -h 127.0.0.1 -p "$PORT" ping >/dev/null 2>&1; }

if ! ready; then
    if port_taken; then
        die "port $PORT on 127.0.0.1 is taken by a server that is not ours ($HOME_DIR); set GATEDLOOP_REDIS_PORT"
    fi
    cat >"$CONF" <<EOF
bind 127.0.0.1
port $PORT
protected-mode yes
requirepass $PASSWORD
daemonize yes
pidfile $HOME_DIR/redis.pid
logfile $LOG
dir $HOME_DIR
save ""
appendonly no
EOF
    chmod 0600 "$CONF"
    redis-server "$CONF" >/dev/null 2>&1 || die "redis-server did not start"
    for _ in $(seq 1 100); do
        ready && break
        sleep 0.1
    done
    ready || die "the server on 127.0.0.1:$PORT does not answer PING"
fi

LINE="GATEDLOOP_TEST_REDIS_URL=redis://:$PASSWORD@127.0.0.1:$PORT/0"
printf '%s\n' "$LINE" >"$HOME_DIR/env"
chmod 0600 "$HOME_DIR/env"
if [[ -n "$ENV_OUT" ]]; then
    printf '%s\n' "$LINE" >"$ENV_OUT"
fi
printf '%s\n' "$LINE"
